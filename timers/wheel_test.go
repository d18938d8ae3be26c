package timers

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func newWheel(t testing.TB, capacity, slots int, now Tick) (*Wheel, []byte) {
	t.Helper()
	buf := make([]uint64, (Size(capacity, slots)+7)/8)
	mem := unsafeBytes(buf)
	w, err := Format(mem, capacity, slots, now)
	if err != nil {
		t.Fatal(err)
	}
	return w, mem
}

// fired is what one Expire call returned.
func expireAll(t testing.TB, w *Wheel, now Tick) []ID {
	t.Helper()
	var all []ID
	out := make([]ID, 7) // small, so that resuming is exercised
	for {
		n, err := w.Expire(now, out)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, out[:n]...)
		if n < len(out) {
			return all
		}
	}
}

func TestFiresInOrderNeverEarly(t *testing.T) {
	w, _ := newWheel(t, 100, 64, 1000)
	deadlines := map[ID]Tick{}
	for i := range ID(100) {
		at := Tick(1000 + (int(i)*37)%300) // spread over about five laps
		if err := w.Set(i, at); err != nil {
			t.Fatal(err)
		}
		deadlines[i] = at
	}
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
	var last Tick
	fired := map[ID]bool{}
	for now := Tick(1000); now < 1400; now += 13 {
		for _, id := range expireAll(t, w, now) {
			at := deadlines[id]
			if at > now {
				t.Fatalf("timer %d due at %d fired at %d", id, at, now)
			}
			if at < last {
				t.Fatalf("timer %d due at %d fired after one due at %d", id, at, last)
			}
			if fired[id] {
				t.Fatalf("timer %d fired twice", id)
			}
			fired[id], last = true, at
		}
		if err := w.Check(); err != nil {
			t.Fatal(err)
		}
	}
	if len(fired) != 100 || w.ArmedCount() != 0 {
		t.Fatalf("%d of 100 fired, %d still armed", len(fired), w.ArmedCount())
	}
}

func TestCancelAndRearm(t *testing.T) {
	w, _ := newWheel(t, 10, 64, 0)
	w.Set(1, 10)
	w.Set(2, 20)
	w.Set(3, 30)
	w.Cancel(2)
	w.Cancel(2) // twice: nothing
	w.Cancel(9) // never armed: nothing
	w.Set(3, 5) // re-armed earlier
	if at, ok := w.Deadline(3); !ok || at != 5 {
		t.Errorf("Deadline(3) = %d, %v; want 5", at, ok)
	}
	if _, ok := w.Deadline(2); ok {
		t.Error("cancelled timer reports a deadline")
	}
	if got := expireAll(t, w, 100); len(got) != 2 || got[0] != 3 || got[1] != 1 {
		t.Errorf("fired %v, want [3 1]", got)
	}
	if err := w.Set(10, 1); err == nil {
		t.Error("Set of an ID beyond the capacity accepted")
	}
}

func TestPastDeadlineFiresNext(t *testing.T) {
	w, _ := newWheel(t, 4, 64, 500)
	expireAll(t, w, 600)
	w.Set(0, 10) // long past
	if at, _ := w.Deadline(0); at != 601 {
		t.Errorf("past deadline clamped to %d, want 601 (the clock)", at)
	}
	if got := expireAll(t, w, 601); len(got) != 1 {
		t.Errorf("past-due timer: fired %v", got)
	}
}

