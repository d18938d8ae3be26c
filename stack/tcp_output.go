package stack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// TCP header flags.
const (
	flagFIN = 1 << 0
	flagSYN = 1 << 1
	flagRST = 1 << 2
	flagPSH = 1 << 3
	flagACK = 1 << 4
	flagURG = 1 << 5
)

// writeTCP writes a TCP header (20 bytes; options follow, written by the
// caller) at b.
func writeTCP(b []byte, sport, dport uint16, seq, ack seqnum.Value, flags uint8, hdrLen int, wnd uint16) {
	binary.BigEndian.PutUint16(b[0:], sport)
	binary.BigEndian.PutUint16(b[2:], dport)
	binary.BigEndian.PutUint32(b[4:], uint32(seq))
	binary.BigEndian.PutUint32(b[8:], uint32(ack))
	b[12] = byte(hdrLen/4) << 4
	b[13] = flags
	binary.BigEndian.PutUint16(b[14:], wnd)
	b[16], b[17], b[18], b[19] = 0, 0, 0, 0
}

// writeTCPTail writes the TCP header after the ports (the template wrote
// them).
func writeTCPTail(b []byte, seq, ack seqnum.Value, flags uint8, hdrLen int, wnd uint16) {
	_ = b[19]
	binary.BigEndian.PutUint32(b[4:], uint32(seq))
	binary.BigEndian.PutUint32(b[8:], uint32(ack))
	b[12] = byte(hdrLen/4) << 4
	b[13] = flags
	binary.BigEndian.PutUint16(b[14:], wnd)
	b[16], b[17], b[18], b[19] = 0, 0, 0, 0
}

// rcvWindowLocked is the window to advertise, and moves rcvAdv to its
// right edge. The window never shrinks (RFC 9293 3.8.6.2.1: the right
// edge never moves left) and, to avoid silly windows (3.8.6.2.2), a closed
// window opens only by at least min(MSS, half the buffer). It opens no
// further than the connection's share of the NIC's receive depth
// (tcp_rcvshare.go).
func (s *Stack) rcvWindowLocked(sk *sock, syn bool) uint16 {
	used := sk.rcvBytes + sk.oooBytes
	free := uint32(0)
	if sk.rcvBuf > used {
		free = sk.rcvBuf - used
	}
	if sk.tflags&tfShutRd != 0 && sk.state != tcpEstablished {
		free = 0
	}
	free = min(free, s.rcvShareLocked(sk))
	cur := uint32(0)
	if sk.rcvAdv.LessThan(sk.rcvNxt) {
		sk.rcvAdv = sk.rcvNxt
	} else {
		cur = uint32(sk.rcvNxt.Size(sk.rcvAdv))
	}
	wnd := free
	if wnd < cur {
		wnd = cur // never shrink
	} else if wnd-cur < min(uint32(sk.mss), sk.rcvBuf/2) && cur < min(uint32(sk.mss), sk.rcvBuf/2) {
		// Silly window: hold the window where it is until it can open
		// by a useful amount.
		wnd = cur
	}
	shift := sk.rcvWS
	if syn {
		shift = 0
	}
	field := wnd >> shift
	if field<<shift < cur && field < 0xffff {
		// The scaled field rounds down; rounded down, a window held
		// where it is would move its right edge left, and a peer that
		// sent up to the old edge would number its ACKs at the new one,
		// behind RCV.NXT, where we drop them with their window updates.
		// Round up instead, as Linux does (tcp_select_window).
		field++
	}
	if field > 0xffff {
		field = 0xffff
	}
	if edge := sk.rcvNxt.Add(seqnum.Size(field << shift)); sk.rcvAdv.LessThan(edge) {
		sk.rcvAdv = edge
	}
	return uint16(field)
}

// finishTCP writes the checksum of a TCP segment whose header (and options)
// are at t and whose payload sum is psum.
func (s *Stack) finishTCP(sk *sock, t []byte, hdrLen, payloadLen int, psum uint16) {
	if !sk.tmplValid {
		s.buildTemplateLocked(sk)
	}
	l4 := uint32(hdrLen + payloadLen)
	sum := fold(uint32(sk.phSum) + l4 + uint32(headerSum(t[:hdrLen])) + uint32(psum))
	binary.BigEndian.PutUint16(t[16:], ^sum)
}

// headerSum is the one's-complement sum of a TCP header (a multiple of 4
// bytes, at most 60), summed a 32-bit word at a time.
func headerSum(t []byte) uint16 {
	var sum uint64
	for len(t) >= 4 {
		sum += uint64(binary.BigEndian.Uint32(t))
		t = t[4:]
	}
	sum = sum>>32 + sum&0xffffffff
	sum = sum>>16 + sum&0xffff
	sum = sum>>16 + sum&0xffff
	return uint16(sum + sum>>16)
}

