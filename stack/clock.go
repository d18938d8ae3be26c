package stack

import (
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/xdp-onload/onload/internal/monotime"
	"github.com/xdp-onload/onload/timers"
)

// nanotime is CLOCK_MONOTONIC in nanoseconds, the same clock in every
// process (monotime.Now).
func nanotime() int64 { return monotime.Now() }

// fastClock is CLOCK_MONOTONIC read through the TSC where it runs at a
// constant rate: rdtsc costs a third of the vDSO's clock_gettime here, and
// a busy-poller reads the clock on every poll. Calibrated once against
// nanotime; every 100 ms of TSC it is anchored to nanotime again, so that
// it cannot drift from what other processes read: CLOCK_MONOTONIC is
// slewed by NTP (up to 500 ppm) and the TSC is not, and a calibration of
// 2 ms is off by some parts per million. At one anchoring a second,
// CI saw the clock 106 µs behind CLOCK_MONOTONIC.
type fastClock struct {
	ok     bool
	mult   uint64 // ns per TSC tick, 32.32 fixed point
	period uint64 // TSC ticks between re-anchorings
	anchor atomic.Pointer[tscAnchor]
	last   int64 // what now last returned: it never goes back
}

// tscAnchor pairs a TSC reading with the nanotime read with it. Anchors
// are never changed, only replaced, so a reader without the lock sees a
// consistent one.
type tscAnchor struct {
	tsc uint64
	ns  int64
}

var clk fastClock

func init() {
	if !tscUsable() {
		return
	}
	c0, n0 := tscPair()
	for nanotime()-n0 < int64(2*time.Millisecond) {
	}
	c1, n1 := tscPair()
	if c1 <= c0 || n1 <= n0 {
		return
	}
	clk.ok = true
	clk.mult = uint64(n1-n0) << 32 / (c1 - c0)
	clk.period = (c1 - c0) * 50 // about 100 ms
	clk.anchor.Store(&tscAnchor{c1, n1})
}

// tscPair reads the TSC and nanotime at one moment: the TSC halfway
// between two reads that bracket nanotime's, from the tightest of a few
// tries. A thread descheduled between the reads widens its bracket and
// is not chosen; read once, such a pause between the TSC and nanotime
// went into the calibration (a few µs in its 2 ms skewed the rate enough
// to put the clock 100 µs off CLOCK_MONOTONIC a second later, on a busy
// machine) or into an anchor.
func tscPair() (uint64, int64) {
	var tsc uint64
	var ns int64
	best := ^uint64(0)
	for range 5 {
		t0 := rdtsc()
		n := nanotime()
		t1 := rdtsc()
		if t1 >= t0 && t1-t0 < best {
			best, tsc, ns = t1-t0, t0+(t1-t0)/2, n
		}
	}
	return tsc, ns
}

// newClock is a clock for one Stack, sharing the process's calibration.
func newClock() *fastClock {
	c := &fastClock{ok: clk.ok, mult: clk.mult, period: clk.period}
	if a := clk.anchor.Load(); a != nil {
		c.anchor.Store(a)
	}
	return c
}

// now is CLOCK_MONOTONIC in nanoseconds, by the TSC if it can be. The stack
// calls it with its lock held.
func (c *fastClock) now() int64 {
	if !c.ok {
		return nanotime()
	}
	t := rdtsc()
	a := c.anchor.Load()
	if t-a.tsc > c.period {
		at, an := tscPair()
		a = &tscAnchor{at, an}
		c.anchor.Store(a)
		t = max(t, at)
	}
	hi, lo := bits.Mul64(t-a.tsc, c.mult)
	ns := a.ns + int64(hi<<32|lo>>32)
	if ns < c.last {
		ns = c.last
	}
	c.last = ns
	return ns
}

// nowRacy reads the clock without the lock, for a hint: it changes
// nothing.
func (c *fastClock) nowRacy() int64 {
	if !c.ok {
		return nanotime()
	}
	a := c.anchor.Load()
	hi, lo := bits.Mul64(rdtsc()-a.tsc, c.mult)
	return a.ns + int64(hi<<32|lo>>32)
}

// Mono is a point on CLOCK_MONOTONIC, in nanoseconds.
type Mono int64

// Now reads the clock.
func Now() Mono { return Mono(nanotime()) }

// delAckTicks is the delayed-ACK time (Config.DelayedAck), in ticks: the
// delayed-ACK timer's wait, and the time within which data we send
// answers the peer's (answersLocked).
func (s *Stack) delAckTicks() timers.Tick { return s.ticks(durationNs(s.img.hdr.delAck)) }

// ticks converts a duration to timer-wheel ticks, rounding up so that a
// timer never fires early.
func (s *Stack) ticks(d time.Duration) timers.Tick {
	return s.toTicks(int64(d) + s.tickNs - 1)
}

// The stack reads the clock at most once each time it takes the lock (a
// handful of clock reads per packet would cost more than the rest of the
// packet), and only if something needs the time; everything done under the
// lock uses that reading.

// clock is the time, read on first use since the lock was taken.
func (s *Stack) clock() int64 {
	if s.nowNs == 0 {
		s.readClock()
	}
	return s.nowNs
}

// readClock is clock's slow path, kept out of line so that clock and
// nowTick inline.
//
//go:noinline
func (s *Stack) readClock() { s.setClock(s.fast.now()) }

// setClock records the clock reading for this hold of the lock, and its
// tick: a packet asks for the tick several times.
func (s *Stack) setClock(ns int64) {
	s.nowNs, s.nowTk = ns, s.toTicks(ns)
}

// nowTick is the current wheel tick.
func (s *Stack) nowTick() timers.Tick {
	if s.nowNs == 0 {
		s.readClock()
	}
	return s.nowTk
}

// toTicks divides nanoseconds by the tick, by a multiplication with the
// 64-bit reciprocal and one correction (a division costs more than the
// rest of an idle poll). The quotient is exact.
func (s *Stack) toTicks(ns int64) timers.Tick {
	x := uint64(ns)
	q, _ := bits.Mul64(x, s.tickRecip)
	if x-q*uint64(s.tickNs) >= uint64(s.tickNs) {
		q++
	}
	return timers.Tick(q)
}

// micros is the µs clock (low 32 bits) for round-trip times.
func (s *Stack) micros() uint32 { return uint32(s.clock() / 1000) }

// tsNow is our TCP timestamp clock: milliseconds (RFC 7323 5.4 allows 1ms
// to 1s per tick).
func (s *Stack) tsNow() uint32 { return uint32(s.clock() / 1e6) }
