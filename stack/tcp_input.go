package stack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// segment is an arriving TCP segment's header, decoded.
type segment struct {
	sport, dport uint16
	seq, ack     seqnum.Value
	flags        uint8
	wnd          uint16
	n            int // payload bytes
	opts         tcpOpts
}

// len is the sequence space the segment occupies (RFC 9293 3.4).
func (g *segment) len() seqnum.Size {
	l := seqnum.Size(g.n)
	if g.flags&flagSYN != 0 {
		l++
	}
	if g.flags&flagFIN != 0 {
		l++
	}
	return l
}

// tcpInputLocked takes a TCP segment off the wire (RFC 9293 3.10.7): it
// checks the header and checksum, finds the connection or listener, and
// hands the segment on. The frame ends up in a receive queue or freed.
func (s *Stack) tcpInputLocked(h vnic.Handle, p *ipPacket) {
	c := &s.img.hdr.counters
	t := p.l4
	if len(t) < 20 {
		c.RxTCPBadHeader++
		s.pool.Free(h)
		return
	}
	doff := int(t[12]>>4) * 4
	if doff < 20 || doff > len(t) {
		c.RxTCPBadHeader++
		s.pool.Free(h)
		return
	}
	if checksum.Checksum(t, pseudoSum(p.src, p.dst, 6, len(t))) != 0xffff {
		c.RxTCPBadChecksum++
		s.badChecksumLocked()
		s.pool.Free(h)
		return
	}
	g := segment{
		sport: binary.BigEndian.Uint16(t[0:]), dport: binary.BigEndian.Uint16(t[2:]),
		seq: seqnum.Value(binary.BigEndian.Uint32(t[4:])), ack: seqnum.Value(binary.BigEndian.Uint32(t[8:])),
		flags: t[13] & 0x3f, wnd: binary.BigEndian.Uint16(t[14:]), n: len(t) - doff,
	}
	g.opts = parseOptions(t[20:doff], g.flags&flagSYN != 0)
	sk := s.findLocked(kindTCP, p.dst, g.dport, p.src, g.sport)
	if sk != nil && sk.state == tcpClosed {
		// A connection that ended while the user holds its socket stays in
		// the table until the close, but is no connection, as Linux's
		// ended socket leaves the hash: a listener on the port takes a new
		// SYN on the four-tuple (a child goes in ahead of it), the rest is
		// answered with a reset, and a reset of the peer's (for our last
		// ACK, say) is no news that the user should read as ECONNRESET.
		sk = nil
	}
	if sk == nil {
		var zero [4]byte
		l := s.findLocked(kindTCP, p.dst, g.dport, zero, 0)
		if l == nil {
			l = s.findLocked(kindTCP, zero, g.dport, zero, 0)
		}
		if l != nil && l.state == tcpListen {
			s.listenInputLocked(l, h, p, &g)
			return
		}
		c.RxTCPNoSocket++
		s.resetReplyLocked(s.pool.Data(h), p, g.sport, g.dport, g.seq, g.ack, g.flags, int(g.len()))
		s.pool.Free(h)
		return
	}
	if sk.state == tcpHandedOver {
		s.handoverHoldLocked(sk, h, &g, p.l4off+doff, p.l4off+len(p.l4))
		return
	}
	p.frame.Trim(p.l4off+doff, g.n)
	c.RxTCP++
	sk.lastRcv = uint32(s.nowTick())
	s.inOrder = false
	if sk.state == tcpSynSent {
		s.synSentInputLocked(sk, h, &g)
	} else {
		s.segmentLocked(sk, h, &g)
	}
	if sk.kind == kindTCP && sk.state != tcpClosed {
		if s.batch != nil && s.inOrder {
			s.deferOutputLocked(sk)
		} else {
			s.tcpOutputLocked(sk)
		}
	}
	if sk.kind != kindFree {
		s.touchLocked(sk)
	}
}

