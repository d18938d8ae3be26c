package stack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"

	"github.com/xdp-onload/onload/vnic"
)

const (
	ethLen      = 14
	ipLen       = 20
	etherTypeIP = 0x0800
)

// ipPacket is what IPv4 input learned about a frame, for the transport
// layer.
type ipPacket struct {
	src, dst [4]byte
	proto    uint8
	l4       []byte // the transport header and payload, exactly
	l4off    int    // where l4 starts in the frame's data
	frame    vnic.Frame
}

// inputLocked takes one received frame: Ethernet, then IPv4 (RFC 791,
// RFC 1122 3.2.1), then the transport. Every frame is untrusted: lengths
// are checked before every read. The frame is freed unless a socket keeps
// it.
func (s *Stack) inputLocked(h vnic.Handle) {
	c := &s.img.hdr.counters
	c.RxFrames++
	f, ok := s.pool.Frame(h)
	if !ok {
		c.ImageCorrupt++
		return
	}
	b := f.Data()
	if len(b) < ethLen+ipLen || binary.BigEndian.Uint16(b[12:]) != etherTypeIP {
		c.RxNotIPv4++
		s.pool.Free(h)
		return
	}
	ip := b[ethLen:]
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ip[0]>>4 != 4 || ihl < ipLen || total < ihl || total > len(ip) {
		c.RxBadIPHeader++
		s.pool.Free(h)
		return
	}
	if ihl == ipLen && ipHeaderSum(ip) != 0xffff || ihl > ipLen && checksum.Checksum(ip[:ihl], 0) != 0xffff {
		c.RxBadIPChecksum++
		s.pool.Free(h)
		return
	}
	if binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 { // MF or a fragment offset
		c.RxFragments++
		s.pool.Free(h)
		return
	}
	var p ipPacket
	copy(p.src[:], ip[12:16])
	copy(p.dst[:], ip[16:20])
	if p.dst != s.img.hdr.addr {
		c.RxNotForUs++
		s.pool.Free(h)
		return
	}
	p.proto = ip[9]
	p.l4 = ip[ihl:total]
	p.l4off = ethLen + ihl
	p.frame = f
	switch p.proto {
	case 6:
		s.tcpInputLocked(h, &p)
	case 17:
		s.udpInputLocked(h, &p)
	default:
		c.RxOtherProto++
		s.pool.Free(h)
	}
}

// ecnMask is the ECN field of the IPv4 TOS byte (RFC 3168 5).
const ecnMask = 3

// writeIPv4 writes Ethernet and IPv4 headers for a packet of l4len
// transport bytes into b and returns where the transport header goes.
// The TOS and TTL are those of sk (nil: a reset for no socket, 0 and
// the default).
func (s *Stack) writeIPv4Locked(b []byte, sk *sock, dstMAC [6]byte, dst [4]byte, proto uint8, l4len int) int {
	hd := s.img.hdr
	copy(b[0:6], dstMAC[:])
	copy(b[6:12], hd.mac[:])
	binary.BigEndian.PutUint16(b[12:], etherTypeIP)
	ip := b[ethLen : ethLen+ipLen]
	tos, ttl := uint8(0), uint8(defaultTTL)
	if sk != nil {
		tos, ttl = sk.tos, sk.ipTTL()
	}
	ip[0], ip[1] = 0x45, tos
	binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+l4len))
	binary.BigEndian.PutUint16(ip[4:], uint16(hd.ipID))
	hd.ipID++
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // don't fragment
	ip[8], ip[9] = ttl, proto
	ip[10], ip[11] = 0, 0
	copy(ip[12:16], hd.addr[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], ^ipHeaderSum(ip))
	return ethLen + ipLen
}

// pseudoSum is the sum of the IPv4 pseudo-header (RFC 768, RFC 9293 3.1).
func pseudoSum(src, dst [4]byte, proto uint8, l4len int) uint16 {
	sum := uint32(src[0])<<8 | uint32(src[1])
	sum += uint32(src[2])<<8 | uint32(src[3])
	sum += uint32(dst[0])<<8 | uint32(dst[1])
	sum += uint32(dst[2])<<8 | uint32(dst[3])
	sum += uint32(proto) + uint32(uint16(l4len))
	return fold(sum)
}

// fold folds a 32-bit one's-complement sum to 16 bits.
func fold(sum uint32) uint16 {
	sum = sum>>16 + sum&0xffff
	sum += sum >> 16
	return uint16(sum)
}

// ipHeaderSum is the one's-complement sum of a 20-byte IPv4 header.
func ipHeaderSum(ip []byte) uint16 {
	_ = ip[19]
	sum := uint64(binary.BigEndian.Uint32(ip[0:])) + uint64(binary.BigEndian.Uint32(ip[4:])) +
		uint64(binary.BigEndian.Uint32(ip[8:])) + uint64(binary.BigEndian.Uint32(ip[12:])) +
		uint64(binary.BigEndian.Uint32(ip[16:]))
	sum = sum>>32 + sum&0xffffffff // at most 2^32 + 4
	return fold(uint32(sum>>16 + sum&0xffff))
}

