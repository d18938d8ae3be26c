// Package lookback paces the looks of whoever stands in for a process
// that polls its stack (the process's own Sleeper, onloadd's watcher):
// while the process keeps polling, each look that finds the stack polled
// since the last one doubles the time to the next, up to a bound, so
// that a process that polls without pause is not woken beside a
// thousand times a second. A look that finds the process away starts
// over (Reset).
package lookback

import "time"

// Bound is the longest time between looks at a stack its process keeps
// polling, unless a caller's first look is later (onloadd's watcher with
// a long grace period): how long a process that goes away without
// blocking may leave its frames and timers. It is well under a peer's
// tail loss probe (8-10 ms and more on veth), which frames waiting for
// us would draw.
const Bound = 4 * time.Millisecond

// Backoff is the pace of one looker. The zero value is ready; a Backoff
// is one goroutine's.
type Backoff struct {
	look time.Duration // the time between looks so far; 0: none yet
	at   int64         // the last poll the last look saw (the stack's clock)
}

// Next is how long to sleep before the next look at a stack last polled
// at `at` (on the stack's clock), since ago: first after the first look,
// or after one that finds no poll since the last; twice the time before
// after one that does, up to max; less since.
func (b *Backoff) Next(at int64, since, first, max time.Duration) time.Duration {
	switch {
	case b.look == 0 || at == b.at:
		b.look = first
	default:
		b.look = min(2*b.look, max)
	}
	b.at = at
	return b.look - since
}

// Reset starts the pace over: the process was found away, or the stack
// idle.
func (b *Backoff) Reset() { b.look = 0 }