// synSentInputLocked is RFC 9293 3.10.7.3: a segment for our SYN.
func (s *Stack) synSentInputLocked(sk *sock, h vnic.Handle, g *segment) {
	defer s.pool.Free(h)
	if g.flags&flagACK != 0 && (g.ack.LessThanEq(sk.iss) || sk.sndMax.LessThan(g.ack)) {
		if g.flags&flagRST == 0 {
			s.controlLocked(sk, flagRST, g.ack)
			// The ACK of an old connection on this four-tuple: the peer's
			// TIME-WAIT meets a SYN below its sequence space so (RFC 9293
			// 3.10.7.4), as it does one from another stack on this host
			// (the kernel's, or a stack of another process: each numbers
			// its connections on its own), whose port the kernel handed
			// out again. Our reset ends that connection (Linux's, unless
			// tcp_rfc1337), so our SYN again at once opens this one,
			// where the retransmission timer would wait a second. Once a
			// connection: a peer that answered each SYN so would
			// otherwise have them at its own pace.
			if sk.tflags&tfSynAgain == 0 {
				sk.tflags |= tfSynAgain
				sk.synTime = s.micros()
				s.controlLocked(sk, flagSYN, sk.iss)
			}
		}
		return
	}
	if g.flags&flagRST != 0 {
		if g.flags&flagACK != 0 {
			s.img.hdr.counters.RxTCPResets++
			s.tcpFailLocked(sk, errConnRefused)
		}
		return
	}
	if g.flags&flagSYN == 0 {
		return
	}
	sk.irs = g.seq
	sk.rcvNxt = g.seq.Add(1)
	sk.rcvAdv = sk.rcvNxt
	s.negotiateLocked(sk, &g.opts)
	if g.flags&flagACK != 0 {
		s.ackedSynLocked(sk, g)
		sk.tflags |= tfAckNow
		return
	}
	// Simultaneous open (RFC 9293 3.5, figure 8).
	sk.state = tcpSynReceived
	s.controlLocked(sk, flagSYN|flagACK, sk.iss)
	s.armRTOLocked(sk, true)
}

// ackedSynLocked completes the handshake: our SYN is acknowledged.
func (s *Stack) ackedSynLocked(sk *sock, g *segment) {
	if sk.retries == 0 && sk.synTime != 0 {
		s.rttSampleLocked(sk, s.micros()-sk.synTime) // the SYN was sent once: an honest sample
	}
	sk.sndUna = g.ack
	sk.sndWnd = uint32(g.wnd) // never scaled in a SYN (RFC 7323 2.2)
	if g.flags&flagSYN == 0 {
		sk.sndWnd = uint32(g.wnd) << sk.sndWS
	}
	sk.sndWl1, sk.sndWl2 = g.seq, g.ack
	sk.state = tcpEstablished
	sk.retries, sk.backoff = 0, 0
	s.stopRTOLocked(sk)
	s.img.hdr.counters.TCPEstablished++
	s.armKeepaliveLocked(sk)
}

// negotiateLocked settles the options both sides offered in the SYNs.
func (s *Stack) negotiateLocked(sk *sock, o *tcpOpts) {
	peerMSS := o.mss
	if peerMSS == 0 {
		peerMSS = 536 // RFC 9293 3.7.1
	}
	sk.peerMSS = peerMSS
	if o.ws >= 0 {
		sk.tflags |= tfWSOK
		sk.sndWS = uint8(o.ws)
	} else {
		sk.tflags &^= tfWSOK
		sk.sndWS, sk.rcvWS = 0, 0
	}
	if o.sackOK {
		sk.tflags |= tfSackOK
	} else {
		sk.tflags &^= tfSackOK
	}
	if o.ts {
		sk.tflags |= tfTSOK
		sk.tsRecent = o.tsVal
	} else {
		sk.tflags &^= tfTSOK
	}
	// The MSS counts payload after a bare header (RFC 6691): every segment
	// carries the timestamp, so it comes off the payload.
	mss := min(peerMSS, s.advMSS())
	if sk.tflags&tfTSOK != 0 {
		mss -= 12
	}
	sk.mss = max(mss, 64)
	sk.cwnd = initialCwnd * uint32(sk.mss)
	sk.ssthresh = ^uint32(0)
}

// segmentLocked is RFC 9293 3.10.7.4: a segment for a synchronized
// connection (or one in SYN-RECEIVED).
func (s *Stack) segmentLocked(sk *sock, h vnic.Handle, g *segment) {
	if !s.segmentKeepsLocked(sk, h, g) {
		s.pool.Free(h)
	}
}

