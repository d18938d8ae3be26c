package stack

import (
	"encoding/binary"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"

	"github.com/xdp-onload/onload/vnic"
)

const udpLen = 8

// Owner words of a queued datagram's frame.
const (
	auxSrcAddr = 0 // sender's IPv4 address, big-endian
	auxSrcPort = 1 // sender's port
)

// udpInputLocked delivers a datagram (RFC 768) to its socket's receive
// queue, where its payload stays in the frame until it is read.
func (s *Stack) udpInputLocked(h vnic.Handle, p *ipPacket) {
	c := &s.img.hdr.counters
	u := p.l4
	if len(u) < udpLen {
		c.RxUDPBadChecksum++
		s.pool.Free(h)
		return
	}
	ulen := int(binary.BigEndian.Uint16(u[4:]))
	if ulen < udpLen || ulen > len(u) {
		c.RxUDPBadChecksum++
		s.pool.Free(h)
		return
	}
	u = u[:ulen]
	if binary.BigEndian.Uint16(u[6:]) != 0 && checksum.Checksum(u, pseudoSum(p.src, p.dst, 17, ulen)) != 0xffff {
		c.RxUDPBadChecksum++
		s.badChecksumLocked()
		s.pool.Free(h)
		return
	}
	sport, dport := binary.BigEndian.Uint16(u[0:]), binary.BigEndian.Uint16(u[2:])
	sk := s.lookupLocked(kindUDP, p.dst, dport, p.src, sport)
	if sk == nil || sk.flags&sfConnected != 0 && (sk.remoteAddr != p.src || sk.remotePort != sport) {
		c.RxUDPNoSocket++
		s.pool.Free(h)
		return
	}
	n := ulen - udpLen
	if s.lowFramesLocked() {
		c.RxLowFrames++
		s.pool.Free(h)
		return
	}
	if sk.rcvBytes+uint32(n) > sk.rcvBuf {
		c.RxUDPQueueFull++
		s.pool.Free(h)
		return
	}
	s.pool.Trim(h, p.l4off+udpLen, n)
	s.pool.SetAux(h, auxSrcAddr, be32(p.src))
	s.pool.SetAux(h, auxSrcPort, uint32(sport))
	s.enqueueRcvLocked(sk, h, n)
	c.RxUDP++
	s.touchLocked(sk)
}

// enqueueRcvLocked appends a frame holding n payload bytes to the
// socket's receive queue.
func (s *Stack) enqueueRcvLocked(sk *sock, h vnic.Handle, n int) {
	s.pool.SetNext(h, vnic.Null)
	if sk.rcvTail == vnic.Null {
		sk.rcvHead = h
	} else if s.pool.SetNext(sk.rcvTail, h) != nil {
		// The tail handle is stale: the image is inconsistent. Drop the
		// queue's link rather than follow it.
		s.img.hdr.counters.ImageCorrupt++
		sk.rcvHead = h
	}
	sk.rcvTail = h
	sk.rcvBytes += uint32(n)
	sk.rcvFrames++
}

// dequeueRcvLocked takes the head frame off the receive queue.
func (s *Stack) dequeueRcvLocked(sk *sock) vnic.Handle {
	h := sk.rcvHead
	if h == vnic.Null {
		return vnic.Null
	}
	sk.rcvHead = s.pool.Next(h)
	if sk.rcvHead == vnic.Null {
		sk.rcvTail = vnic.Null
	}
	sk.rcvBytes -= min(sk.rcvBytes, uint32(len(s.pool.Data(h))))
	sk.rcvFrames -= min(sk.rcvFrames, 1)
	return h
}

// udpBuildLocked builds one datagram in a new frame.
func (s *Stack) udpBuildLocked(sk *sock, buf []byte, dst [4]byte, dport uint16, mac [6]byte) (vnic.Handle, error) {
	if ethLen+ipLen+udpLen+len(buf) > s.mtu+ethLen {
		return vnic.Null, ErrMsgSize
	}
	h := vnic.Null
	if !s.lowFramesLocked() {
		h = s.pool.Alloc()
	}
	if h == vnic.Null {
		s.img.hdr.counters.TxNoFrames++
		return vnic.Null, ErrNoBuffers
	}
	b := s.pool.Buf(h)
	ulen := udpLen + len(buf)
	off := s.writeIPv4Locked(b, sk, mac, dst, 17, ulen)
	u := b[off : off+ulen]
	binary.BigEndian.PutUint16(u[0:], sk.localPort)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(ulen))
	u[6], u[7] = 0, 0
	copy(u[udpLen:], buf)
	sum := ^checksum.Checksum(u, pseudoSum(s.img.hdr.addr, dst, 17, ulen))
	if sum == 0 {
		sum = 0xffff // RFC 768: zero means no checksum
	}
	binary.BigEndian.PutUint16(u[6:], sum)
	s.pool.SetLen(h, off+ulen)
	return h, nil
}

// udpRecvLocked copies the next datagram into buf. A datagram longer than
// buf is cut to fit and the rest discarded, as recvfrom does.
func (s *Stack) udpRecvLocked(sk *sock, buf []byte, peek bool) (int, netip.AddrPort, error) {
	h := sk.rcvHead
	if h == vnic.Null {
		return 0, netip.AddrPort{}, ErrWouldBlock
	}
	n := copy(buf, s.pool.Data(h))
	a := s.pool.Aux(h, auxSrcAddr)
	from := netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), uint16(s.pool.Aux(h, auxSrcPort)))
	if !peek {
		s.pool.Free(s.dequeueRcvLocked(sk))
	}
	return n, from, nil
}

// badChecksumLocked calls Options.BadChecksum, the first time only.
func (s *Stack) badChecksumLocked() {
	if f := s.badCsum; f != nil {
		s.badCsum = nil
		f()
	}
}
