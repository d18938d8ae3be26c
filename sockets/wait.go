package sockets

import (
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/internal/eventfd"
	"github.com/xdp-onload/onload/internal/tlock"
	"github.com/xdp-onload/onload/stack"
)

// waitq is where goroutines sleep on one socket: a channel closed by the
// stack's Wake callback (from whichever goroutine polled) and replaced by
// the next sleeper. Closing wakes every sleeper at once; each re-checks.
// It counts its sleepers, so that the stack knows how many goroutines
// its wakes made ready (wakes.backlog).
type waitq struct {
	mu   tlock.Mutex // taken by the shim's threads: see tlock
	ch   chan struct{}
	n    int32        // goroutines asleep on ch
	want stack.Events // what they wait for, together, since the last wake (for Dump; one that left on its deadline stays in it)
	id   stack.SockID // the socket (for Dump); set before the stack sees w
	// efds are the eventfds of threads that block outside Go (the
	// LD_PRELOAD shim's, in poll, select and epoll): the next wake writes
	// each once and forgets them (Desc.Arm).
	efds []int32
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

// sleep counts the caller asleep on ch, waiting for want; false if ch
// was closed already.
func (w *waitq) sleep(ch <-chan struct{}, want stack.Events) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil || (<-chan struct{})(w.ch) != ch {
		return false
	}
	w.n++
	w.want |= want
	return true
}

// leave takes the caller, awake, off ch, and reports whether a wake
// closed ch (the caller was counted in the backlog).
func (w *waitq) leave(ch <-chan struct{}) (woken bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil && (<-chan struct{})(w.ch) == ch {
		w.n--
		return false
	}
	return true
}

// wake wakes every goroutine sleeping on w and says how many. It never
// blocks. The threads' eventfds it writes at once, or, given owed (a
// wake under the stack lock), leaves to owed's flush after the lock.
func (w *waitq) wake(owed *owedSignals) int32 {
	w.mu.Lock()
	n := w.n
	if w.ch != nil {
		close(w.ch)
		w.ch, w.n, w.want = nil, 0, 0
	}
	if owed != nil {
		owed.add(w.efds)
	} else {
		for _, fd := range w.efds {
			eventfd.Signal(int(fd))
		}
	}
	w.efds = w.efds[:0]
	w.mu.Unlock()
	return n
}

// owedSignals are eventfd writes owed by wakes made under the stack lock
// (the engine's Wake and ReadyWake), made by flush once the lock is let
// go (stack.Options.Unlocked). Under the lock, a write that woke a
// thread held the stack from the thread it woke, which then slept on the
// lock: memcached's two workers, each woken for the other's socket,
// took turns that way.
type owedSignals struct {
	pending atomic.Bool
	mu      tlock.Mutex // efds
	efds    []int32
	flushMu tlock.Mutex // one flusher at a time; out is its
	out     []int32
}

// add owes a write to each of efds.
func (o *owedSignals) add(efds []int32) {
	if len(efds) == 0 {
		return
	}
	o.mu.Lock()
	for _, fd := range efds {
		o.efds = with(o.efds, fd)
	}
	o.pending.Store(true)
	o.mu.Unlock()
}

// forget drops the writes owed to efd and waits for a flush that may be
// writing it: its thread is about to close it, and the number could then
// name another file.
func (o *owedSignals) forget(efd int32) {
	o.mu.Lock()
	o.efds = without(o.efds, efd)
	o.mu.Unlock()
	o.flushMu.Lock() // a flush that took efd before us ends first
	o.flushMu.Unlock()
}

// flush makes the writes owed. One caller flushes at a time; another
// that finds it busy leaves its writes to it: the flusher looks for more
// after it lets flushMu go, and the other set pending before it tried.
func (o *owedSignals) flush() {
	for o.pending.Load() {
		if !o.flushMu.TryLock() {
			return
		}
		o.mu.Lock()
		o.out, o.efds = o.efds, o.out[:0]
		o.pending.Store(false)
		o.mu.Unlock()
		for _, fd := range o.out {
			eventfd.Signal(int(fd))
		}
		o.flushMu.Unlock()
	}
}

// watch adds eventfd efd to those the next wake writes.
func (w *waitq) watch(efd int32) {
	w.mu.Lock()
	w.efds = with(w.efds, efd)
	w.mu.Unlock()
}

// unwatch takes efd off, if no wake has yet.
func (w *waitq) unwatch(efd int32) {
	w.mu.Lock()
	w.efds = without(w.efds, efd)
	w.mu.Unlock()
}

