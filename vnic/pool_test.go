package vnic

import (
	"errors"
	"math/rand/v2"
	"testing"
)

func newTestPool(t testing.TB, count int) (*Pool, []byte, []byte) {
	t.Helper()
	meta := unsafeBytes(make([]uint64, (PoolMetaSize(count)+7)/8))
	frames := make([]byte, count*2048)
	p, err := NewPool(meta, frames, 2048, 256)
	if err != nil {
		t.Fatal(err)
	}
	return p, meta, frames
}

func TestPoolGenerations(t *testing.T) {
	p, _, _ := newTestPool(t, 1)
	seen := map[Handle]bool{}
	// Cycle one frame through more generations than fit in 12 bits.
	for range 5000 {
		h := p.Alloc()
		if h == Null || h.Gen() == 0 {
			t.Fatalf("Alloc gave %v", h)
		}
		if !seen[h] && len(seen) < genMask {
			seen[h] = true
		}
		if err := p.Free(h); err != nil {
			t.Fatal(err)
		}
		if p.Check(h) == nil {
			t.Fatalf("freed handle %v still valid", h)
		}
	}
	if len(seen) != genMask {
		t.Errorf("saw %d distinct generations, want %d (all but 0)", len(seen), genMask)
	}
}

// TestAttachPoolSharesState checks that a second view of the same memory
// (as another process would map it) sees the first one's frames.
func TestAttachPoolSharesState(t *testing.T) {
	p, meta, frames := newTestPool(t, 8)
	h := p.Alloc()
	copy(p.Buf(h), "shared bytes")
	p.SetLen(h, 12)
	q, err := AttachPool(meta, frames)
	if err != nil {
		t.Fatal(err)
	}
	if string(q.Data(h)) != "shared bytes" {
		t.Errorf("second view reads %q", q.Data(h))
	}
	if q.Available() != 7 {
		t.Errorf("second view has %d free, want 7", q.Available())
	}
	if err := q.Free(h); err != nil {
		t.Fatal(err)
	}
	if p.Data(h) != nil {
		t.Error("frame freed through one view still valid through the other")
	}
	if _, err := AttachPool(make([]byte, 4096), frames); err == nil {
		t.Error("AttachPool accepted unformatted memory")
	}
}

// TestPoolHostileMetadata scribbles over the shared metadata, as a buggy
// or hostile process could, and checks that no operation panics or hands
// out memory outside the frame area.
func TestPoolHostileMetadata(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		p, meta, frames := newTestPool(t, 16)
		var held []Handle
		for range 4 {
			held = append(held, p.Alloc())
		}
		// Corrupt everything after the immutable header fields.
		for i := 20; i < len(meta); i++ {
			if rng.IntN(4) == 0 {
				meta[i] = byte(rng.Uint32())
			}
		}
		q, err := AttachPool(meta, frames)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for _, pool := range []*Pool{p, q} {
			for range 64 {
				h := pool.Alloc()
				if b := pool.Buf(h); b != nil && len(b) > pool.FrameSize() {
					t.Fatalf("buffer of %d bytes", len(b))
				}
				pool.SetLen(h, rng.IntN(3000))
				pool.Data(h)
				pool.fromKernel(rng.Uint64N(1<<20), rng.Uint32N(4096))
				pool.kernelDone(rng.Uint64N(1 << 20))
				pool.Free(Handle(rng.Uint32()))
			}
			for _, h := range held {
				pool.Data(h)
				pool.Free(h)
			}
			_ = pool.Stats()
		}
	}
}

func TestPoolConfigErrors(t *testing.T) {
	meta := unsafeBytes(make([]uint64, 1024))
	for name, f := range map[string]func() error{
		"frame size 64":  func() error { _, err := NewPool(meta, make([]byte, 4096), 64, 0); return err },
		"no frames":      func() error { _, err := NewPool(meta, make([]byte, 100), 2048, 0); return err },
		"headroom":       func() error { _, err := NewPool(meta, make([]byte, 4096), 2048, 2048); return err },
		"meta too small": func() error { _, err := NewPool(meta[:100], make([]byte, 4096), 2048, 0); return err },
		"unaligned meta": func() error { _, err := NewPool(meta[1:], make([]byte, 4096), 2048, 0); return err },
	} {
		if err := f(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestZeroAllocs checks that the per-frame paths allocate nothing.
func TestZeroAllocs(t *testing.T) {
	p, _, _ := newTestPool(t, 64)
	if n := testing.AllocsPerRun(1000, func() {
		h := p.Alloc()
		p.SetLen(h, 100)
		_ = p.Data(h)
		p.Free(h)
		if err := p.Free(h); !errors.Is(err, ErrStale) {
			panic("double free accepted")
		}
	}); n != 0 {
		t.Errorf("pool: %v allocations per frame", n)
	}
	a, b, err := NewMemPair(MemConfig{FrameCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	tx := make([]Handle, 8)
	rx := make([]Handle, 8)
	if n := testing.AllocsPerRun(1000, func() {
		k := a.Pool().AllocBatch(tx)
		for _, h := range tx[:k] {
			a.Pool().SetLen(h, 60)
		}
		a.Transmit(tx[:k])
		for _, h := range rx[:b.Receive(rx)] {
			b.Pool().Free(h)
		}
	}); n != 0 {
		t.Errorf("mem nic: %v allocations per batch", n)
	}
}

// TestBusyFrames walks a kept frame through its states as a NIC would.
func TestBusyFrames(t *testing.T) {
	p, _, _ := newTestPool(t, 4)
	h := p.Alloc()
	p.SetLen(h, 100)
	p.SetAux(h, 0, 7)
	addr, n, ok := p.lendKernel(h)
	if !ok || n != 100 || addr != uint64(h.Index())*2048+256 {
		t.Fatalf("lendKernel = %d, %d, %v", addr, n, ok)
	}
	if !p.Busy(h) || p.Data(h) == nil || p.Aux(h, 0) != 7 {
		t.Fatal("a lent frame must stay readable, busy, with its aux words")
	}
	if err := p.SetData(h, 256, 10); !errors.Is(err, ErrBusy) {
		t.Errorf("SetData on a busy frame: %v, want ErrBusy", err)
	}
	if _, _, ok := p.lendKernel(h); ok {
		t.Error("a busy frame was lent twice")
	}
	if _, _, ok := p.giveKernel(h); ok {
		t.Error("a busy frame was given away")
	}
	if !p.kernelDone(addr) || p.Busy(h) {
		t.Fatal("completion did not end the busy state")
	}
	// Freed while busy: the handle dies at once, the frame returns at
	// completion.
	p.lendKernel(h)
	free := p.Available()
	if err := p.Free(h); err != nil {
		t.Fatal(err)
	}
	if p.Check(h) == nil || p.Available() != free {
		t.Fatal("a busy frame freed: handle must die, frame must wait for completion")
	}
	if !p.kernelDone(addr) || p.Available() != free+1 {
		t.Fatal("completion did not return the freed frame")
	}
	if p.kernelDone(addr) {
		t.Error("a second completion for the same frame was accepted")
	}
	// Aux words are cleared for the next owner.
	h2 := p.Alloc()
	for i := range AuxWords {
		if p.Aux(h2, i) != 0 {
			t.Errorf("aux word %d not cleared on Alloc", i)
		}
	}
	if err := p.SetAux(h2, AuxWords, 1); err == nil {
		t.Error("SetAux past the last word accepted")
	}
}
