package interrupts

import "time"

// waiter is how the Sleeper sleeps: in the Go scheduler, on a channel and
// a runtime timer (chanWaiter), or on an OS thread of its own, in the
// kernel (threadWaiter, Policy.Thread).
type waiter interface {
	// setTimer makes the timer fire at `at`, now being now (both on the
	// stack's Clock); any goroutine or thread may call it.
	setTimer(at, now int64)
	// stopTimer stops the timer; a firing that comes anyway wakes the
	// Sleeper for nothing.
	stopTimer()
	// kick wakes the wait in progress, or the next one: false if a kick
	// was pending already.
	kick() bool
	// wait sleeps until the timer, a kick, Stop, or (irq) the interrupt
	// line.
	wait(irq bool) wakeReason
	// close frees what the waiter holds, once the Sleeper has stopped.
	close()
}

type wakeReason int

const (
	wokeKick wakeReason = iota
	wokeIRQ
	wokeTimer
	wokeStop
)

// chanWaiter sleeps in the Go scheduler: a goroutine blocked on a
// channel holds no OS thread.
type chanWaiter struct {
	timer *time.Timer
	kicks chan struct{}
	stop  <-chan struct{}
	irq   <-chan struct{} // the Source's
}

func newChanWaiter(src Source, stop <-chan struct{}) *chanWaiter {
	w := &chanWaiter{timer: time.NewTimer(time.Hour), kicks: make(chan struct{}, 1), stop: stop}
	w.timer.Stop()
	if src != nil {
		w.irq = src.C()
	}
	return w
}

func (w *chanWaiter) setTimer(at, now int64) { w.timer.Reset(time.Duration(max(at-now, 0))) }
func (w *chanWaiter) stopTimer()             { w.timer.Stop() }
func (w *chanWaiter) close()                 { w.timer.Stop() }

func (w *chanWaiter) kick() bool {
	select {
	case w.kicks <- struct{}{}:
		return true
	default:
		return false
	}
}

func (w *chanWaiter) wait(irq bool) wakeReason {
	var c <-chan struct{}
	if irq {
		c = w.irq
	}
	select {
	case <-w.stop:
		return wokeStop
	case <-c:
		return wokeIRQ
	case <-w.timer.C:
		return wokeTimer
	case <-w.kicks:
		return wokeKick
	}
}
