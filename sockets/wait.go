package sockets

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// waitq is where goroutines sleep on one socket: a channel closed by the
// stack's Wake callback (from whichever goroutine polled) and replaced by
// the next sleeper. Closing wakes every sleeper at once; each re-checks.
type waitq struct {
	mu sync.Mutex
	ch chan struct{}
}

// prepare returns the channel the next wake closes. Take it before asking
// the stack for a wake-up, so that a wake between the two is not lost.
func (w *waitq) prepare() <-chan struct{} {
	w.mu.Lock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	c := w.ch
	w.mu.Unlock()
	return c
}

// wake wakes every goroutine sleeping on w. It never blocks: it runs under
// the stack lock.
func (w *waitq) wake() {
	w.mu.Lock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	w.mu.Unlock()
}

// deadline is one direction's deadline (SetReadDeadline and the like):
// a fast check for operations, and a channel closed when it passes for
// goroutines asleep, so that changing the deadline of a blocked call
// takes effect at once.
type deadline struct {
	ns atomic.Int64 // UnixNano of the deadline; 0: none

	mu      sync.Mutex
	timer   *time.Timer
	ch      chan struct{}
	expired bool // ch is closed
}

// set moves the deadline; the zero time removes it.
func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	if d.ch == nil || d.expired {
		d.ch, d.expired = make(chan struct{}), false
	}
	if t.IsZero() {
		d.ns.Store(0)
		return
	}
	d.ns.Store(max(t.UnixNano(), 1))
	dur := time.Until(t)
	if dur <= 0 {
		close(d.ch)
		d.expired = true
		return
	}
	ch := d.ch
	d.timer = time.AfterFunc(dur, func() {
		d.mu.Lock()
		if d.ch == ch && !d.expired {
			close(ch)
			d.expired = true
		}
		d.mu.Unlock()
	})
}

// passed reports whether the deadline has passed.
func (d *deadline) passed() bool {
	ns := d.ns.Load()
	return ns != 0 && time.Now().UnixNano() >= ns
}

// done is closed when the deadline passes (or is moved: the sleeper
// re-checks).
func (d *deadline) done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ch == nil {
		d.ch = make(chan struct{})
	}
	return d.ch
}

// spin is one blocking call's spin phase: it starts on the first wait and
// ends when the spin time is up or the call returns.
type spin struct {
	until    stack.Mono
	started  bool
	spinning bool
	stk      *Stack
}

func (sp *spin) end() {
	if sp.spinning {
		sp.spinning = false
		sp.stk.sl.EndSpin()
	}
}

// await blocks the calling goroutine until socket c may be ready for want,
// its deadline passes, or it is closed: first polling the stack for the
// spin time, then asleep with the stack's interrupt armed. It returns nil
// to ask the caller to try its operation again; the caller re-checks
// closure and the deadline. retry, if not 0, bounds the sleep: a send
// waiting for frames to come back to the pool wakes no socket.
func (c *sock) await(sp *spin, want stack.Events, dl *deadline, retry time.Duration) {
	s := c.stk
	if !sp.started {
		sp.started, sp.stk = true, s
		if s.spin > 0 {
			sp.until = stack.Now() + stack.Mono(s.spin)
			sp.spinning = true
			s.sl.BeginSpin()
		}
	}
	if sp.spinning {
		if stack.Now() < sp.until {
			if s.enter() {
				s.st.Poll()
				s.leave()
			}
			return
		}
		sp.end()
	}
	ch := c.wq.prepare()
	if !s.enter() {
		return
	}
	ev := s.st.WaitFor(c.id, want)
	s.leave()
	if ev != 0 {
		return
	}
	s.sl.Park()
	var dch <-chan struct{}
	if dl != nil {
		dch = dl.done()
	}
	var again <-chan time.Time
	if retry > 0 {
		t := time.NewTimer(retry)
		defer t.Stop()
		again = t.C
	}
	select {
	case <-ch:
	case <-dch:
	case <-c.closing:
	case <-s.closing:
	case <-again:
	}
	s.sl.Unpark()
}