// controlLocked sends a segment without payload: SYN, SYN-ACK, FIN, RST or
// a pure ACK, from sk's state. It goes in a frame of its own, given to the
// NIC.
func (s *Stack) controlLocked(sk *sock, flags uint8, seq seqnum.Value) {
	h := s.pool.Alloc()
	if h == vnic.Null {
		s.img.hdr.counters.TxNoFrames++
		return
	}
	b := s.pool.Buf(h)
	t := b[ethLen+ipLen:]
	var optLen int
	if flags&flagSYN != 0 {
		optLen = s.synOptions(t[20:], sk, flags&flagACK != 0)
	} else if flags&flagRST == 0 {
		optLen = s.dataOptions(t[20:], sk, 40)
	}
	hdrLen := 20 + optLen
	var ack seqnum.Value
	if flags&flagACK != 0 {
		ack = sk.rcvNxt
	}
	var wnd uint16
	if flags&flagRST == 0 {
		adv := sk.rcvAdv
		wnd = s.rcvWindowLocked(sk, flags&flagSYN != 0)
		if synchronized(sk.state) && seq.LessThan(sk.sndUna) {
			// A probe (window or keepalive: an old sequence number) is
			// out of the peer's window: it draws an ACK, and its own
			// window is dropped with it. What it offers is not
			// advertised, or a window opened by reading meanwhile would
			// never be announced, and two peers whose windows closed
			// would wait for each other's persist timers.
			sk.rcvAdv = adv
		}
	}
	s.writeHeadersLocked(sk, b, hdrLen)
	writeTCPTail(t, seq, ack, flags, hdrLen, wnd)
	s.finishTCP(sk, t, hdrLen, 0, 0)
	s.pool.SetLen(h, ethLen+ipLen+hdrLen)
	if flags&flagACK != 0 {
		s.ackSentLocked(sk)
	}
	if flags&flagRST != 0 {
		s.img.hdr.counters.TxTCPResets++
	}
	s.sendFrameLocked(sk, h)
}

// sendFrameLocked queues a frame addressed to sk's peer, resolving the
// next hop first if it is not known yet (the frame then waits in the
// neighbour entry).
func (s *Stack) sendFrameLocked(sk *sock, h vnic.Handle) {
	if sk.flags&sfRemoteMAC != 0 {
		s.queueTxLocked(h)
		return
	}
	mac, e, err := s.nextHopLocked(sk.remoteAddr)
	switch err {
	case nil:
		sk.remoteMAC = mac
		sk.flags |= sfRemoteMAC
		sk.tmplValid = false
		copy(s.pool.Data(h)[0:6], mac[:])
		s.queueTxLocked(h)
	case errNeighPending:
		s.holdLocked(e, h)
	default:
		s.pool.Free(h)
	}
}

// routeLocked makes sure sk's next hop is known, for data segments
// (which cannot wait in a neighbour entry: they stay queued instead).
func (s *Stack) routeLocked(sk *sock) bool {
	if sk.flags&sfRemoteMAC != 0 {
		return true
	}
	mac, _, err := s.nextHopLocked(sk.remoteAddr)
	if err != nil {
		return false
	}
	sk.remoteMAC = mac
	sk.flags |= sfRemoteMAC
	sk.tmplValid = false
	return true
}

// ackSentLocked notes that the peer has been acknowledged up to rcvNxt.
func (s *Stack) ackSentLocked(sk *sock) {
	sk.tflags &^= tfAckNow | tfDelAck
	sk.flags &^= sfAckHeld
	sk.delAckAt = 0
}

// sendAckLocked sends a pure ACK now.
func (s *Stack) sendAckLocked(sk *sock) { s.controlLocked(sk, flagACK, sk.ackSeq()) }

// ackSeq is the sequence number of a pure ACK: SND.NXT, kept within the
// peer's window (Linux's tcp_acceptable_seq). An ACK numbered past the
// window's right edge fails the peer's acceptance test (RFC 9293
// 3.10.7.4) when its window is closed: the peer would drop every ACK we
// send, never learn its data arrived, and the two would wait for each
// other.
func (sk *sock) ackSeq() seqnum.Value {
	edge := sk.sndUna.Add(seqnum.Size(sk.sndWnd))
	if !synchronized(sk.state) || sk.sndNxt.LessThanEq(edge) {
		return sk.sndNxt
	}
	return edge
}

