package stack

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/timers"
	"github.com/xdp-onload/onload/vnic"
)

// rtoNow is the current retransmission timeout with backoff applied, in µs.
func (s *Stack) rtoNow(sk *sock) uint32 {
	rto := uint64(sk.rto)
	if rto == 0 {
		rto = uint64(initialRTO / time.Microsecond)
	}
	rto <<= min(sk.backoff, 12)
	return uint32(min(rto, uint64(maxRTO/time.Microsecond)))
}

// armRTOLocked starts the retransmission timer (RFC 6298 5.1), or restarts
// it when restart is set (5.3).
// Where a tail loss probe is due sooner (RFC 8985 7.2), the timer is the
// probe timeout instead, and the RTO follows the probe.
func (s *Stack) armRTOLocked(sk *sock, restart bool) {
	if sk.rtoAt != 0 && !restart && sk.tflags&tfWindowProbe == 0 {
		return
	}
	sk.tflags &^= tfWindowProbe
	us := s.rtoNow(sk)
	sk.timerMode = tmRTO
	if sk.tlpEligible() {
		us = s.ptoLocked(sk)
		sk.timerMode = tmTLP
	}
	if sk.userTimeout != 0 && sk.sndUna != sk.sndMax {
		// Fire no later than the user timeout, so it ends the
		// connection on time whatever the backoff.
		left := int64(sk.progressAt) + int64(sk.userTimeout) - int64(s.tsNow())
		us = uint32(min(int64(us), max(left, 1)*1000))
	}
	s.setLazyLocked(sk, timerRTO, &sk.rtoAt, s.nowTick()+s.ticks(time.Duration(us)*time.Microsecond))
}

// stopRTOLocked stops the retransmission timer (the wheel timer, if armed,
// finds nothing to do when it fires).
func (s *Stack) stopRTOLocked(sk *sock) {
	sk.rtoAt = 0
	sk.tflags &^= tfWindowProbe
}

// armPersistLocked starts the persist timer: the peer's window is zero and
// nothing is in flight, so probe it (RFC 9293 3.8.6.1).
func (s *Stack) armPersistLocked(sk *sock) {
	if sk.rtoAt != 0 {
		return
	}
	sk.tflags |= tfWindowProbe
	sk.timerMode = tmRTO
	s.setLazyLocked(sk, timerRTO, &sk.rtoAt, s.nowTick()+s.ticks(time.Duration(s.rtoNow(sk))*time.Microsecond))
}

// setLazyLocked records a lazy timer's deadline, and arms the wheel only
// if its timer is not already due at or before it.
func (s *Stack) setLazyLocked(sk *sock, n int, at *timers.Tick, deadline timers.Tick) {
	if deadline == 0 {
		deadline = 1
	}
	*at = deadline
	id := s.sockTimer(sk, n)
	if cur, armed := s.img.wheel.Deadline(id); !armed || cur > deadline {
		s.img.wheel.Set(id, deadline)
	}
}

// lazyDueLocked decides, when a lazy timer's wheel timer fires, whether its
// deadline has come: if not, the wheel timer moves to the deadline.
func (s *Stack) lazyDueLocked(sk *sock, n int, at *timers.Tick) bool {
	if *at == 0 {
		return false
	}
	if now := s.nowTick(); now < *at {
		s.img.wheel.Set(s.sockTimer(sk, n), *at)
		return false
	}
	*at = 0
	return true
}

// rttSampleLocked folds a round-trip measurement (µs) into the estimators
// (RFC 6298 2.2, 2.3) and recomputes the timeout.
func (s *Stack) rttSampleLocked(sk *sock, r uint32) {
	if r == 0 {
		r = 1
	}
	if sk.srtt == 0 {
		sk.srtt, sk.rttvar = r, r/2
	} else {
		delta := sk.srtt - r
		if r > sk.srtt {
			delta = r - sk.srtt
		}
		sk.rttvar = (3*sk.rttvar + delta) / 4
		sk.srtt = (7*sk.srtt + r) / 8
	}
	g := uint32(s.tickNs / 1000)
	rto := sk.srtt + max(g, 4*sk.rttvar)
	rto = max(rto, s.img.hdr.minRTO)
	sk.rto = min(rto, uint32(maxRTO/time.Microsecond))
}

