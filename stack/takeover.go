package stack

import (
	"sync/atomic"
	"time"
)

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

// CloseAbandoned closes every socket the stack's processes left open, as
// the kernel closes the descriptors of a process that exits: a
// connection sends what was written and then FIN (RST instead if data
// came that was never read, or with SO_LINGER 0), a listener resets the
// connections nobody accepted, a UDP socket goes. Sockets already closed
// and finishing (FIN-WAIT, TIME-WAIT) go on as they were. onloadd calls it
// when the last process of a stack is gone, and polls the stack until
// InUse is 0. It takes the lock by trylock, for at most wait, and
// reports false if the lock stayed held (its holder may have died with
// it: nothing is closed then).
func (s *Stack) CloseAbandoned(wait time.Duration) (closed int, ok bool) {
	return s.closeEvery(wait, func(sk *sock) bool { return s.closeAbandonedLocked(sk) })
}

// CloseAbandonedBy closes, as CloseAbandoned does, the sockets that
// process pid (as it sees itself) opened or accepted, and gives its slot
// among the stack's sharers back: onloadd calls it when a process of a
// shared stack dies while others stay. It reports false if the lock
// stayed held, and true with nothing closed if pid has no slot.
func (s *Stack) CloseAbandonedBy(pid int, wait time.Duration) (closed int, ok bool) {
	proc := uint8(0)
	for i := range s.img.hdr.procs {
		if p := &s.img.hdr.procs[i]; pid > 0 && atomic.LoadUint32(&p.pid) == uint32(pid) {
			proc = uint8(i + 1)
		}
	}
	if proc == 0 {
		return 0, true
	}
	bit := procBit(proc)
	closed, ok = s.closeEvery(wait, func(sk *sock) bool {
		if sk.openers&bit == 0 {
			return false
		}
		if sk.openers &^= bit; sk.openers != 0 {
			return false // a listener other processes share
		}
		return s.closeAbandonedLocked(sk)
	})
	if ok {
		atomic.CompareAndSwapUint32(&s.img.hdr.procs[proc-1].pid, uint32(pid), 0)
	}
	return closed, ok
}

// closeAbandonedLocked closes sk, left open by a process that is gone,
// unless it is closing already or waits in a listener's accept queue.
func (s *Stack) closeAbandonedLocked(sk *sock) bool {
	switch {
	case sk.kind == kindTCP && sk.tflags&tfOrphan != 0:
		return false // closed by the application already
	case sk.kind == kindTCP && sk.tflags&tfPassive != 0 && sk.tflags&tfAccepted == 0:
		return false // never accepted: its listener's close resets it
	}
	s.closeLocked(sk)
	return true
}

// closeEvery takes the lock by trylock, trying for at most wait, and
// calls close on every socket in use (which may free it); it returns how
// many close reported closed, and false if the lock stayed held.
func (s *Stack) closeEvery(wait time.Duration, close func(*sock) bool) (n int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.tryLockWithin(wait) {
		return 0, false
	}
	s.lockedLocked()
	s.setClock(s.fast.now())
	for i := range s.img.socks {
		if sk := &s.img.socks[i]; sk.kind != kindFree && close(sk) {
			n++
		}
	}
	s.flushLocked()
	s.unlockTried()
	return n, true
}

// ResetAll aborts every socket: a connection sends RST and goes at once
// (no FIN, no TIME-WAIT), as onloadd's stackdump kill ends an orphan. The
// lock is taken as by CloseAbandoned; false if it stayed held.
func (s *Stack) ResetAll(wait time.Duration) (reset int, ok bool) {
	return s.closeEvery(wait, func(sk *sock) bool {
		if sk.kind != kindTCP {
			s.closeLocked(sk)
			return true
		}
		if synchronized(sk.state) && sk.state != tcpTimeWait {
			s.controlLocked(sk, flagRST, sk.sndNxt)
		}
		sk.tflags |= tfOrphan
		s.tcpCloseFinalLocked(sk)
		return true
	})
}

// LockHolder is the process id (as that process sees itself) of the
// stack lock's holder, 0 if the lock is free (Lock.Holder).
func (s *Stack) LockHolder() int { return s.img.hdr.lock.Holder() }

// BreakLock lets go the stack lock that process holder (0: whoever)
// held and died holding (Lock.Break), for onloadd once that process is
// gone. What the holder left half-done is then read as any image data
// is: checked at every step, what does not add up counted in
// ImageCorrupt.
func (s *Stack) BreakLock(holder int) bool { return s.img.hdr.lock.Break(holder) }

// HoldLock takes the stack lock and keeps it until release is called:
// for a caller that must freeze the stack (a test of a process that dies
// inside it).
func (s *Stack) HoldLock() (release func()) {
	s.lock()
	return s.unlock
}

// InUse is how many sockets are open or still closing (TIME-WAIT
// included). Lock-free: a hint for onloadd's reaper of orphan stacks.
func (s *Stack) InUse() int { return int(atomic.LoadUint32(&s.img.hdr.sockInUse)) }

// CorruptSeen is the image's count of inconsistencies the engine found
// and stepped around (Counters.ImageCorrupt), read without the lock: the
// watcher quarantines a stack whose count grows under its polls.
func (s *Stack) CorruptSeen() uint64 { return atomic.LoadUint64(&s.img.hdr.counters.ImageCorrupt) }