// transmitSegLocked sends the data segment held in send-queue frame f
// (seq, n payload bytes), a view the caller has just made. The headers are written in front of the payload
// in the frame itself and the frame is lent to the NIC, staying queued for
// retransmission; if the NIC still holds it from the last send, the
// segment is copied into a new frame instead.
func (s *Stack) transmitSegLocked(sk *sock, f vnic.Frame, seq seqnum.Value, n int, flags uint8) {
	p := s.pool
	h := f.Handle()
	if !s.routeLocked(sk) {
		return
	}
	buf := f.Buf()
	if n < 0 || n > len(buf)-txPayload {
		// The frame's length word (shared memory) is not one we wrote.
		s.img.hdr.counters.ImageCorrupt++
		return
	}
	payload := buf[txPayload : txPayload+n]
	room := 40
	if mss := s.mtu - ipLen - 20; n+room > mss {
		room = max(mss-n, 0)
	}
	// The options go straight in front of the payload when their length
	// is known beforehand (timestamps alone, or none: no SACK blocks to
	// send) and the frame is ours to write; else they are built aside and
	// copied.
	var opts [40]byte
	optLen := 0
	// A frame the NIC still holds, or queued already in this batch (sent,
	// then found lost within one poll), is copied, not written over.
	fl := f.Aux(auxFlags)
	busy := f.Busy() || fl&afQueued != 0
	inPlace := !busy && (sk.tflags&tfSackOK == 0 || sk.oooHead == vnic.Null && sk.tflags&tfDSack == 0)
	if inPlace {
		if sk.tflags&tfTSOK != 0 {
			optLen = tsOptLen
		}
		s.dataOptions(buf[txPayload-optLen:txPayload], sk, room)
	} else {
		optLen = s.dataOptions(opts[:], sk, room)
	}
	hdrLen := 20 + optLen
	start := txPayload - hdrLen - ethLen - ipLen
	flags |= flagACK
	if n > 0 && seq.Add(seqnum.Size(n)) == sk.sndSeqEnd() {
		flags |= flagPSH
	}
	wnd := s.rcvWindowLocked(sk, false)
	out := f
	if busy {
		// Still in the NIC's hands from the previous send: copy.
		oh := p.Alloc()
		if oh == vnic.Null {
			s.img.hdr.counters.TxNoFrames++
			return
		}
		out, _ = p.Frame(oh)
		buf = out.Buf()
		copy(buf[txPayload:], payload)
	}
	frame := buf[start : txPayload+n]
	s.writeHeadersLocked(sk, frame, hdrLen+n)
	t := frame[ethLen+ipLen:]
	writeTCPTail(t, seq, sk.rcvNxt, flags, hdrLen, wnd)
	if !inPlace {
		copy(t[20:], opts[:optLen])
	}
	// One pass over header and payload, which lie together in the frame:
	// summing them apart costs a second pass's setup on every segment, to
	// save the payload's sum on a retransmission, which is rare.
	l4 := hdrLen + n
	binary.BigEndian.PutUint16(t[16:], ^checksum.Checksum(t[:l4], fold(uint32(sk.phSum)+uint32(l4))))
	out.SetData(p.Headroom()+start, len(frame))
	if fl&afSent != 0 {
		fl |= afRetransmitted
		s.img.hdr.counters.TCPRetransmits++
	}
	fl = fl&(1<<afSlotShift-1) | afSent | s.slotOf(sk)<<afSlotShift
	if out == f {
		fl |= afQueued
	}
	f.SetAux(auxFlags, fl)
	f.SetAux(auxTime, s.micros())
	if n > 0 && sk.tflags&tfPingPong == 0 && s.answersLocked(sk) {
		sk.tflags |= tfPingPong
	}
	s.ackSentLocked(sk)
	if out == f {
		if len(s.tx) > 0 {
			// A flush sends the lent frames first: frames built before
			// this one go now, so that segments leave in the order they
			// were built. (A pure ACK overtaken by a later segment would
			// reach the peer as the newer, and its older window would
			// move the peer's view of our window's edge back.)
			s.flushLocked()
		}
		s.txKeep = append(s.txKeep, h)
		if len(s.txKeep) == cap(s.txKeep) {
			s.flushLocked()
		}
	} else {
		s.queueTxLocked(out.Handle())
	}
}

