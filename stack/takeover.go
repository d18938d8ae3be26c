package stack

import "sync/atomic"

// Takeover. onloadd maps every stack it makes and watches it: when the
// process stops polling (stopped, descheduled, busy elsewhere) while
// frames wait or timers are due, onloadd polls the stack itself, with the
// same code, under the same lock (package daemon, watch.go). These are
// the engine's side of it: when the process last polled, which only the
// process's own handles write, and the state the watcher reads without
// the lock.

// SetWatcher marks this handle as onloadd's: its polls do not count as
// the process's (AppPolledAt).
func (s *Stack) SetWatcher() { s.watcher = true }

// notePolled records that a client process polled at now.
func (s *Stack) notePolled(now int64) {
	if !s.watcher {
		atomic.StoreInt64(&s.img.hdr.appPolledAt, now)
	}
}

// AppPolledAt is when a thread of a client process last polled the stack
// or found nothing to do, on the Clock (0: never). Lock-free.
func (s *Stack) AppPolledAt() int64 { return atomic.LoadInt64(&s.img.hdr.appPolledAt) }

// Waiting reports, without the lock, that a poll would find work: frames
// in the receive ring, or a timer that may be due. It reads only the
// ring's shared words and the timer wheel's summary, so the watcher may
// call it while the process drives the stack.
func (s *Stack) Waiting() bool {
	if x, ok := s.nic.(interface{ RxPending() uint32 }); ok && x.RxPending() > 0 {
		return true
	}
	return s.img.wheel.MayBeDue(s.toTicks(s.fast.nowRacy()))
}
