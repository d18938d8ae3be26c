package stack

import "github.com/xdp-onload/onload/vnic"

// tcpSendLocked queues buf for sending (RFC 9293 3.10.2) and sends what the
// windows allow. It takes as much as fits the send buffer and the frame
// pool; nothing fitting is ErrWouldBlock.
func (s *Stack) tcpSendLocked(sk *sock, buf []byte) (int, error) {
	if sk.err != 0 {
		e := sk.err
		sk.err = 0
		return 0, errnoError(e)
	}
	switch sk.state {
	case tcpSynSent, tcpSynReceived:
		return 0, ErrWouldBlock
	case tcpEstablished, tcpCloseWait:
		if sk.tflags&tfFinQueued != 0 {
			return 0, ErrPipe
		}
	case tcpClosed:
		if sk.flags&sfConnected == 0 {
			return 0, ErrNotConn
		}
		return 0, ErrPipe
	default:
		return 0, ErrPipe
	}
	if len(buf) == 0 {
		return 0, nil
	}
	p := s.pool
	capacity := p.FrameSize() - p.Headroom() - txPayload
	mss := min(int(sk.mss), capacity)
	done := 0
	lowFrames := false
	for done < len(buf) && sk.sndBytes < sk.sndBuf {
		room := int(sk.sndBuf - sk.sndBytes)
		// Top up the last frame if it has not been sent (Nagle's small
		// writes coalesce here).
		tail, haveTail := p.Frame(sk.sndTail)
		if haveTail && tail.Aux(auxFlags)&afSent == 0 && int(tail.Aux(auxLen)) < mss {
			l := int(tail.Aux(auxLen))
			n := copy(tail.Buf()[txPayload+l:txPayload+mss], buf[done:min(len(buf), done+room)])
			tail.SetAux(auxLen, uint32(l+n))
			sk.sndBytes += uint32(n)
			done += n
			continue
		}
		// TCP_NOTSENT_LOWAT: a new frame only while less than the mark
		// is unsent (Linux's sk_stream_memory_free at each new skb: the
		// last one's room is filled regardless).
		if m := s.notsentLowatOf(sk); m != 0 && sk.notSent() >= m {
			break
		}
		if s.lowFramesLocked() || s.sendFramesFullLocked() {
			s.img.hdr.counters.TxNoFrames++
			lowFrames = true
			break
		}
		h := p.Alloc()
		f, ok := p.Frame(h)
		if !ok {
			s.img.hdr.counters.TxNoFrames++
			lowFrames = true
			break
		}
		n := copy(f.Buf()[txPayload:txPayload+mss], buf[done:min(len(buf), done+room)])
		f.SetAux(auxSeq, uint32(sk.sndSeqEnd()))
		f.SetAux(auxLen, uint32(n))
		f.SetNext(vnic.Null)
		if haveTail {
			tail.SetNext(h)
		} else {
			sk.sndHead = h
		}
		sk.sndTail = h
		if sk.sndUnsent == vnic.Null {
			sk.sndUnsent = h
		}
		sk.sndBytes += uint32(n)
		s.img.hdr.sndFrames++
		done += n
	}
	if done == 0 {
		if lowFrames {
			return 0, ErrFramesBusy // frames come back without waking the socket
		}
		return 0, ErrWouldBlock
	}
	s.tcpOutputLocked(sk)
	return done, nil
}