// queueTxLocked adds a frame to the batch the next flush sends.
func (s *Stack) queueTxLocked(h vnic.Handle) {
	s.tx = append(s.tx, h)
	if len(s.tx) == cap(s.tx) {
		s.flushLocked()
	}
}

// flushLocked hands the batch to the NIC: the lent frames (TCP segments
// kept for retransmission), then the others, which were all built after
// them (transmitSegLocked flushes the others before it lends a frame).
// Frames the ring had no room for are dropped and counted: the protocols
// above recover (TCP retransmits).
func (s *Stack) flushLocked() {
	c := &s.img.hdr.counters
	if len(s.txKeep) > 0 {
		// Lent frames stay on their send queues: those the ring refuses
		// become unsent again, to go with the next output.
		for _, h := range s.txKeep {
			s.pool.SetAux(h, auxFlags, s.pool.Aux(h, auxFlags)&^afQueued)
		}
		s.txKeep = s.divertLocked(s.txKeep, true)
		n, _ := s.nic.TransmitKeep(s.txKeep)
		c.TxFrames += uint64(n)
		for _, h := range s.txKeep[n:] {
			c.TxRingFull++
			s.unsendLocked(h)
		}
		s.txKeep = s.txKeep[:0]
	}
	s.tx = s.divertLocked(s.tx, false)
	if len(s.tx) == 0 {
		return
	}
	n, _ := s.nic.Transmit(s.tx)
	c.TxFrames += uint64(n)
	for _, h := range s.tx[n:] {
		c.TxRingFull++
		s.pool.Free(h)
	}
	s.tx = s.tx[:0]
}

// unsendLocked hands a send-queue frame the NIC refused back to its
// socket: it is marked lost, to be sent again (as Linux treats a local
// drop, the window shrinks with it).
func (s *Stack) unsendLocked(h vnic.Handle) {
	slot := s.pool.Aux(h, auxFlags) >> afSlotShift
	if slot >= uint32(len(s.img.socks)) {
		return
	}
	sk := &s.img.socks[slot]
	seq := seqnum.Value(s.pool.Aux(h, auxSeq))
	if sk.kind != kindTCP || seq.LessThan(sk.sndUna) || !seq.LessThan(sk.sndMax) {
		return
	}
	if f, ok := s.pool.Frame(h); ok {
		s.markLostLocked(sk, f)
	}
}

// buildTemplateLocked makes a connected socket's header template from its
// addresses, ports and next hop. The IPv4 identification is always 0: TCP
// sets don't-fragment, and RFC 6864 4.1 lets atomic datagrams carry any
// identification.
func (s *Stack) buildTemplateLocked(sk *sock) {
	hd := s.img.hdr
	b := sk.tmpl[:]
	copy(b[0:6], sk.remoteMAC[:])
	copy(b[6:12], hd.mac[:])
	binary.BigEndian.PutUint16(b[12:], etherTypeIP)
	ip := b[ethLen : ethLen+ipLen]
	ip[0], ip[1] = 0x45, sk.tos
	ip[2], ip[3], ip[4], ip[5] = 0, 0, 0, 0
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // don't fragment
	ip[8], ip[9] = sk.ipTTL(), ipProto(sk.kind)
	ip[10], ip[11] = 0, 0
	copy(ip[12:16], hd.addr[:])
	copy(ip[16:20], sk.remoteAddr[:])
	binary.BigEndian.PutUint16(b[ethLen+ipLen:], sk.localPort)
	binary.BigEndian.PutUint16(b[ethLen+ipLen+2:], sk.remotePort)
	sk.ipSum = ipHeaderSum(ip)
	sk.phSum = pseudoSum(hd.addr, sk.remoteAddr, ipProto(sk.kind), 0)
	sk.tmplValid = true
}

// writeHeadersLocked copies a connected socket's template to the start of
// b and fills in the lengths and the IPv4 checksum for l4len transport
// bytes. It returns where the transport header's ports end.
func (s *Stack) writeHeadersLocked(sk *sock, b []byte, l4len int) int {
	if !sk.tmplValid {
		s.buildTemplateLocked(sk)
	}
	*(*[len(sk.tmpl)]byte)(b) = sk.tmpl // a fixed-size copy: moves, no memmove call
	total := uint16(ipLen + l4len)
	binary.BigEndian.PutUint16(b[ethLen+2:], total)
	binary.BigEndian.PutUint16(b[ethLen+10:], ^fold(uint32(sk.ipSum)+uint32(total)))
	return len(sk.tmpl)
}