// segmentKeepsLocked does segmentLocked's work and reports whether a queue
// kept the frame.
func (s *Stack) segmentKeepsLocked(sk *sock, h vnic.Handle, g *segment) (keep bool) {
	if sk.state == tcpEstablished && g.flags&(flagSYN|flagFIN|flagRST|flagACK) == flagACK && g.seq == sk.rcvNxt {
		if keep, ok := s.predictedLocked(sk, h, g); ok {
			return keep
		}
	}
	c := &s.img.hdr.counters

	// First, check the sequence number.
	wnd := seqnum.Size(0)
	if sk.rcvNxt.LessThan(sk.rcvAdv) {
		wnd = sk.rcvNxt.Size(sk.rcvAdv)
	}
	// PAWS (RFC 7323 5.3): a segment with an older timestamp is a
	// duplicate from an earlier life of the sequence space.
	if sk.tflags&tfTSOK != 0 && g.opts.ts && g.flags&flagRST == 0 && int32(g.opts.tsVal-sk.tsRecent) < 0 {
		c.RxTCPPAWS++
		sk.tflags |= tfAckNow
		return
	}
	if !acceptable(g.seq, g.len(), sk.rcvNxt, wnd) {
		c.RxTCPOutOfWindow++
		if g.flags&flagRST == 0 {
			sk.tflags |= tfAckNow
			if g.seq.Add(seqnum.Size(g.n)).LessThanEq(sk.rcvNxt) {
				noteDSack(sk, g.seq, g.n)
			}
		}
		if s.oldAckLocked(sk, g, wnd) {
			// RFC 9293 3.10.7.4: "special allowance should be made to
			// accept valid ACKs". Without it, two peers whose windows
			// closed while each waits for the other's acknowledgement
			// deadlock: each drops the other's segments, ACKs and all.
			s.ackLocked(sk, g)
			return
		}
		if sk.state == tcpTimeWait && g.flags&flagFIN != 0 {
			s.enterTimeWaitLocked(sk) // a retransmitted FIN restarts 2MSL
		}
		return
	}
	if g.opts.ts && sk.tflags&tfTSOK != 0 && g.seq.LessThanEq(sk.rcvNxt) {
		sk.tsRecent = g.opts.tsVal // RFC 7323 4.3
	}

	// Second, the RST bit (RFC 5961 3: only an exact match resets; one
	// merely in the window draws a challenge ACK).
	if g.flags&flagRST != 0 {
		if g.seq != sk.rcvNxt {
			s.challengeAckLocked(sk)
			return
		}
		c.RxTCPResets++
		switch sk.state {
		case tcpSynReceived:
			if sk.tflags&tfPassive != 0 {
				s.tcpCloseFinalLocked(sk) // back to LISTEN: drop the child
				return
			}
			s.tcpFailLocked(sk, errConnRefused)
		case tcpClosing, tcpLastAck, tcpTimeWait:
			s.tcpCloseFinalLocked(sk)
		case tcpCloseWait:
			s.tcpFailLocked(sk, errPipe) // as Linux's tcp_reset: the stream has ended in order
		default:
			s.tcpFailLocked(sk, errConnReset)
		}
		return
	}

	// Fourth, a SYN in a synchronized state (RFC 5961 4): challenge ACK.
	if g.flags&flagSYN != 0 {
		if sk.state == tcpSynReceived && g.seq == sk.irs {
			s.controlLocked(sk, flagSYN|flagACK, sk.iss) // their SYN again
			sk.synTime = 0                               // sent twice: no honest sample (Karn)
			return
		}
		s.challengeAckLocked(sk)
		return
	}

	// Fifth, the ACK field.
	if g.flags&flagACK == 0 {
		return
	}
	if sk.state == tcpSynReceived {
		if !sk.sndUna.LessThan(g.ack) || sk.sndMax.LessThan(g.ack) {
			s.controlLocked(sk, flagRST, g.ack)
			return
		}
		if sk.deferAccept != 0 && g.n == 0 && g.flags&flagFIN == 0 && int32(sk.deferAccept-s.tsNow()) > 0 {
			// TCP_DEFER_ACCEPT, as Linux has it: a bare ACK leaves the
			// connection unaccepted until data comes; once the wait is
			// over, the ACK our SYN-ACK's retransmission draws ends it.
			return
		}
		sk.deferAccept = 0 // a connection's reads as 0, as on Linux
		s.ackedSynLocked(sk, g)
		sk.sndWnd = uint32(g.wnd) << sk.sndWS
		if sk.tflags&tfPassive != 0 {
			s.establishedChildLocked(sk)
			if sk.kind != kindTCP {
				return
			}
		}
	}
	if !s.ackLocked(sk, g) {
		return
	}
	if sk.kind != kindTCP || sk.state == tcpClosed {
		return
	}

	// Seventh, the segment text.
	if g.n > 0 {
		switch sk.state {
		case tcpEstablished, tcpFinWait1, tcpFinWait2:
			if sk.userClosed() {
				// Data for a socket the user closed: nobody will read it
				// (RFC 2525 2.17).
				s.controlLocked(sk, flagRST, sk.sndNxt)
				s.tcpCloseFinalLocked(sk)
				return
			}
			keep = s.dataLocked(sk, h, g)
		default:
			// After the peer's FIN: nothing more can arrive in sequence.
		}
	}

	// Eighth, the FIN bit.
	if g.flags&flagFIN != 0 {
		if g.seq.Add(seqnum.Size(g.n)) == sk.rcvNxt {
			s.finLocked(sk)
		} else if !keep && sk.rcvNxt.LessThan(g.seq) && g.n == 0 && sk.rcvFits(sk.rcvBytes+sk.oooBytes, sk.rcvFrames+sk.oooFrames+1) {
			// A FIN ahead of rcvNxt waits in its own frame, charged as
			// data's are.
			keep = s.oooInsertLocked(sk, h, g.seq, 0, true)
		}
	}
	return keep
}