// TestWrapAround runs timers across many laps of a small wheel and across a
// jump of a billion ticks (a process that slept).
func TestWrapAround(t *testing.T) {
	w, _ := newWheel(t, 8, 64, 0)
	w.Set(0, 63)
	w.Set(1, 64)            // same slot as 0 next lap
	w.Set(2, 64*5+3)        // five laps on
	w.Set(3, 1_000_000_000) // far away
	w.Set(4, 1_000_000_064) // same slot, one lap later
	for _, c := range []struct {
		now  Tick
		want []ID
	}{
		{62, nil}, {63, []ID{0}}, {64, []ID{1}}, {64*5 + 2, nil}, {64*5 + 3, []ID{2}},
		{999_999_999, nil}, {1_000_000_000, []ID{3}}, {2_000_000_000, []ID{4}},
	} {
		got := expireAll(t, w, c.now)
		if len(got) != len(c.want) {
			t.Fatalf("at %d: fired %v, want %v", c.now, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("at %d: fired %v, want %v", c.now, got, c.want)
			}
		}
		if err := w.Check(); err != nil {
			t.Fatal(err)
		}
	}
	// Ticks near the top of the range.
	w2, _ := newWheel(t, 2, 64, ^Tick(0)-100)
	w2.Set(0, ^Tick(0)-50)
	if got := expireAll(t, w2, ^Tick(0)-1); len(got) != 1 {
		t.Errorf("near the end of time: fired %v", got)
	}
}

// TestAgainstModel drives the wheel with random operations and compares
// it after each with a plain map.
func TestAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	const capacity = 200
	w, _ := newWheel(t, capacity, 64, 0)
	model := map[ID]Tick{}
	now := Tick(0)
	out := make([]ID, 5)
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 5:
			id := ID(rng.IntN(capacity))
			at := now + Tick(rng.IntN(400)) // up to about six laps
			w.Set(id, at)
			model[id] = max(at, w.Now())
		case op < 7:
			id := ID(rng.IntN(capacity))
			w.Cancel(id)
			delete(model, id)
		default:
			now += Tick(rng.IntN(40))
			if rng.IntN(50) == 0 {
				now += Tick(rng.IntN(100000)) // a long sleep
			}
			n, err := w.Expire(now, out)
			if err != nil {
				t.Fatal(err)
			}
			prev := Tick(0)
			for _, id := range out[:n] {
				at, ok := model[id]
				if !ok || at > now || at < prev {
					t.Fatalf("step %d: fired %d (model %d, %v) at %d after %d", step, id, at, ok, now, prev)
				}
				prev = at
				delete(model, id)
			}
			if n == len(out) {
				now = w.Now() - 1 // let it finish this tick next time
				if now < prev {
					now = prev
				}
			}
		}
		if w.ArmedCount() != len(model) {
			t.Fatalf("step %d: %d armed, model %d", step, w.ArmedCount(), len(model))
		}
		want, ok := Tick(0), false
		for _, at := range model {
			if !ok || at < want {
				want, ok = at, true
			}
		}
		got, gok, err := w.NextDeadline()
		if err != nil || gok != ok || got != want {
			t.Fatalf("step %d: NextDeadline = %d, %v, %v; model %d, %v", step, got, gok, err, want, ok)
		}
		if step%1000 == 0 {
			if err := w.Check(); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		}
	}
}

// TestMillionTimers arms a million timers over ten laps and collects every
// one, in order.
func TestMillionTimers(t *testing.T) {
	const n = 1 << 20
	w, _ := newWheel(t, n, 1<<16, 0)
	rng := rand.New(rand.NewPCG(2, 2))
	deadlines := make([]Tick, n)
	for i := range ID(n) {
		deadlines[i] = Tick(1 + rng.IntN(10<<16))
		w.Set(i, deadlines[i])
	}
	if err := w.Check(); err != nil {
		t.Fatal(err)
	}
	out := make([]ID, 4096)
	total := 0
	var last, prev Tick
	const end = 10 << 16
	for now := Tick(0); ; now = min(now+1000, end) {
		for {
			k, err := w.Expire(now, out)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range out[:k] {
				if at := deadlines[id]; at > now || at < prev {
					t.Fatalf("timer %d due at %d fired at %d after one due at %d", id, at, now, prev)
				}
				prev = deadlines[id]
			}
			total += k
			if k < len(out) {
				break
			}
		}
		if w.Now() < last {
			t.Fatal("clock went backwards")
		}
		last = w.Now()
		if now == end {
			break
		}
	}
	if total != n || w.ArmedCount() != 0 {
		t.Fatalf("collected %d of %d, %d still armed", total, n, w.ArmedCount())
	}
}

