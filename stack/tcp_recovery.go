package stack

import "gvisor.dev/gvisor/pkg/tcpip/seqnum"

// Loss recovery: what an acknowledgement means for the scoreboard, the
// recovery state and the congestion window.
//
//   - With SACK, RACK marks losses (tcp_rack.go); without it, the third
//     duplicate ACK and each partial ACK mark the first unacknowledged
//     segment (RFC 5681 3.2, RFC 6582).
//   - The first loss enters fast recovery: the congestion control sets
//     ssthresh, and Proportional Rate Reduction (RFC 6937) paces the
//     retransmissions and new data down to it over one round trip.
//   - A recovery is undone when it proves spurious: the acknowledgement that
//     ends it echoes a timestamp from before the first retransmission
//     (Eifel, RFC 3522; after a timeout, the first new acknowledgement,
//     as F-RTO would), or D-SACKs report every retransmission arrived twice
//     (RFC 2883). Undoing restores the window and widens RACK's
//     reordering window.

// recoverLocked runs after an acknowledgement updated the scoreboard:
// advanced says sndUna moved, delivered counts the bytes it newly showed
// delivered (cumulatively or by SACK), dsack that it carried a D-SACK.
func (s *Stack) recoverLocked(sk *sock, g *segment, advanced bool, delivered uint32, dsack bool, now uint32) {
	if sk.tflags&tfUndo != 0 {
		if dsack && sk.undoRetrans > 0 {
			if sk.undoRetrans--; sk.undoRetrans == 0 {
				s.undoLocked(sk)
			}
		}
		if advanced && sk.caState != caOpen && g.opts.ts && g.opts.tsEcr != 0 && int32(g.opts.tsEcr-sk.undoTS) < 0 &&
			(sk.caState == caLoss || sk.recover.LessThanEq(sk.sndUna)) {
			s.undoLocked(sk)
		}
	}
	wait := uint32(0)
	if sk.tflags&tfSackOK != 0 {
		if sk.sackedBytes > 0 || sk.caState != caOpen || sk.needRexmit() {
			wait = s.rackDetectLossLocked(sk, now)
		}
	} else if sk.sndUna != sk.sndMax {
		// RFC 5681 3.2 and RFC 6582: the third duplicate ACK, and in
		// recovery each partial ACK, mark the first unacknowledged
		// segment lost.
		if sk.caState == caOpen && sk.dupAck == 3 || sk.caState == caRecovery && advanced {
			if f, ok := s.pool.Frame(sk.sndHead); ok && sk.sndHead != sk.sndUnsent && f.Aux(auxFlags)&afLost == 0 {
				s.markLostLocked(sk, f)
			}
		}
	}
	mss := uint32(sk.mss)
	switch sk.caState {
	case caOpen:
		if sk.needRexmit() {
			s.enterRecoveryLocked(sk, delivered)
		} else if advanced {
			s.ccAckLocked(sk, delivered, now)
		}
	case caRecovery:
		if sk.recover.LessThanEq(sk.sndUna) {
			// Everything outstanding when the loss was found is
			// acknowledged (RFC 6582 3.2, step 3; RFC 6937: cwnd =
			// ssthresh on exit).
			sk.caState = caOpen
			sk.cwnd = max(sk.ssthresh, 2*mss)
			sk.tflags &^= tfUndo
		} else {
			s.prrLocked(sk, delivered)
		}
	case caLoss:
		if sk.recover.LessThanEq(sk.sndUna) {
			sk.caState = caOpen
			sk.tflags &^= tfUndo
		}
		if advanced {
			s.ccAckLocked(sk, delivered, now)
		}
	}
	switch {
	case sk.sndUna == sk.sndMax:
		if sk.tflags&tfWindowProbe == 0 {
			s.stopRTOLocked(sk)
		}
	case wait > 0:
		s.armReorderLocked(sk, wait)
	case advanced:
		s.armRTOLocked(sk, true)
	}
}

// enterRecoveryLocked starts fast recovery (RFC 6675 5, RFC 6937) on an
// event that showed delivered bytes delivered, and sets the window for
// its first sends.
func (s *Stack) enterRecoveryLocked(sk *sock, delivered uint32) {
	s.img.hdr.counters.TCPFastRetrans++
	s.saveUndoLocked(sk)
	sk.ssthresh = s.ccSsthreshLocked(sk)
	sk.recover = sk.sndMax
	sk.caState = caRecovery
	sk.prrDelivered, sk.prrOut = 0, 0
	sk.recoverFS = max(uint32(sk.sndUna.Size(sk.sndMax)), 1)
	s.prrLocked(sk, delivered)
}