// splitSendLocked splits unsent send-queue frame h after its first k
// payload bytes: the rest moves to a new frame linked after it. It
// reports whether it split.
func (s *Stack) splitSendLocked(sk *sock, h vnic.Handle, k int) bool {
	p := s.pool
	f, ok := p.Frame(h)
	if !ok {
		return false
	}
	n := int(f.Aux(auxLen))
	if k <= 0 || k >= n || f.Aux(auxFlags)&afSent != 0 {
		return false
	}
	if n > len(f.Buf())-txPayload {
		s.img.hdr.counters.ImageCorrupt++
		return false
	}
	h2 := p.Alloc()
	f2, ok := p.Frame(h2)
	if !ok {
		s.img.hdr.counters.TxNoFrames++
		return false
	}
	s.img.hdr.sndFrames++
	copy(f2.Buf()[txPayload:], f.Buf()[txPayload+k:txPayload+n])
	f2.SetAux(auxSeq, uint32(seqnum.Value(f.Aux(auxSeq)).Add(seqnum.Size(k))))
	f2.SetAux(auxLen, uint32(n-k))
	f2.SetNext(f.Next())
	f.SetNext(h2)
	f.SetAux(auxLen, uint32(k))
	if sk.sndTail == h {
		sk.sndTail = h2
	}
	return true
}

// sndSeqEnd is the sequence number after the last queued byte.
func (sk *sock) sndSeqEnd() seqnum.Value { return sk.sndUna.Add(seqnum.Size(sk.sndBytes)) }

// tcpOutputLocked sends what the windows and Nagle allow, then the FIN if
// one is due, then an ACK if one is owed and nothing carried it.
func (s *Stack) tcpOutputLocked(sk *sock) {
	switch sk.state {
	case tcpEstablished, tcpCloseWait, tcpFinWait1, tcpClosing, tcpLastAck:
	default:
		if sk.tflags&tfAckNow != 0 && sk.state >= tcpSynReceived {
			s.sendAckLocked(sk)
		}
		return
	}
	p := s.pool
	now := s.micros()
	// Retransmissions first (RFC 6675 NextSeg, rule 1).
	if sk.needRexmit() {
		s.retransmitLostLocked(sk)
	}
	if sk.tflags&tfFinLost != 0 && !sk.needRexmit() && sk.sndUnsent == vnic.Null {
		sk.tflags &^= tfFinLost
		s.resendFinLocked(sk)
		s.img.hdr.counters.TCPRetransmits++
	}
	if sk.sndUnsent != vnic.Null {
		s.restartAfterIdleLocked(sk, now)
	}
	flight := sk.flight()
	limit := sk.sndUna.Add(seqnum.Size(sk.sndWnd))
	sent := false
	for h, steps := sk.sndUnsent, 0; h != vnic.Null; h, steps = sk.sndUnsent, steps+1 {
		f, ok := p.Frame(h)
		if !ok || s.overWalkLocked(steps) {
			if !ok {
				s.img.hdr.counters.ImageCorrupt++
			}
			sk.sndUnsent = vnic.Null
			break
		}
		seq := seqnum.Value(f.Aux(auxSeq))
		n := int(f.Aux(auxLen))
		next := f.Next()
		end := seq.Add(seqnum.Size(n))
		if limit.LessThan(end) {
			if sk.sndMax == sk.sndUna {
				// Nothing in flight and the peer's window is closed or
				// too small for the next segment: a lost window update
				// would leave us waiting for ever, so probe (RFC 9293
				// 3.8.6.1; RFC 1122 4.2.3.4's override timeout).
				s.armPersistLocked(sk)
			}
			break
		}
		if flight+uint32(n) > sk.cwnd && flight > 0 {
			sk.cwndLimited = true
			break
		}
		if n < int(sk.mss) && s.holdPartialLocked(sk, next == vnic.Null) {
			break
		}
		if sk.sndMax == sk.sndUna {
			sk.progressAt = s.tsNow() // the user timeout counts from here
		}
		// A FIN queued behind the last segment rides on it (Linux's
		// tcp_send_fin sets it on the tail skb not yet sent): a server
		// that writes its answer and closes sends one segment, not two.
		var fin uint8
		if next == vnic.Null && sk.tflags&(tfFinQueued|tfFinSent) == tfFinQueued {
			fin = flagFIN
		}
		s.transmitSegLocked(sk, f, seq, n, fin)
		if n < int(sk.mss) {
			sk.tflags &^= tfPush | tfAutoCork
			sk.corkAt = 0
		}
		sk.sndUnsent = next
		sk.sndNxt = end
		if sk.sndMax.LessThan(end) {
			sk.sndMax = end
		}
		flight += uint32(n)
		if sk.caState == caRecovery {
			sk.prrOut += uint32(n)
		}
		sent = true
		if fin != 0 {
			s.finSentLocked(sk)
		}
	}
	if sent {
		if s.kickNow {
			// The application is waiting on this send: the segments
			// leave now, and the bookkeeping only the stack needs
			// follows while they are on their way.
			s.flushLocked()
		}
		s.armRTOLocked(sk, false)
		sk.lastSend = max(now, 1)
		if sk.sndUnsent == vnic.Null && flight < sk.cwnd/2 {
			sk.cwndLimited = false // the application, not the window, limits us
		}
	}
	if sk.tflags&tfFinQueued != 0 && sk.tflags&tfFinSent == 0 && sk.sndUnsent == vnic.Null {
		s.sendFinLocked(sk)
	}
	if sk.tflags&tfAckNow != 0 {
		s.sendAckLocked(sk)
	}
}