// with is efds with efd in it, added if it was not.
func with(efds []int32, efd int32) []int32 {
	if !slices.Contains(efds, efd) {
		return append(efds, efd)
	}
	return efds
}

// without is efds with efd taken out, if it was in.
func without(efds []int32, efd int32) []int32 {
	if i := slices.Index(efds, efd); i >= 0 {
		return slices.Delete(efds, i, i+1)
	}
	return efds
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

// spin is one blocking call's spin phase: it starts on the first wait if
// no other goroutine spins on the stack, and ends when the spin time is up,
// when the stack's polls have woken goroutines that wait for a processor,
// or when the call returns.
type spin struct {
	until    stack.Mono
	yieldAt  stack.Mono
	started  bool
	spinning bool
	stk      *Stack
}

// spinYield is how often a spinning goroutine yields its processor to
// whatever else the kernel has runnable there (sched_yield returns at
// once when nothing is): a spinner otherwise keeps the CPU for the
// scheduler's whole slice. A server sharing its CPUs with its clients
// (wrk beside net/http on two CPUs) served 0.74-0.84 of net's requests
// a second; 0.84-0.93 yielding, 0.93-0.98 with spinning off.
const spinYield = 20 * time.Microsecond

func (sp *spin) end() {
	if sp.spinning {
		sp.spinning = false
		sp.stk.sl.EndSpin()
	}
}

// await blocks the calling goroutine until socket c may be ready for want,
// its deadline passes, or it is closed. It returns nil to ask the caller
// to try its operation again; the caller re-checks closure and the
// deadline. retry, if not 0, bounds the sleep: a send waiting for frames
// to come back to the pool wakes no socket.
//
// One goroutine per stack spins (Sleeper.TrySpin): it polls the stack, for
// every socket, while nothing it woke waits for a processor. Once its
// polls have made other goroutines ready, it parks too: they have the work,
// and when they wait again one of them spins. Every other waiter parks at
// once. With many connections and few processors, a spinner per
// connection, or one that kept spinning while the goroutines it woke
// waited, would take the processor from the goroutines with work; and a
// spinner that yields (runtime.Gosched) goes to the back of the
// scheduler's global run queue, which a busy scheduler serves one
// goroutine in 61. A goroutine alone on its stack spins on its own socket
// for the spin time: the one-connection latency win.
func (c *sock) await(sp *spin, want stack.Events, dl *deadline, retry time.Duration) {
	c.awaitUnless(sp, want, dl, retry, nil)
}

// awaitUnless is await for a socket that may also become ready outside
// the stack (a listener's kernel half): it returns at once, after taking
// the channel that the next wake closes, if ready says so. Checked before
// that, a readiness whose wake came between the check and the channel
// would be lost.
func (c *sock) awaitUnless(sp *spin, want stack.Events, dl *deadline, retry time.Duration, ready func() bool) {
	s := c.stk
	if !sp.started {
		sp.started, sp.stk = true, s
		if s.spin > 0 && !s.wakes.busy() && s.sl.TrySpin() {
			now := stack.Now()
			sp.until, sp.yieldAt = now+stack.Mono(s.spin), now+stack.Mono(spinYield)
			sp.spinning = true
		}
	}
	if sp.spinning {
		if now := stack.Now(); !s.wakes.busy() && now < sp.until {
			if s.enter() {
				s.st.Poll()
				s.leave()
			}
			if now >= sp.yieldAt {
				syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
				sp.yieldAt = now + stack.Mono(spinYield)
			}
			return
		}
		sp.end()
	}
	ch := c.wq.prepare()
	if ready != nil && ready() {
		return
	}
	if !s.enter() {
		return
	}
	ev := s.st.WaitFor(c.id, want)
	if ev == 0 && s.st.CorkedOwed() && !s.wakes.busy() {
		// An ACK a read held (TCPConn.Read). With woken goroutines
		// still to run, the last of them kicks (kickIfLast).
		s.st.KickHeld()
	}
	s.leave()
	if ev != 0 || !c.wq.sleep(ch, want) {
		return
	}
	// The goroutines the stack woke and that have not run yet attend the
	// stack when they do: the Sleeper is needed only if there are none.
	s.sl.Park(s.wakes.busy())
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
	if c.wq.leave(ch) {
		s.wakes.ran(s)
		s.kickIfLast()
	}
}