// saveUndoLocked remembers the window before a reduction, to restore it if
// the reduction proves spurious.
func (s *Stack) saveUndoLocked(sk *sock) {
	sk.priorCwnd, sk.priorSsthresh = sk.cwnd, sk.ssthresh
	sk.undoTS = s.tsNow()
	sk.undoRetrans = 0
	sk.tflags |= tfUndo
}

// prrLocked sets the congestion window for the next sends of a recovery
// (RFC 6937 3, with the slow-start reduction bound).
func (s *Stack) prrLocked(sk *sock, delivered uint32) {
	mss := int64(sk.mss)
	sk.prrDelivered += delivered
	pipe := int64(sk.flight())
	ssthresh := int64(sk.ssthresh)
	var sndcnt int64
	if pipe > ssthresh {
		sndcnt = (int64(sk.prrDelivered)*ssthresh+int64(sk.recoverFS)-1)/int64(sk.recoverFS) - int64(sk.prrOut)
	} else {
		limit := max(int64(sk.prrDelivered)-int64(sk.prrOut), int64(delivered)) + mss
		sndcnt = min(ssthresh-pipe, limit)
	}
	if sk.prrOut == 0 {
		sndcnt = max(sndcnt, mss) // the first retransmission goes at once
	}
	sk.cwnd = uint32(pipe + max(sndcnt, 0))
}

// undoLocked restores the window a spurious recovery or timeout took away
// (RFC 3522 and RFC 2883's use), and lets the frames marked lost but not
// yet resent count as in flight again.
func (s *Stack) undoLocked(sk *sock) {
	s.img.hdr.counters.TCPUndos++
	sk.cwnd = max(sk.cwnd, sk.priorCwnd)
	sk.ssthresh = max(sk.ssthresh, sk.priorSsthresh)
	sk.tflags &^= tfUndo
	sk.tflags |= tfReordered
	sk.reoMult = min(sk.reoMult+1, 16)
	sk.caState = caOpen
	for f := range s.sentFrames(sk) {
		if !sk.needRexmit() {
			break
		}
		if fl := f.Aux(auxFlags); fl&(afLost|afRexmit) == afLost {
			s.unmarkLostLocked(sk, f, fl)
		}
	}
}

// timeoutLocked is a retransmission timeout's effect on the scoreboard and
// the window (RFC 5681 3.1, RFC 6298 5.5-5.6, RFC 6675 5.1): every
// segment not SACKed is taken for lost, and the window restarts from one
// segment. The first timeout of an episode sets ssthresh; later ones
// (backoff) keep it.
func (s *Stack) timeoutLocked(sk *sock) {
	if sk.caState != caLoss {
		if sk.caState == caOpen {
			s.saveUndoLocked(sk)
		}
		sk.ssthresh = s.ccSsthreshLocked(sk)
	}
	sk.caState = caLoss
	sk.recover = sk.sndMax
	sk.cwnd = uint32(sk.mss)
	sk.dupAck = 0
	sk.tflags &^= tfTLPOut
	sk.tlpCount = 0
	p := s.pool
	// A SACKed frame at the head means the peer reneged: it dropped data
	// it had SACKed (RFC 2018 8 allows it; we do it ourselves when frames
	// run short). Its SACK marks are worthless then: forget them all, so
	// that everything goes again (RFC 6675 5.1).
	reneged := false
	if f, ok := p.Frame(sk.sndHead); ok && sk.sndHead != sk.sndUnsent && f.Aux(auxFlags)&afSacked != 0 {
		reneged = true
		sk.sackedBytes = 0
		sk.highSacked = sk.sndUna
	}
	for f := range s.sentFrames(sk) {
		if reneged {
			f.SetAux(auxFlags, f.Aux(auxFlags)&^afSacked)
		}
		s.markLostLocked(sk, f)
	}
	if sk.tflags&tfFinSent != 0 && sk.sndUna != sk.sndMax {
		sk.tflags |= tfFinLost
	}
}

// retransmitLostLocked sends again the frames marked lost, oldest first,
// as far as the congestion window allows (RFC 6675 NextSeg, rule 1).
func (s *Stack) retransmitLostLocked(sk *sock) {
	flight := sk.flight()
	for f := range s.sentFrames(sk) {
		if !sk.needRexmit() {
			return
		}
		if f.Aux(auxFlags)&(afLost|afRexmit|afSacked) == afLost {
			n := f.Aux(auxLen)
			if flight+n > sk.cwnd && flight > 0 {
				sk.cwndLimited = true
				return
			}
			s.transmitSegLocked(sk, f, seqnum.Value(f.Aux(auxSeq)), int(n), 0)
			f.SetAux(auxFlags, f.Aux(auxFlags)|afRexmit)
			sk.rexmitBytes += n
			flight += n
			if sk.caState == caRecovery {
				sk.prrOut += n
			}
			if sk.tflags&tfUndo != 0 {
				sk.undoRetrans++
			}
			s.armRTOLocked(sk, false)
		}
	}
}