// TestSharedView checks that a second view of the memory, as another
// process would attach, sees and drives the same timers.
func TestSharedView(t *testing.T) {
	w, mem := newWheel(t, 16, 64, 0)
	w.Set(3, 30)
	v, err := Attach(mem)
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := v.Deadline(3); !ok || at != 30 {
		t.Fatalf("second view: Deadline(3) = %d, %v", at, ok)
	}
	v.Set(4, 10)
	if got := expireAll(t, w, 40); len(got) != 2 || got[0] != 4 || got[1] != 3 {
		t.Errorf("first view fired %v, want [4 3]", got)
	}
	if _, err := Attach(make([]byte, 64)); err == nil {
		t.Error("Attach accepted unformatted memory")
	}
}

// TestCorruptMemory scribbles over the wheel and checks that nothing
// panics or hangs: operations work or say ErrCorrupt.
func TestCorruptMemory(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	for round := range 300 {
		w, mem := newWheel(t, 32, 64, 0)
		for i := range ID(32) {
			w.Set(i, Tick(rng.IntN(300)))
		}
		for i := headerSize; i < len(mem); i++ {
			if rng.IntN(8) == 0 {
				mem[i] = byte(rng.Uint32())
			}
		}
		// Occasionally the header's mutable fields too.
		if round%3 == 0 {
			for i := 16; i < headerSize; i++ {
				mem[i] = byte(rng.Uint32())
			}
		}
		v, err := Attach(mem)
		if err != nil {
			continue
		}
		out := make([]ID, 8)
		for range 50 {
			v.Set(ID(rng.IntN(40)), Tick(rng.IntN(1000)))
			v.Cancel(ID(rng.IntN(40)))
			if _, err := v.Expire(Tick(rng.IntN(2000)), out); err != nil && !errors.Is(err, ErrCorrupt) {
				t.Fatal(err)
			}
			v.NextDeadline()
		}
		_ = v.Check()
	}
}

func TestFormatErrors(t *testing.T) {
	mem := unsafeBytes(make([]uint64, 1024))
	for name, f := range map[string]func() error{
		"capacity 0":     func() error { _, err := Format(mem, 0, 64, 0); return err },
		"slots 100":      func() error { _, err := Format(mem, 1, 100, 0); return err },
		"slots 32":       func() error { _, err := Format(mem, 1, 32, 0); return err },
		"too small":      func() error { _, err := Format(mem[:64], 10, 64, 0); return err },
		"unaligned":      func() error { _, err := Format(mem[1:], 1, 64, 0); return err },
		"too many slots": func() error { _, err := Format(mem, 1, 1<<25, 0); return err },
	} {
		if f() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestZeroAllocs checks that arming, cancelling and expiring allocate
// nothing.
func TestZeroAllocs(t *testing.T) {
	w, _ := newWheel(t, 64, 64, 0)
	out := make([]ID, 64)
	now := Tick(0)
	if a := testing.AllocsPerRun(1000, func() {
		for i := range ID(64) {
			w.Set(i, now+Tick(i%70))
		}
		w.Cancel(5)
		now += 50
		w.Expire(now, out)
		w.NextDeadline()
	}); a != 0 {
		t.Errorf("%v allocations per round", a)
	}
}

func BenchmarkSetCancel(b *testing.B) {
	w, _ := newWheel(b, 1024, 4096, 0)
	for i := 0; b.Loop(); i++ {
		id := ID(i & 1023)
		w.Set(id, Tick(i&4095)+200)
		w.Cancel(id)
	}
}

func BenchmarkSetExpire(b *testing.B) {
	w, _ := newWheel(b, 1024, 4096, 0)
	out := make([]ID, 64)
	now := Tick(0)
	for i := 0; b.Loop(); i++ {
		w.Set(ID(i&1023), now+200)
		now++
		w.Expire(now, out)
	}
}
