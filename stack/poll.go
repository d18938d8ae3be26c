package stack

import "github.com/xdp-onload/onload/timers"

// Poll processes up to a budget of received frames, runs due timers and
// sends what is ready, in the calling goroutine. If another thread holds
// the stack lock, it leaves the poll to that thread (LockOrDefer) and
// returns 0 at once. It returns the number of frames it took in.
func (s *Stack) Poll() int {
	// A busy-poller's idle polls end here, without the lock.
	if now := s.fast.nowRacy(); s.nic.Idle() && s.corkedN.Load() == 0 && !s.img.wheel.MayBeDue(s.toTicks(now)) {
		s.polledAt.Store(now)
		s.notePolled(now)
		return 0
	}
	if !s.img.hdr.lock.LockOrDefer(DeferPoll) {
		return 0
	}
	s.lockedLocked()
	n := s.pollLocked()
	s.unlockTried()
	return n
}

func (s *Stack) pollLocked() int {
	n := s.nic.Receive(s.rx)
	s.setClock(s.fast.now()) // a poll always needs it: timers
	s.polledAt.Store(s.nowNs)
	s.notePolled(s.nowNs)
	s.batch = s.batchBuf[:0]
	for _, h := range s.rx[:n] {
		s.inputLocked(h)
	}
	s.outputBatchLocked()
	if n > 0 && s.rxDepth > 0 {
		s.countReceiversLocked()
	}
	if s.img.wheel.MayBeDue(s.nowTick()) {
		s.timersLocked()
	}
	if len(s.corked) > 0 {
		s.pushAutoCorkedLocked()
	}
	s.flushLocked()
	return n
}

// timersLocked runs the timers due by now.
func (s *Stack) timersLocked() {
	for {
		n, err := s.img.wheel.Expire(s.nowTick(), s.expired)
		if err != nil {
			s.img.hdr.counters.ImageCorrupt++
			return
		}
		for _, id := range s.expired[:n] {
			s.timerLocked(id)
		}
		if n < len(s.expired) {
			break
		}
	}
	// Cancelling or expiring the earliest timer forgets the wheel's
	// earliest deadline; find it again now, or every idle check until the
	// next one that asks would say a timer may be due.
	if _, _, err := s.img.wheel.NextDeadline(); err != nil {
		s.img.hdr.counters.ImageCorrupt++
	}
}

// timerLocked dispatches one expired timer to its socket.
func (s *Stack) timerLocked(id timers.ID) {
	if id == s.stackTimer(timerNeigh) {
		s.neighTimerLocked()
		return
	}
	if sk, n, ok := s.socketTimer(id); ok && sk.kind == kindTCP {
		s.tcpTimerLocked(sk, n)
	}
}

// idle reports, without the lock, that a poll would find nothing to do:
// nothing arrived, the NIC needs no care and no timer can be due.
func (s *Stack) idle() bool {
	return s.nic.Idle() && s.looped.Load() == 0 && s.corkedN.Load() == 0 && !s.img.wheel.MayBeDue(s.toTicks(s.fast.nowRacy()))
}

// PolledAt is when a thread of this process last polled the stack, or
// looked and found nothing to do, on the Clock: whoever watches for a
// poller that stopped (the Sleeper) reads it without the lock.
func (s *Stack) PolledAt() int64 { return s.polledAt.Load() }
