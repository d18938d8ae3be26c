package stack

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// RACK-TLP (RFC 8985): a segment is lost when a segment sent after it has
// been delivered and more than an RTT plus a reordering window has passed
// since it was sent; a tail loss probe, sent when the ACKs stop before the
// data does, makes the receiver say what it lacks.

// rackUpdateLocked takes a newly delivered frame, sent at xmit (µs) and
// ending at end, into RACK's state (RFC 8985 6.2, step 2).
func (s *Stack) rackUpdateLocked(sk *sock, xmit uint32, end seqnum.Value, retrans bool, now uint32) {
	rtt := now - xmit
	if int32(rtt) < 0 {
		return
	}
	if retrans && sk.minRTT != 0 && rtt < sk.minRTT {
		return // likely the ACK of the original transmission, not of this one
	}
	first := sk.rackRTT == 0
	sk.rackRTT = max(rtt, 1)
	if sk.minRTT == 0 || rtt < sk.minRTT {
		sk.minRTT = max(rtt, 1)
	}
	if first || int32(xmit-sk.rackXmit) > 0 || xmit == sk.rackXmit && sk.rackEnd.LessThan(end) {
		sk.rackXmit, sk.rackEnd = xmit, end
	}
}

// reoWnd is RACK's reordering window in µs (RFC 8985 6.2, step 4): none
// while no reordering has been seen and loss is evident (in recovery, or
// three segments' worth SACKed above a hole: the duplicate-ACK rule),
// else a quarter of the minimum RTT per step of reoMult, at most SRTT.
func (sk *sock) reoWnd() uint32 {
	if sk.tflags&tfReordered == 0 && (sk.caState != caOpen || sk.sackedBytes >= 3*uint32(sk.mss)) {
		return 0
	}
	return min(sk.minRTT/4*uint32(max(sk.reoMult, 1)), sk.srtt)
}

// rackDetectLossLocked marks lost every frame sent before the most
// recently sent delivered one and outstanding longer than RTT plus the
// reordering window (RFC 8985 6.2, step 5). It returns how long until the
// next frame would qualify (0: none waits), for the reordering timer.
func (s *Stack) rackDetectLossLocked(sk *sock, now uint32) (wait uint32) {
	if sk.rackRTT == 0 {
		return 0
	}
	c := &s.img.hdr.counters
	reo := sk.reoWnd()
	for f := range s.sentFrames(sk) {
		fl := f.Aux(auxFlags)
		if fl&afSacked != 0 || fl&(afLost|afRexmit) == afLost {
			continue
		}
		xmit := f.Aux(auxTime)
		end := seqnum.Value(f.Aux(auxSeq)).Add(seqnum.Size(f.Aux(auxLen)))
		if !(int32(sk.rackXmit-xmit) > 0 || xmit == sk.rackXmit && end.LessThan(sk.rackEnd)) {
			continue // sent after the latest delivered frame: no evidence yet
		}
		if elapsed := now - xmit; elapsed >= sk.rackRTT+reo {
			s.markLostLocked(sk, f)
			c.TCPRackLost++
		} else {
			wait = max(wait, sk.rackRTT+reo-elapsed)
		}
	}
	return wait
}

// armReorderLocked arms the RTO slot as RACK's reordering timer (RFC 8985
// 6.3), wait µs from now.
func (s *Stack) armReorderLocked(sk *sock, wait uint32) {
	sk.tflags &^= tfWindowProbe
	sk.timerMode = tmReorder
	s.setLazyLocked(sk, timerRTO, &sk.rtoAt, s.nowTick()+s.ticks(time.Duration(wait)*time.Microsecond)+1)
}

// Tail loss probes (RFC 8985 7).
//
// With one segment in flight the peer may be holding its ACK on its
// delayed-ACK timer, and the probe allows for it (RFC 8985 7.2's
// WCDelAckT). RFC 8985 recommends 200ms, and Linux adds its minimum RTO,
// so that the probe comes at the RTO's time. We allow 40ms (tlpDelAckWait),
// the delayed-ACK timeout Linux and our stack start with, until a probe
// of one segment proves needless: the peer's D-SACK (RFC 2883) says the
// segment had arrived, so the peer delays longer (Linux doubles its
// timeout, up to 200ms, each time it fires between an interactive
// exchange's requests). The connection then allows the 200ms
// (tlpDelAckWaitLong) from then on. Waiting 200ms from the start would
// cost every lost lone segment five times as long to repair: a bulk
// sender at 5% loss, whose window falls to a segment or two, moved 34
// Mbit/s against 49 with 40ms.
//
// With more in flight, 2·SRTT is the timeout, at least 2ms (tlpMinPTO) on
// a path of tens of µs. A peer whose process is starved of its CPU is
// slower than that to ACK a reply its next request would carry the ACK
// of (memcslap's eight threads on two CPUs beside memcached: 833 needless
// probes in 160,000 gets, one in 190). A needless probe of several
// segments raises that connection's floor to 10ms (tlpMinPTOSlow, Linux's
// floor before it became two ticks, 8ms at 250 Hz).
const (
	tlpMinPTO         = 2 * time.Millisecond // a floor under 2·SRTT on short paths
	tlpMinPTOSlow     = 10 * time.Millisecond
	tlpDelAckWait     = 40 * time.Millisecond
	tlpDelAckWaitLong = 200 * time.Millisecond
)