// challengeAckLimit is how many challenge ACKs the stack sends per second
// (RFC 5961 7; Linux's tcp_challenge_ack_limit was 1000): a blind
// attacker cannot make us flood the peer, nor learn from our ACK rate.
const challengeAckLimit = 1000

// challengeAckLocked answers an in-window RST or a SYN on a synchronized
// connection with an ACK of where we are (RFC 5961 3.2, 4.2): the real
// peer, if it did reset, answers that with an exact RST; a blind attacker
// learns nothing.
func (s *Stack) challengeAckLocked(sk *sock) {
	h := s.img.hdr
	if sec := uint32(s.tsNow() / 1000); sec != h.challengeSec {
		h.challengeSec, h.challengeCount = sec, 0
	}
	if h.challengeCount >= challengeAckLimit {
		h.counters.TCPChallengeAcksLimited++
		return
	}
	h.challengeCount++
	h.counters.TCPChallengeAcks++
	sk.tflags |= tfAckNow
}

// oldAckLocked reports whether an unacceptable segment still carries an
// acknowledgement worth taking: it acknowledges data not yet acknowledged,
// and it starts no later than the window's right edge and no earlier than
// a receive buffer before rcvNxt (the segments a sender that went back to
// retransmit, or a window that closed, would send; Linux takes the same,
// from rcv_wup to the right edge). Blind ACKs must still guess the
// sequence number within that range and an acknowledgement in flight.
func (s *Stack) oldAckLocked(sk *sock, g *segment, wnd seqnum.Size) bool {
	if g.flags&(flagACK|flagRST|flagSYN) != flagACK || !synchronized(sk.state) {
		return false
	}
	if !sk.sndUna.LessThan(g.ack) || sk.sndMax.LessThan(g.ack) {
		return false
	}
	lo := sk.rcvNxt.Add(seqnum.Size(-int32(sk.rcvBuf)))
	return g.seq.InWindow(lo, seqnum.Size(sk.rcvBuf)+wnd+1)
}

// acceptable is the segment acceptance test of RFC 9293 3.10.7.4, with
// one leniency taken from Linux (tcp_sequence): an empty segment may sit
// at the right edge of the window. A peer whose data runs past the window
// it was last offered sends its pure ACKs at that edge (RFC 9293 3.8.6.2
// forbids a sequence number beyond it; Linux's tcp_acceptable_seq, and
// ours, send exactly the edge). Rejecting them loses their window
// updates, and two peers each waiting for the other's window deadlock.
func acceptable(seq seqnum.Value, segLen seqnum.Size, rcvNxt seqnum.Value, wnd seqnum.Size) bool {
	if segLen == 0 {
		return seq.InWindow(rcvNxt, wnd+1)
	}
	if wnd == 0 {
		return false
	}
	return seq.InWindow(rcvNxt, wnd) || seq.Add(segLen-1).InWindow(rcvNxt, wnd)
}

