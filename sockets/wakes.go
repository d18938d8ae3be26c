package sockets

import (
	"sync/atomic"

	"github.com/xdp-onload/onload/internal/tlock"
)

// wakes rations the stack's wake-ups so that goroutines run in the order
// their sockets became ready. A poll can make hundreds of sockets ready
// at once. Woken all at once, their goroutines would overflow the
// scheduler's per-processor run queue (256) into the global one, which it
// serves one goroutine in 61 while the local one has work; and a woken
// goroutine that polls and wakes others before it parks hands the
// processor to the last one it woke (the run queue's "next" slot), so
// that the first ones wait. Either way some requests waited hundreds of
// milliseconds while most took microseconds.
//
// So at most limit goroutines (one per processor) are woken and not yet
// running (backlog); the wakes beyond it wait here, oldest first, and
// each woken goroutine, as it starts running, passes the turn to the
// next. Polling is not held back: frames still go from the rings into
// the sockets' queues, acknowledged and within their windows, as a
// kernel's would; only the goroutines wait their turn.
type wakes struct {
	limit   int32
	backlog atomic.Int32 // goroutines woken that have not run yet

	mu      tlock.Mutex // taken by the shim's threads: see tlock
	ring    []int32     // socket slots waiting for their wake, oldest first
	head, n int
	queued  []bool       // by slot: in ring
	pending atomic.Int32 // n, for busy to read without mu

	// Counted for the stack's dump: wakes made at once, wakes queued
	// behind the backlog, and sends whose kick waited for others.
	woken, queuedWakes, heldSends atomic.Uint64
}

func (w *wakes) init(slots, procs int) {
	w.limit = int32(max(procs, 1))
	w.ring = make([]int32, slots)
	w.queued = make([]bool, slots)
}

// post wakes the goroutines asleep on slot i, or queues the wake behind
// the others if limit goroutines woken already have not run. It runs
// under the stack lock.
func (w *wakes) post(s *Stack, i int) {
	w.mu.Lock()
	// Read under mu: a goroutine that lowers the backlog then looks at
	// the queue under mu, so it sees this wake if we saw its backlog.
	if w.n > 0 || w.backlog.Load() >= w.limit {
		if !w.queued[i] {
			w.queued[i] = true
			w.ring[(w.head+w.n)%len(w.ring)] = int32(i)
			w.n++
			w.pending.Store(int32(w.n))
			w.queuedWakes.Add(1)
		}
		w.mu.Unlock()
		return
	}
	w.mu.Unlock()
	w.wakeSlot(s, i, &s.owed)
}

// wakeSlot wakes slot i's sleepers and counts them in the backlog; owed
// as for waitq.wake.
func (w *wakes) wakeSlot(s *Stack, i int, owed *owedSignals) {
	if q := s.waits[i].Load(); q != nil {
		if n := q.wake(owed); n > 0 {
			w.backlog.Add(n)
			w.woken.Add(uint64(n))
		}
	}
}

// ran is called by a goroutine a wake made ready, once it runs: it
// leaves the backlog and wakes the next in line.
func (w *wakes) ran(s *Stack) {
	w.backlog.Add(-1)
	for w.backlog.Load() < w.limit {
		w.mu.Lock()
		if w.n == 0 {
			w.mu.Unlock()
			return
		}
		i := int(w.ring[w.head])
		w.head = (w.head + 1) % len(w.ring)
		w.n--
		w.pending.Store(int32(w.n))
		w.queued[i] = false
		w.mu.Unlock()
		w.wakeSlot(s, i, nil)
	}
}

// busy reports that goroutines the stack woke have not run yet, or wait
// for their turn to be woken: the processors have work.
func (w *wakes) busy() bool { return w.backlog.Load() > 0 || w.pending.Load() > 0 }

// kickIfLast kicks what SendMore and RecvMore held, unless goroutines the
// stack woke are still to run. A held kick is owed by whoever sees the
// batch end: the holder itself, if the others ran while it sent (it
// looks after its send, so it cannot miss one that ran before), or else
// the last of them to run (which looks as it leaves the backlog, in
// await). Not the operation the last one runs next: that one may send
// nothing (data queued already, a full send buffer) and park, and an
// armed Sleeper waits for frames that never left. It enters the engine
// only when a kick is owed: a woken goroutine pays two atomic loads.
func (s *Stack) kickIfLast() {
	if s.wakes.busy() || !s.st.KickOwed() || !s.enter() {
		return
	}
	s.st.KickHeld()
	s.leave()
}