// tlpEligible reports whether the next retransmission timer should be a
// probe timeout instead (RFC 8985 7.2): data in flight, SACK on (the
// probe's ACK must say what is missing), no timeout recovery under way
// and no probe already out. Unlike RFC 8985 and Linux, we also probe in
// fast recovery: Linux receivers compress their ACKs (one for many
// segments), and when the one ACK of a recovery's last flight is lost,
// only a probe gets the recovery going again before the RTO. For the
// same reason a second probe may follow the first (at twice the timeout)
// before the RTO: a probe or its ACK lost costs an RTO otherwise, and on
// a path whose RTT is a thousandth of the 200ms minimum RTO that is the
// difference between a stall and a hiccup.
const tlpMaxProbes = 2

func (sk *sock) tlpEligible() bool {
	return sk.tflags&(tfSackOK|tfWindowProbe) == tfSackOK && sk.tlpCount < tlpMaxProbes && sk.caState != caLoss &&
		sk.srtt != 0 && sk.state == tcpEstablished && sk.sndUna != sk.sndMax
}

// oneSegmentOut reports whether at most one segment is in flight, the
// case in which the peer may hold its ACK on its delayed-ACK timer.
func (sk *sock) oneSegmentOut() bool {
	return uint32(sk.sndUna.Size(sk.sndMax)) <= uint32(sk.mss)
}

// ptoLocked is the probe timeout in µs (RFC 8985 7.2): 2·SRTT, more when
// one segment is out (the peer may delay its ACK; above), never past the
// RTO.
func (s *Stack) ptoLocked(sk *sock) uint32 {
	pto := 2 * sk.srtt
	if sk.oneSegmentOut() {
		wait := tlpDelAckWait
		if sk.tflags&tfPeerDelAck != 0 {
			wait = tlpDelAckWaitLong
		}
		pto = max(pto, sk.srtt*3/2+uint32(wait/time.Microsecond))
	}
	floor := tlpMinPTO
	if sk.tflags&tfPeerSlow != 0 {
		floor = tlpMinPTOSlow
	}
	pto = max(pto, uint32(floor/time.Microsecond))
	pto <<= sk.tlpCount
	return min(pto, s.rtoNow(sk))
}

// tlpFireLocked sends the probe (RFC 8985 7.3): a new segment if the
// windows allow one, else the last segment sent again. The RTO follows.
func (s *Stack) tlpFireLocked(sk *sock) {
	p := s.pool
	sk.tflags |= tfTLPOut
	sk.tlpProbe = 0
	sk.tlpCount++
	s.img.hdr.counters.TCPTLPs++
	if h := sk.sndUnsent; h != vnic.Null {
		if f, ok := p.Frame(h); ok {
			seq := seqnum.Value(f.Aux(auxSeq))
			n := int(f.Aux(auxLen))
			end := seq.Add(seqnum.Size(n))
			if end.LessThanEq(sk.sndUna.Add(seqnum.Size(sk.sndWnd))) {
				s.transmitSegLocked(sk, f, seq, n, 0)
				sk.sndUnsent = f.Next()
				sk.sndNxt, sk.sndMax = end, end
				s.armRTOLocked(sk, true)
				return
			}
		}
	}
	var last vnic.Frame
	found := false
	for f := range s.sentFrames(sk) {
		last, found = f, true
	}
	if found && last.Aux(auxFlags)&afSacked == 0 {
		sk.tlpProbe, sk.tlpHigh = tlpSeveral, sk.sndMax
		if sk.oneSegmentOut() {
			sk.tlpProbe = tlpLone
		}
		s.transmitSegLocked(sk, last, seqnum.Value(last.Aux(auxSeq)), int(last.Aux(auxLen)), 0)
	} else if sk.tflags&tfFinSent != 0 && sk.sndUna != sk.sndMax {
		s.resendFinLocked(sk)
	}
	s.armRTOLocked(sk, true)
}

// What the last probe sent again (tlpProbe).
const (
	tlpLone    = 1 // the one segment in flight
	tlpSeveral = 2 // the last of several
)

// tlpVerdictLocked judges the last probe that sent a segment again from an
// ACK up to ack (RFC 8985 7.4): a D-SACK in an ACK that does not go past
// the probe says that the peer had the segment, and that it was slower to
// acknowledge it than the probe allowed; the peer gets longer from then
// on (above). Its ACK may come after the ACK of the original, as the copy
// arrived after it. An ACK past the probe ends the wait for a verdict.
func (s *Stack) tlpVerdictLocked(sk *sock, ack seqnum.Value, dsack bool) {
	switch {
	case dsack && ack.LessThanEq(sk.tlpHigh):
		if sk.tlpProbe == tlpLone {
			sk.tflags |= tfPeerDelAck
		} else {
			sk.tflags |= tfPeerSlow
		}
		s.img.hdr.counters.TCPTLPSpurious++
		sk.tlpProbe = 0
	case sk.tlpHigh.LessThan(ack):
		sk.tlpProbe = 0
	}
}
