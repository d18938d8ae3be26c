package stack

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestToTicksExact(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for _, tick := range []int64{10_000, 1_000_000, 1_000_003, 100_000_000} {
		s := &Stack{tickNs: tick, tickRecip: recip(uint64(tick))}
		for i := 0; i < 200000; i++ {
			x := int64(r.Uint64() >> 1)
			if i%2 == 0 {
				x = int64(r.Uint64N(1 << 44))
			}
			if got, want := uint64(s.toTicks(x)), uint64(x/tick); got != want {
				t.Fatalf("tick %d: toTicks(%d) = %d, want %d", tick, x, got, want)
			}
		}
		if got := uint64(s.ticks(time.Duration(tick) + 1)); got != 2 {
			t.Errorf("ticks(one tick + 1ns) = %d, want 2 (never early)", got)
		}
	}
}

func TestFastClock(t *testing.T) {
	c := newClock()
	prev := c.now()
	for range 1000 {
		n := c.now()
		if n < prev {
			t.Fatal("fast clock went backwards")
		}
		prev = n
	}
	// Bracketed by CLOCK_MONOTONIC: a thread descheduled between two
	// reads (a busy machine, the race detector) widens the bracket, not
	// the error.
	const slack = int64(100 * time.Microsecond)
	before := nanotime()
	n := c.now()
	after := nanotime()
	if n < before-slack || n > after+slack {
		t.Errorf("fast clock read %v before CLOCK_MONOTONIC's %v and %v after its %v: more than %v outside",
			time.Duration(before-n), time.Duration(before), time.Duration(n-after), time.Duration(after), time.Duration(slack))
	}
}