// tcpTimerLocked dispatches a socket's expired timer.
func (s *Stack) tcpTimerLocked(sk *sock, n int) {
	switch n {
	case timerRTO:
		probe := sk.tflags&tfWindowProbe != 0
		if !s.lazyDueLocked(sk, timerRTO, &sk.rtoAt) {
			return
		}
		if probe {
			sk.tflags |= tfWindowProbe
		}
		s.rtoExpiredLocked(sk)
	case timerDelAck:
		if sk.tflags&tfDelAck != 0 && s.lazyDueLocked(sk, timerDelAck, &sk.delAckAt) {
			// No answer carried the ACK in time: not request and
			// response, as Linux's delayed-ACK timer leaves pingpong
			// mode (tcp_delack_timer_handler).
			sk.tflags &^= tfPingPong
			s.sendAckLocked(sk)
		}
	case timerTW:
		s.twExpiredLocked(sk)
	case timerCork:
		if sk.tflags&tfCork != 0 && s.lazyDueLocked(sk, timerCork, &sk.corkAt) {
			sk.tflags |= tfPush // tcpOutputLocked below sends what the cork held
		}
	}
	if sk.kind == kindTCP {
		s.tcpOutputLocked(sk)
	}
	if sk.kind != kindFree {
		s.touchLocked(sk)
	}
}

// rtoExpiredLocked handles the retransmission timer (RFC 6298 5.4-5.7):
// resend, back off, and give up after too many tries.
func (s *Stack) rtoExpiredLocked(sk *sock) {
	c := &s.img.hdr.counters
	if sk.tflags&tfWindowProbe != 0 {
		sk.tflags &^= tfWindowProbe
		if sk.sndUnsent == vnic.Null || sk.sndNxt != sk.sndUna {
			return
		}
		if wnd := int(min(sk.sndWnd, sk.cwnd)); wnd > 0 {
			// The window is open but smaller than the next segment: send
			// what fits (RFC 1122 4.2.3.4: the override timeout).
			s.splitSendLocked(sk, sk.sndUnsent, wnd)
			return // tcpTimerLocked's output sends it
		}
		// A probe: an old sequence number draws an ACK that carries the
		// current window.
		s.controlLocked(sk, flagACK, sk.sndUna.Add(^seqnum.Size(0)))
		c.TCPWindowProbes++
		sk.backoff++
		s.armPersistLocked(sk)
		return
	}
	if s.userTimedOutLocked(sk) {
		return
	}
	switch sk.state {
	case tcpSynSent, tcpSynReceived:
		sk.retries++
		if sk.retries > synRetries {
			c.TCPTimeouts++
			s.tcpFailLocked(sk, errTimedOut)
			return
		}
		sk.backoff++
		flags := uint8(flagSYN)
		if sk.state == tcpSynReceived {
			flags |= flagACK
		}
		s.controlLocked(sk, flags, sk.iss)
		c.TCPRetransmits++
		s.armRTOLocked(sk, true)
		return
	case tcpClosed, tcpListen, tcpTimeWait:
		return
	}
	if sk.sndUna == sk.sndMax {
		return // everything was acknowledged meanwhile
	}
	switch sk.timerMode {
	case tmTLP:
		s.tlpFireLocked(sk)
		return
	case tmReorder:
		if wait := s.rackDetectLossLocked(sk, s.micros()); wait > 0 {
			s.armReorderLocked(sk, wait)
		} else {
			s.armRTOLocked(sk, true)
		}
		if sk.needRexmit() && sk.caState == caOpen {
			s.enterRecoveryLocked(sk, 0)
		}
		return
	}
	sk.retries++
	if sk.retries > dataRetries {
		c.TCPTimeouts++
		s.tcpFailLocked(sk, errTimedOut)
		return
	}
	c.TCPRTOs++
	sk.backoff++
	s.timeoutLocked(sk)
	s.armRTOLocked(sk, true)
}

// userTimedOutLocked ends a connection whose data has waited for an
// acknowledgement longer than its user timeout (RFC 5482, RFC 9293
// 3.8.3): retransmissions and window probes alike.
func (s *Stack) userTimedOutLocked(sk *sock) bool {
	if sk.userTimeout == 0 || !synchronized(sk.state) || sk.sndUna == sk.sndMax && sk.tflags&tfWindowProbe == 0 {
		return false
	}
	if int64(s.tsNow())-int64(sk.progressAt) < int64(sk.userTimeout) {
		return false
	}
	s.img.hdr.counters.TCPTimeouts++
	s.tcpFailLocked(sk, errTimedOut)
	return true
}