// ackLocked processes the acknowledgement and window of a segment (RFC
// 9293 3.10.7.4, fifth): frees acknowledged frames, samples the RTT,
// grows the congestion window, detects duplicate ACKs and moves the closing
// states along. It returns false if the segment is to be dropped.
func (s *Stack) ackLocked(sk *sock, g *segment) bool {
	c := &s.img.hdr.counters
	if sk.sndMax.LessThan(g.ack) {
		c.RxTCPBadAck++
		sk.tflags |= tfAckNow
		return false
	}
	newWnd := uint32(g.wnd) << sk.sndWS
	advanced := sk.sndUna.LessThan(g.ack)
	now := s.micros()
	var delivered uint32
	dsack := false
	if sk.tflags&tfSackOK != 0 && g.opts.nsack > 0 && synchronized(sk.state) {
		delivered, dsack = s.sackLocked(sk, g, now)
	}
	if sk.tlpProbe != 0 {
		s.tlpVerdictLocked(sk, g.ack, dsack)
	}
	dup := false
	if advanced {
		delivered += s.ackedDataLocked(sk, g.ack, sk.sndUna.Size(g.ack), now)
		sk.dupAck = 0
	} else if g.ack == sk.sndUna && g.n == 0 && g.flags&(flagSYN|flagFIN) == 0 && newWnd == sk.sndWnd && sk.sndUna != sk.sndMax {
		// A duplicate ACK (RFC 5681 2). Without SACK, each one stands for
		// a segment that left the network (RFC 6937's DeliveredData).
		dup = true
		if sk.dupAck < 255 {
			sk.dupAck++
		}
		if sk.tflags&tfSackOK == 0 {
			delivered += uint32(sk.mss)
		}
	}
	if synchronized(sk.state) && (advanced || dup || delivered > 0 || dsack) {
		s.recoverLocked(sk, g, advanced, delivered, dsack, now)
	}
	// Window update (RFC 9293 3.10.7.4): only from a newer segment
	// (SND.WL1, SND.WL2). As Linux (tcp_may_update_window), a segment that
	// acknowledges new data is new enough whatever its sequence number: a
	// peer that went back to retransmit sends old sequence numbers, and
	// its windows must still count.
	if advanced || sk.sndWl1.LessThan(g.seq) || sk.sndWl1 == g.seq && sk.sndWl2.LessThanEq(g.ack) {
		opened := newWnd > sk.sndWnd
		sk.sndWnd, sk.sndWl1, sk.sndWl2 = newWnd, g.seq, g.ack
		if opened && sk.tflags&tfWindowProbe != 0 {
			s.stopRTOLocked(sk)
			sk.backoff = 0
		}
	}
	finAcked := sk.tflags&tfFinSent != 0 && g.ack == sk.sndMax
	switch sk.state {
	case tcpFinWait1:
		if finAcked {
			sk.state = tcpFinWait2
			if sk.tflags&tfOrphan != 0 {
				s.img.wheel.Set(s.sockTimer(sk, timerTW), s.nowTick()+s.ticks(finWait2Timeout))
			}
		}
	case tcpClosing:
		if finAcked {
			s.enterTimeWaitLocked(sk)
		}
	case tcpLastAck:
		if finAcked {
			s.tcpCloseFinalLocked(sk)
			return false
		}
	case tcpTimeWait:
		sk.tflags |= tfAckNow
		s.enterTimeWaitLocked(sk)
	}
	return true
}

