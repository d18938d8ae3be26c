package impair

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"
)

// run sends n numbered 100-byte frames, one every gap, and collects what
// comes out, in delivery order, with delivery times.
func run(t *testing.T, imp Impairment, n int, gap time.Duration) (seqs []uint32, ats []time.Duration, l *Line) {
	t.Helper()
	if err := imp.Check("test"); err != nil {
		t.Fatal(err)
	}
	l = NewLine(imp, 4096, 128, 1, 2)
	frame := make([]byte, 100)
	var now time.Duration
	drain := func() {
		for {
			b := l.Receive(now)
			if b == nil {
				return
			}
			seqs = append(seqs, binary.BigEndian.Uint32(b))
			ats = append(ats, now)
		}
	}
	for i := range n {
		binary.BigEndian.PutUint32(frame, uint32(i))
		l.Send(frame, now)
		drain()
		now += gap
	}
	for range 1_000_000 {
		if l.Len() == 0 {
			break
		}
		now = l.NextAt()
		drain()
	}
	return seqs, ats, l
}

// TestBurstEndsWhenQuiet checks that a pause on the line ends a burst.
func TestBurstEndsWhenQuiet(t *testing.T) {
	imp := Impairment{BurstLoss: 1, BurstLen: 10}
	if err := imp.Check("test"); err != nil {
		t.Fatal(err)
	}
	l := NewLine(imp, 16, 64, 1, 2)
	l.Send(make([]byte, 10), 0) // starts a burst
	l.SetImpairment(Impairment{BurstLen: 10, BurstGap: time.Millisecond})
	l.Send(make([]byte, 10), 500*time.Microsecond) // within it: lost
	l.Send(make([]byte, 10), 2*time.Millisecond)   // after a quiet 1.5ms: through
	if c := l.Counters(); c.BurstLost != 2 || l.Len() != 1 {
		t.Errorf("burst lost %d frames and %d got through; want 2 and 1", c.BurstLost, l.Len())
	}
}

func TestBurstLoss(t *testing.T) {
	seqs, _, l := run(t, Impairment{BurstLoss: 0.001, BurstLen: 10}, 100_000, time.Microsecond)
	c := l.Counters()
	if c.BurstLost%10 != 0 || c.BurstLost < 500 || c.BurstLost > 1500 {
		t.Errorf("lost %d frames in bursts of 10, want about 1000 in tens", c.BurstLost)
	}
	// Every gap in the sequence is exactly 10 frames long (bursts that
	// touch make multiples of 10).
	prev := int64(-1)
	for _, s := range seqs {
		if gap := int64(s) - prev - 1; gap%10 != 0 {
			t.Fatalf("a gap of %d frames before %d", gap, s)
		}
		prev = int64(s)
	}
	if uint64(len(seqs))+c.BurstLost != 100_000 {
		t.Errorf("delivered %d and lost %d of 100000", len(seqs), c.BurstLost)
	}
}

// TestRate checks that a rate-limited line delivers at its rate, and drops
// what overflows its queue.
func TestRate(t *testing.T) {
	// 100-byte frames every 4 µs offered to an 100 Mbit/s line (8 µs a
	// frame): half must be dropped, and the rest come 8 µs apart.
	seqs, ats, l := run(t, Impairment{Rate: 100_000_000, QueueBytes: 10_000}, 10_000, 4*time.Microsecond)
	c := l.Counters()
	if c.Overflow < 4500 || c.Overflow > 5500 {
		t.Errorf("%d of 10000 frames overflowed, want about 5000", c.Overflow)
	}
	for i := 1; i < len(ats); i++ {
		if d := ats[i] - ats[i-1]; d < 8*time.Microsecond {
			t.Fatalf("frames %d and %d %v apart, faster than the rate", seqs[i-1], seqs[i], d)
		}
	}
	span := ats[len(ats)-1] - ats[0]
	if want := time.Duration(len(ats)-1) * 8 * time.Microsecond; span > want+want/100 {
		t.Errorf("%d frames took %v, want %v at the line rate", len(ats), span, want)
	}
}

func TestJitterKeepsOrder(t *testing.T) {
	seqs, ats, _ := run(t, Impairment{Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond}, 5000, 10*time.Microsecond)
	if len(seqs) != 5000 {
		t.Fatalf("delivered %d of 5000", len(seqs))
	}
	for i, s := range seqs {
		if s != uint32(i) {
			t.Fatalf("frame %d delivered in place %d", s, i)
		}
		if sent := time.Duration(s) * 10 * time.Microsecond; ats[i]-sent < 20*time.Millisecond || ats[i]-sent > 26*time.Millisecond {
			t.Fatalf("frame %d took %v, want 20 to 25 ms", s, ats[i]-sent)
		}
	}
}

func TestCorruptSkip(t *testing.T) {
	imp := Impairment{Corrupt: 1, CorruptSkip: 14}
	if err := imp.Check("test"); err != nil {
		t.Fatal(err)
	}
	l := NewLine(imp, 16, 64, 3, 4)
	for i := range 1000 {
		frame := make([]byte, 60)
		l.Send(frame, 0)
		b := l.Receive(0)
		flipped := 0
		for j, v := range b {
			if v != 0 {
				if j < 14 {
					t.Fatalf("frame %d: byte %d corrupted, inside the skipped header", i, j)
				}
				flipped++
			}
		}
		if flipped != 1 {
			t.Fatalf("frame %d: %d bytes changed, want 1", i, flipped)
		}
	}
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		imp  Impairment
		want string
	}{
		{Impairment{BurstLoss: 2}, "burst loss probability 2"},
		{Impairment{Rate: -1}, "must not be negative"},
		{Impairment{Jitter: -1}, "delays must not be negative"},
	} {
		if err := c.imp.Check("a->b"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%+v) = %v, want %q", c.imp, err, c.want)
		}
	}
	imp := Impairment{BurstLoss: 0.1, Rate: 1e6, Reorder: 0.1}
	if err := imp.Check("x"); err != nil || imp.BurstLen != 10 || imp.QueueBytes != 64<<10 || imp.ReorderDelay != time.Millisecond {
		t.Errorf("defaults not filled: %+v, %v", imp, err)
	}
}