// holdPartialLocked decides whether a partial segment, the next unsent
// one, waits for more data. Only the queue's last can: one split to fit
// the peer's window goes (Linux's tcp_write_xmit pushes all but the
// last). A FIN after it pushes it, as Linux's tcp_send_fin does, and so
// does tfPush. TCP_CORK holds it, for at most corkCeiling (tcp(7)).
// Otherwise Nagle's algorithm (RFC 896, RFC 1122 4.2.3.4) holds it while
// data is unacknowledged, and autocorking until the sender's next wait
// (tcp_autocork.go).
func (s *Stack) holdPartialLocked(sk *sock, last bool) bool {
	if !last || sk.tflags&tfPush != 0 || sk.tflags&tfFinQueued != 0 {
		return false
	}
	if sk.tflags&tfCork != 0 {
		if sk.corkAt == 0 {
			s.setLazyLocked(sk, timerCork, &sk.corkAt, s.nowTick()+s.ticks(corkCeiling))
		}
		return true
	}
	if sk.tflags&tfNoDelay == 0 && sk.sndMax != sk.sndUna {
		return true
	}
	return s.autoCorkLocked(sk)
}

// sendFinLocked sends our FIN (RFC 9293 3.10.4) and moves to FIN-WAIT-1 or
// LAST-ACK.
func (s *Stack) sendFinLocked(sk *sock) {
	s.controlLocked(sk, flagFIN|flagACK, sk.sndNxt)
	s.finSentLocked(sk)
}

// finSentLocked accounts for our FIN, sent at sndNxt on a segment of its
// own or on the last one of data.
func (s *Stack) finSentLocked(sk *sock) {
	sk.sndNxt = sk.sndNxt.Add(1)
	if sk.sndMax.LessThan(sk.sndNxt) {
		sk.sndMax = sk.sndNxt
	}
	sk.tflags |= tfFinSent
	switch sk.state {
	case tcpEstablished, tcpSynReceived:
		sk.state = tcpFinWait1
	case tcpCloseWait:
		sk.state = tcpLastAck
	}
	s.armRTOLocked(sk, false)
}

// resendFinLocked sends the FIN again (its sequence number is sndMax-1).
func (s *Stack) resendFinLocked(sk *sock) {
	s.controlLocked(sk, flagFIN|flagACK, sk.sndMax.Add(^seqnum.Size(0)))
}

// resetReplyLocked answers a segment that has no connection with a reset
// (RFC 9293 3.10.7.1), addressed from the frame's own headers.
func (s *Stack) resetReplyLocked(frame []byte, p *ipPacket, sport, dport uint16, seq, ack seqnum.Value, flags uint8, segLen int) {
	if flags&flagRST != 0 {
		return
	}
	h := s.pool.Alloc()
	if h == vnic.Null {
		s.img.hdr.counters.TxNoFrames++
		return
	}
	var mac [6]byte
	copy(mac[:], frame[6:12])
	b := s.pool.Buf(h)
	s.writeIPv4Locked(b, nil, mac, p.src, 6, 20)
	t := b[ethLen+ipLen:]
	if flags&flagACK != 0 {
		writeTCP(t, dport, sport, ack, 0, flagRST, 20, 0)
	} else {
		writeTCP(t, dport, sport, 0, seq.Add(seqnum.Size(segLen)), flagRST|flagACK, 20, 0)
	}
	sum := checksum.Combine(pseudoSum(s.img.hdr.addr, p.src, 6, 20), checksum.Checksum(t[:20], 0))
	binary.BigEndian.PutUint16(t[16:], ^sum)
	s.pool.SetLen(h, ethLen+ipLen+20)
	s.img.hdr.counters.TxTCPResets++
	s.queueTxLocked(h)
}