// ackedDataLocked takes acked bytes off the send queue and returns how
// many of them it newly shows delivered (the rest a SACK block had shown).
func (s *Stack) ackedDataLocked(sk *sock, ack seqnum.Value, acked seqnum.Size, now uint32) (delivered uint32) {
	p := s.pool
	// Karn (RFC 6298 3): an ACK that covers a retransmitted segment gives
	// no sample, not even from the segments after it that were sent once:
	// their ACK waited for the hole to be filled.
	rtt, retrans := uint32(0), false
	dataAcked := uint32(acked)
	if sk.tflags&tfFinSent != 0 && ack == sk.sndMax {
		dataAcked-- // the FIN's sequence number is not data
	}
	for h := sk.sndHead; h != vnic.Null; {
		f, ok := p.Frame(h)
		if !ok {
			s.img.hdr.counters.ImageCorrupt++
			break
		}
		seq := seqnum.Value(f.Aux(auxSeq))
		l := f.Aux(auxLen)
		end := seq.Add(seqnum.Size(l))
		if ack.LessThan(end) {
			break
		}
		fl := f.Aux(auxFlags)
		if fl&afRetransmitted != 0 {
			retrans = true
		} else if rtt == 0 && fl&afSacked == 0 {
			if r := now - f.Aux(auxTime); r < 1<<31 {
				rtt = max(r, 1)
			}
		}
		if fl&afSacked == 0 {
			s.rackUpdateLocked(sk, f.Aux(auxTime), end, fl&afRetransmitted != 0, now)
		}
		delivered += sk.ackedFrame(l, fl)
		next := f.Next()
		if h == sk.sndUnsent {
			sk.sndUnsent = next
		}
		s.freeSendFrameLocked(h)
		sk.sndHead = next
		h = next
	}
	if sk.sndHead == vnic.Null {
		sk.sndTail = vnic.Null
		sk.clearScoreboard()
	}
	if rtt != 0 && !retrans {
		s.rttSampleLocked(sk, rtt)
		s.hystartLocked(sk, rtt)
	}
	sk.sndBytes -= min(sk.sndBytes, dataAcked)
	sk.sndUna = ack
	if sk.sndNxt.LessThan(ack) {
		sk.sndNxt = ack
	}
	if sk.tflags&tfFinSent != 0 && ack == sk.sndMax {
		sk.tflags &^= tfFinLost
	}
	sk.retries = 0
	sk.backoff = 0
	sk.progressAt = s.tsNow()
	sk.tflags &^= tfTLPOut
	sk.tlpCount = 0
	return delivered
}

// rcvCharge is what the receive queues cost against the receive buffer
// with bytes of data in frames: the bytes, but at least half a frame
// (minFrameCharge) a frame, as Linux charges a buffer's true size. A frame
// holds one segment however small, so a peer that sent tiny segments out
// of order took a frame each and could hold most of the pool within the
// window's bytes (FuzzInput: 318 frames for 1,592 bytes). Full segments
// cost their bytes, as before.
func rcvCharge(bytes, frames uint32) uint32 {
	return max(bytes, frames*minFrameCharge)
}

// rcvFits reports that receive queues of bytes in frames stay within the
// receive buffer and a quarter (the allowance for a segment that
// straddles the edge), at rcvCharge's cost. Every path that queues a
// received frame asks it: the general one (dataLocked, a FIN ahead) and
// the fast one (predictedLocked).
func (sk *sock) rcvFits(bytes, frames uint32) bool {
	return rcvCharge(bytes, frames) <= sk.rcvBuf+sk.rcvBuf/4
}

// minFrameCharge is the least a received frame costs (rcvCharge): half of
// a UMEM frame (vnic's 2 KiB).
const minFrameCharge = 1024

// noteDSack notes that n bytes from seq arrived again, for the D-SACK
// block of our next segment (RFC 2883 4.1.1): the sender learns that it
// sent them needlessly (a spurious retransmission or tail loss probe).
func noteDSack(sk *sock, seq seqnum.Value, n int) {
	if sk.tflags&tfSackOK != 0 && n > 0 {
		sk.dsackStart, sk.dsackEnd = seq, seq.Add(seqnum.Size(n))
		sk.tflags |= tfDSack
	}
}

