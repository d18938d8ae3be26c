package stack

import (
	"time"
	_ "unsafe" // for go:linkname

	"github.com/xdp-onload/onload/timers"
)

// nanotime is CLOCK_MONOTONIC in nanoseconds through the vDSO (about 25ns,
// no system call). It is the same clock in every process, which the image
// needs: onloadd runs the timers of a stack another process armed.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Mono is a point on CLOCK_MONOTONIC, in nanoseconds.
type Mono int64

// Now reads the clock.
func Now() Mono { return Mono(nanotime()) }

// ticks converts a duration to timer-wheel ticks, rounding up so that a
// timer never fires early.
func (s *Stack) ticks(d time.Duration) timers.Tick {
	t := int64(s.tickNs)
	return timers.Tick((int64(d) + t - 1) / t)
}

// tickAt is the wheel tick of a point in time.
func (s *Stack) tickAt(m Mono) timers.Tick { return timers.Tick(int64(m) / int64(s.tickNs)) }