// twExpiredLocked ends TIME-WAIT and an orphan's FIN-WAIT-2, and drives
// keepalive.
func (s *Stack) twExpiredLocked(sk *sock) {
	switch {
	case sk.state == tcpListen && sk.tflags&tfOrphan != 0:
		// A retired listener nobody took (lingerRetiredLocked): closed
		// now, its queue reset (orphaned, it lingers no more).
		s.tcpCloseLocked(sk)
	case sk.state == tcpTimeWait, sk.state == tcpHandedOver, sk.state == tcpFinWait2 && sk.userClosed():
		s.tcpCloseFinalLocked(sk)
	case keepaliveState(sk.state):
		// A half-closed connection (FIN-WAIT-2 that the user still
		// reads) lives on as long as its peer does: only keepalive ends it.
		s.keepaliveLocked(sk)
	}
}

// keepaliveState reports whether keepalive probes a connection in state
// st: one that can still receive.
func keepaliveState(st uint8) bool {
	return st == tcpEstablished || st == tcpCloseWait || st == tcpFinWait1 || st == tcpFinWait2
}

// keepaliveLocked probes an idle connection (RFC 1122 4.2.3.6) and gives
// up after keepCnt unanswered probes.
func (s *Stack) keepaliveLocked(sk *sock) {
	if sk.tflags&tfKeepAlive == 0 {
		return
	}
	now := s.nowTick()
	idle := time.Duration(uint32(now)-sk.lastRcv) * time.Duration(s.tickNs)
	if idle < time.Duration(sk.keepIdle)*time.Second {
		sk.keepProbes = 0
		s.img.wheel.Set(s.sockTimer(sk, timerTW), now+s.ticks(time.Duration(sk.keepIdle)*time.Second-idle))
		return
	}
	if uint32(sk.keepProbes) >= sk.keepCnt {
		s.img.hdr.counters.TCPTimeouts++
		s.tcpFailLocked(sk, errTimedOut)
		return
	}
	sk.keepProbes++
	s.controlLocked(sk, flagACK, sk.sndUna.Add(^seqnum.Size(0)))
	s.img.wheel.Set(s.sockTimer(sk, timerTW), now+s.ticks(time.Duration(sk.keepIntvl)*time.Second))
}

// armKeepaliveLocked starts the keepalive clock of a connection.
func (s *Stack) armKeepaliveLocked(sk *sock) {
	if sk.tflags&tfKeepAlive != 0 && keepaliveState(sk.state) {
		s.img.wheel.Set(s.sockTimer(sk, timerTW), s.nowTick()+s.ticks(time.Duration(sk.keepIdle)*time.Second))
	}
}

// enterTimeWaitLocked moves to TIME-WAIT and starts the 2MSL clock.
func (s *Stack) enterTimeWaitLocked(sk *sock) {
	if sk.state != tcpTimeWait {
		s.img.hdr.sockTimeWait++
		s.twLinkLocked(sk)
		s.overflowCheckLocked()
	}
	sk.state = tcpTimeWait
	w := s.img.wheel
	s.stopRTOLocked(sk)
	w.Set(s.sockTimer(sk, timerTW), s.nowTick()+s.ticks(time.Duration(s.img.hdr.timeWait)))
	// Nothing more will be sent: give those frames back now. What the
	// user has not read yet stays readable.
	s.freeSendLocked(sk)
	if sk.tflags&tfOrphan != 0 {
		s.freeQueuesLocked(sk, false)
	}
}

// cancelTimersLocked stops every timer of a socket.
func (s *Stack) cancelTimersLocked(sk *sock) {
	sk.rtoAt, sk.delAckAt, sk.corkAt = 0, 0, 0
	for i := range timersPerSock {
		s.img.wheel.Cancel(s.sockTimer(sk, i))
	}
}

// socketTimer maps a wheel timer ID to its socket, if it is a socket's.
func (s *Stack) socketTimer(id timers.ID) (*sock, int, bool) {
	slot := uint32(id) / timersPerSock
	if slot >= uint32(len(s.img.socks)) {
		return nil, 0, false
	}
	return &s.img.socks[slot], int(uint32(id) % timersPerSock), true
}