// tcpRecvLocked copies received data into buf (RFC 9293 3.10.3) straight
// from the frames, freeing those it empties; with peek nothing is
// consumed. It returns 0, nil at the end of the stream.
func (s *Stack) tcpRecvLocked(sk *sock, buf []byte, peek bool) (int, error) {
	if sk.state == tcpListen {
		return 0, ErrNotConn
	}
	p := s.pool
	done := 0
	h := sk.rcvHead
	// The queue holds rcvFrames frames: a walk that finds more is going
	// round a cycle a writer of the shared memory made.
	limit := min(int(sk.rcvFrames), s.walkLimit())
	for steps := 0; done < len(buf) && h != vnic.Null; steps++ {
		f, ok := p.Frame(h)
		if !ok {
			s.img.hdr.counters.ImageCorrupt++
			sk.rcvHead, sk.rcvTail, sk.rcvBytes, sk.rcvFrames = vnic.Null, vnic.Null, 0, 0
			break
		}
		if steps >= limit {
			s.img.hdr.counters.ImageCorrupt++
			break
		}
		d := f.Data()
		n := copy(buf[done:], d)
		done += n
		next := f.Next()
		if !peek {
			if n == len(d) {
				sk.rcvHead = next
				if next == vnic.Null {
					sk.rcvTail = vnic.Null
				}
				sk.rcvBytes -= min(sk.rcvBytes, uint32(n))
				sk.rcvFrames -= min(sk.rcvFrames, 1)
				p.Free(h)
			} else {
				p.Trim(h, n, len(d)-n)
				sk.rcvBytes -= min(sk.rcvBytes, uint32(n))
			}
		}
		h = next
	}
	if done > 0 {
		if !peek {
			s.windowUpdateLocked(sk)
		}
		return done, nil
	}
	if sk.tflags&tfRcvFin != 0 {
		// The end of the stream came in order before any error since (a
		// reset in CLOSE-WAIT, say): it is read first, as in Linux
		// (SOCK_DONE before sk_err in tcp_recvmsg), and the error waits for
		// a write or SO_ERROR.
		return 0, nil
	}
	if sk.err != 0 {
		e := sk.err
		sk.err = 0
		return 0, errnoError(e)
	}
	if sk.tflags&tfShutRd != 0 || sk.state == tcpClosed && sk.flags&sfConnected != 0 {
		return 0, nil
	}
	if sk.state == tcpClosed {
		return 0, ErrNotConn
	}
	return 0, ErrWouldBlock
}

// answersLocked reports whether a segment of data we send now answers
// the peer's last: it comes within the delayed-ACK time of it (Linux's
// pingpong mode, entered in tcp_event_data_sent).
func (s *Stack) answersLocked(sk *sock) bool {
	return uint32(s.nowTick())-sk.lastRcv < uint32(s.delAckTicks())
}

// windowUpdateLocked tells the peer when reading has opened a window
// that had closed to half its size or less, by at least doubling it, as
// Linux does (tcp_cleanup_rbuf). A window more open than that needs no
// segment of its own: the peer has room to send, and the next ACK (for
// its data, or on our reply) carries the new edge. RFC 9293 3.8.6.2.2
// allows an update for any opening of min(MSS, half the buffer); sent at
// each read, such updates are a pure ACK for every request a
// request/response server reads, beside the ACK its reply carries.
//
// A read that empties the queue of a connection that does not answer
// what it reads (not tfPingPong: a receiver of bulk data) sends the ACK
// its last segment waits for at once, as Linux does for such a segment
// that ended a write, rather than on the delayed-ACK timer: the sender
// may be waiting for it to go on, or to close.
func (s *Stack) windowUpdateLocked(sk *sock) {
	if !synchronized(sk.state) || sk.tflags&tfRcvFin != 0 {
		return
	}
	if sk.tflags&(tfDelAck|tfPingPong) == tfDelAck && sk.rcvBytes == 0 {
		if s.ackHold {
			s.holdAckLocked(sk)
			return
		}
		sk.tflags |= tfAckNow
		s.tcpOutputLocked(sk)
		return
	}
	used := sk.rcvBytes + sk.oooBytes
	if used >= sk.rcvBuf {
		return
	}
	maxWnd := min(sk.rcvBuf, 0xffff<<sk.rcvWS, s.rcvShareLocked(sk))
	wnd := min(sk.rcvBuf-used, maxWnd)
	adv := uint32(0)
	if sk.rcvNxt.LessThan(sk.rcvAdv) {
		adv = uint32(sk.rcvNxt.Size(sk.rcvAdv))
	}
	if adv <= maxWnd/2 && wnd >= 2*adv && wnd-adv >= min(uint32(sk.mss), maxWnd/2) {
		sk.tflags |= tfAckNow
		s.tcpOutputLocked(sk)
	}
}