// dataLocked takes the payload of a segment (RFC 9293 3.10.7.4,
// seventh): in order, it joins the receive queue and pulls in what waited
// out of order; ahead of rcvNxt, it waits in the out-of-order queue. It
// reports whether a queue kept the frame.
func (s *Stack) dataLocked(sk *sock, h vnic.Handle, g *segment) bool {
	c := &s.img.hdr.counters
	seq, n := g.seq, g.n
	// Trim what was already received.
	if seq.LessThan(sk.rcvNxt) {
		dup := int(seq.Size(sk.rcvNxt))
		if dup >= n {
			c.RxTCPDuplicate++
			noteDSack(sk, seq, n)
			sk.tflags |= tfAckNow
			return false
		}
		s.pool.Trim(h, dup, n-dup)
		seq, n = sk.rcvNxt, n-dup
	}
	// Trim what lies beyond the window.
	wnd := int(sk.rcvNxt.Size(sk.rcvAdv))
	if off := int(sk.rcvNxt.Size(seq)); off+n > wnd {
		if off >= wnd {
			sk.tflags |= tfAckNow
			return false
		}
		n = wnd - off
		s.pool.Trim(h, 0, n)
		g.flags &^= flagFIN
	}
	if !sk.rcvFits(sk.rcvBytes+sk.oooBytes+uint32(n), sk.rcvFrames+sk.oooFrames+1) {
		// Out-of-order data is speculative: give it up before refusing
		// the segment everyone waits for (as Linux prunes its queue).
		if seq == sk.rcvNxt && sk.rcvFits(sk.rcvBytes+uint32(n), sk.rcvFrames+1) {
			s.pruneOOOLocked(sk)
		} else {
			c.RxTCPBufferFull++
			sk.tflags |= tfAckNow
			return false
		}
	}
	if s.lowFramesLocked() {
		// Out-of-order data is speculative: refuse it, and give up what
		// this connection holds of it. Data in order is what moves things
		// on (it can be read, and its ACK frees the peer's frames): it
		// may use the reserve down to half.
		if sk.oooHead != vnic.Null {
			s.pruneOOOLocked(sk)
		}
		if seq != sk.rcvNxt || s.pool.Available() <= s.reserve/2 {
			c.RxLowFrames++
			return false
		}
	}
	if seq != sk.rcvNxt {
		c.RxTCPOutOfOrder++
		sk.tflags |= tfAckNow // a duplicate ACK tells the sender at once
		return s.oooInsertLocked(sk, h, seq, n, g.flags&flagFIN != 0)
	}
	s.enqueueRcvLocked(sk, h, n)
	sk.rcvNxt = sk.rcvNxt.Add(seqnum.Size(n))
	s.rcvAutotuneLocked(sk, g.opts.tsEcr) // 0 without timestamps
	if sk.oooHead != vnic.Null {
		s.oooDrainLocked(sk)
		sk.tflags |= tfAckNow
	}
	s.ackPolicyLocked(sk, n)
	return true
}

// ackPolicyLocked decides when to acknowledge in-order data (RFC 1122
// 4.2.3.2, RFC 9293 3.8.6.3): at once if two full segments wait
// unacknowledged, else on the delayed-ACK timer.
func (s *Stack) ackPolicyLocked(sk *sock, n int) {
	if sk.tflags&tfAckNow != 0 {
		return
	}
	if sk.tflags&tfDelAck != 0 || n >= 2*int(sk.mss) {
		sk.tflags |= tfAckNow
		return
	}
	s.delayAckLocked(sk)
}

// delayAckLocked owes the peer an ACK on the delayed-ACK timer.
func (s *Stack) delayAckLocked(sk *sock) {
	sk.tflags |= tfDelAck
	s.setLazyLocked(sk, timerDelAck, &sk.delAckAt, s.nowTick()+s.delAckTicks())
}

// finLocked processes the peer's FIN, in sequence (RFC 9293 3.10.7.4,
// eighth).
func (s *Stack) finLocked(sk *sock) {
	if sk.tflags&tfRcvFin != 0 {
		sk.tflags |= tfAckNow
		return
	}
	sk.rcvNxt = sk.rcvNxt.Add(1)
	sk.tflags |= tfRcvFin
	switch sk.state {
	case tcpSynReceived, tcpEstablished:
		sk.state = tcpCloseWait
		// The user will most likely close now that the stream has
		// ended: its FIN carries the ACK, one segment where an ACK at
		// once and then the FIN were two. Linux enters its ping-pong
		// mode here (tcp_fin), which delays the ACK so. An ACK this
		// segment owes for another reason goes as it would have.
		if sk.tflags&tfOrphan == 0 && sk.tflags&tfAckNow == 0 {
			s.delayAckLocked(sk)
			return
		}
	case tcpFinWait1:
		if sk.tflags&tfFinSent != 0 && sk.sndUna == sk.sndMax {
			s.enterTimeWaitLocked(sk)
		} else {
			sk.state = tcpClosing
		}
	case tcpFinWait2:
		s.enterTimeWaitLocked(sk)
	case tcpTimeWait:
		s.enterTimeWaitLocked(sk)
	}
	sk.tflags |= tfAckNow
}
