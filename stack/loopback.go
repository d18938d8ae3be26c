package stack

import (
	"bytes"
	"net/netip"

	"github.com/xdp-onload/onload/vnic"
)

// In-stack loopback. A TCP connection whose two ends are sockets of the
// same stack (two processes sharing a named stack, one listening and the
// other dialling it, or one process talking to itself) never reaches the
// NIC: a frame addressed to the stack's own address is taken in by the
// stack itself, as the kernel's loopback device does and as Onload does
// for connections within one stack. It goes to the NIC's peer otherwise,
// which would drop it (the frame is for us) or send it back.
//
// Frames are diverted in flushLocked, after the transport built them and
// before the NIC sees them, and taken in when the lock is let go
// (unlockTried, and the deferred work run at the same point), never in
// the middle of an operation: input changes any socket, and the frames
// being diverted may have been built half-way through another socket's
// output. The frames are copies when their original stays on a send queue
// for retransmission (TransmitKeep's lent frames), and the frames
// themselves otherwise. At most maxLoop wait; beyond that they are dropped
// and counted, and TCP recovers them as it would a loss. Taking them in
// may answer with more (an ACK, the next segments): a bounded number of
// rounds runs at each unlock, and what is left waits for the next lock
// (idle is false meanwhile, so the Sleeper polls).

// maxLoop is how many looped frames may wait to be taken in; loopRounds
// how many rounds of taking them in one unlock runs.
const (
	maxLoop    = 512
	loopRounds = 16
)

// forUsLocked reports whether a frame built for the NIC is addressed to
// the stack's own IPv4 address.
func (s *Stack) forUsLocked(b []byte) bool {
	return len(b) >= ethLen+ipLen && bytes.Equal(b[ethLen+16:ethLen+20], s.img.hdr.addr[:])
}

// divertLocked takes the frames addressed to the stack itself out of hs
// (keeping the others in order) and queues them to be taken in: copies if
// lent, else the frames themselves. It returns what is left for the NIC.
func (s *Stack) divertLocked(hs []vnic.Handle, lent bool) []vnic.Handle {
	n := 0
	for _, h := range hs {
		b := s.pool.Data(h)
		if !s.forUsLocked(b) {
			hs[n] = h
			n++
			continue
		}
		c := &s.img.hdr.counters
		if len(s.loop) == maxLoop || lent && s.lowFramesLocked() {
			c.LoopDropped++
			if !lent {
				s.pool.Free(h)
			}
			continue
		}
		if lent {
			cp := s.pool.Alloc()
			if cp == vnic.Null {
				c.LoopDropped++
				continue
			}
			copy(s.pool.Buf(cp), b)
			s.pool.SetLen(cp, len(b))
			h = cp
		}
		c.LoopFrames++
		s.loop = append(s.loop, h)
		s.looped.Store(int32(len(s.loop)))
	}
	return hs[:n]
}

// loopLocked takes in the frames the stack sent itself, and what they
// make it send itself in turn, for up to loopRounds rounds.
func (s *Stack) loopLocked() {
	for range loopRounds {
		if len(s.loop) == 0 {
			return
		}
		in := s.loop
		s.loop, s.loopIn = s.loopIn[:0], in
		s.looped.Store(0)
		s.setClock(s.fast.now())
		for _, h := range in {
			s.inputLocked(h)
		}
		s.flushLocked()
	}
}

// Listening reports whether a TCP socket of the stack listens on local
// (bound to its address or to the wildcard): a connection to it from the
// stack's own address stays in the stack.
func (s *Stack) Listening(local netip.AddrPort) bool {
	a := local.Addr().Unmap()
	if !a.Is4() {
		return false
	}
	s.lock()
	defer s.unlock()
	var zero [4]byte
	sk := s.findLocked(kindTCP, a.As4(), local.Port(), zero, 0)
	if sk == nil {
		sk = s.findLocked(kindTCP, zero, local.Port(), zero, 0)
	}
	return sk != nil && sk.state == tcpListen
}
