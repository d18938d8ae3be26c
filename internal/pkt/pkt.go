// Package pkt builds and parses Ethernet/IPv4/UDP/TCP frames with gVisor's
// header package. Tests, benchmarks and diagnostic tools use it; the stack
// has its own zero-allocation paths.
package pkt

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Endpoint is one end of a frame: link address and IPv4 address and port.
type Endpoint struct {
	MAC  net.HardwareAddr
	Addr netip.AddrPort
}

const (
	ethLen = header.EthernetMinimumSize
	ipLen  = header.IPv4MinimumSize
	udpLen = header.UDPMinimumSize
	tcpLen = header.TCPMinimumSize
)

// UDPLen is the frame length of a UDP datagram carrying n payload bytes.
func UDPLen(n int) int { return ethLen + ipLen + udpLen + n }

// TCPLen is the frame length of a TCP segment with optLen option bytes and n
// payload bytes.
func TCPLen(optLen, n int) int { return ethLen + ipLen + tcpLen + optLen + n }

func addr(a netip.AddrPort) tcpip.Address { return tcpip.AddrFrom4(a.Addr().As4()) }

func encodeL2L3(buf []byte, src, dst Endpoint, proto tcpip.TransportProtocolNumber, l4len int) header.IPv4 {
	header.Ethernet(buf).Encode(&header.EthernetFields{
		SrcAddr: tcpip.LinkAddress(src.MAC), DstAddr: tcpip.LinkAddress(dst.MAC), Type: header.IPv4ProtocolNumber,
	})
	ip := header.IPv4(buf[ethLen:])
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(ipLen + l4len), ID: 1, Flags: header.IPv4FlagDontFragment, TTL: 64,
		Protocol: uint8(proto), SrcAddr: addr(src.Addr), DstAddr: addr(dst.Addr),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	return ip
}

// UDP writes a UDP datagram from src to dst into buf and returns the frame
// length. buf must hold UDPLen(len(payload)) bytes.
func UDP(buf []byte, src, dst Endpoint, payload []byte) (int, error) {
	n := UDPLen(len(payload))
	if len(buf) < n {
		return 0, fmt.Errorf("udp frame of %d bytes does not fit a %d-byte buffer", n, len(buf))
	}
	l4 := udpLen + len(payload)
	encodeL2L3(buf, src, dst, header.UDPProtocolNumber, l4)
	u := header.UDP(buf[ethLen+ipLen:])
	u.Encode(&header.UDPFields{SrcPort: src.Addr.Port(), DstPort: dst.Addr.Port(), Length: uint16(l4)})
	copy(u[udpLen:], payload)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, addr(src.Addr), addr(dst.Addr), uint16(l4))
	xsum = checksum.Checksum(payload, xsum)
	c := ^u.CalculateChecksum(xsum)
	if c == 0 {
		c = 0xffff
	}
	u.SetChecksum(c)
	return n, nil
}

// TCPSegment describes a TCP segment to build.
type TCPSegment struct {
	Seq, Ack uint32
	Flags    header.TCPFlags
	Window   uint16
	Options  []byte // already encoded, a multiple of 4 bytes
	Payload  []byte
}

// TCP writes a TCP segment from src to dst into buf and returns the frame
// length.
func TCP(buf []byte, src, dst Endpoint, s TCPSegment) (int, error) {
	if len(s.Options)%4 != 0 || len(s.Options) > 40 {
		return 0, fmt.Errorf("tcp options of %d bytes: must be a multiple of 4 up to 40", len(s.Options))
	}
	n := TCPLen(len(s.Options), len(s.Payload))
	if len(buf) < n {
		return 0, fmt.Errorf("tcp frame of %d bytes does not fit a %d-byte buffer", n, len(buf))
	}
	hl := tcpLen + len(s.Options)
	l4 := hl + len(s.Payload)
	encodeL2L3(buf, src, dst, header.TCPProtocolNumber, l4)
	t := header.TCP(buf[ethLen+ipLen:])
	t.Encode(&header.TCPFields{
		SrcPort: src.Addr.Port(), DstPort: dst.Addr.Port(), SeqNum: s.Seq, AckNum: s.Ack,
		DataOffset: uint8(hl), Flags: s.Flags, WindowSize: s.Window,
	})
	copy(t[tcpLen:], s.Options)
	copy(t[hl:], s.Payload)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, addr(src.Addr), addr(dst.Addr), uint16(l4))
	xsum = checksum.Checksum(s.Payload, xsum)
	t.SetChecksum(^t.CalculateChecksum(xsum))
	return n, nil
}

// Frame is a parsed Ethernet/IPv4/TCP-or-UDP frame. Slices alias the input.
type Frame struct {
	SrcMAC, DstMAC net.HardwareAddr
	Proto          tcpip.TransportProtocolNumber
	Src, Dst       netip.AddrPort
	TCPFlags       header.TCPFlags // TCP only
	Seq, Ack       uint32          // TCP only
	Payload        []byte
}

// Errors from Parse.
var (
	ErrTruncated   = errors.New("frame truncated")
	ErrNotIPv4     = errors.New("not an IPv4 frame")
	ErrChecksum    = errors.New("bad checksum")
	ErrUnsupported = errors.New("neither TCP nor UDP")
)

// Parse checks and decodes a frame: lengths, IPv4 header checksum and the
// TCP or UDP checksum.
func Parse(b []byte) (Frame, error) {
	var f Frame
	if len(b) < ethLen {
		return f, ErrTruncated
	}
	eth := header.Ethernet(b)
	if eth.Type() != header.IPv4ProtocolNumber {
		return f, ErrNotIPv4
	}
	f.SrcMAC, f.DstMAC = net.HardwareAddr(eth.SourceAddress()), net.HardwareAddr(eth.DestinationAddress())
	ip := header.IPv4(b[ethLen:])
	if !ip.IsValid(len(ip)) {
		return f, ErrTruncated
	}
	if !ip.IsChecksumValid() {
		return f, fmt.Errorf("ipv4 header: %w", ErrChecksum)
	}
	src, dst := ip.SourceAddress(), ip.DestinationAddress()
	sa, da := netip.AddrFrom4(src.As4()), netip.AddrFrom4(dst.As4())
	l4 := ip[ip.HeaderLength():ip.TotalLength()]
	f.Proto = ip.TransportProtocol()
	switch f.Proto {
	case header.UDPProtocolNumber:
		if len(l4) < udpLen {
			return f, ErrTruncated
		}
		u := header.UDP(l4)
		if int(u.Length()) < udpLen || int(u.Length()) > len(l4) {
			return f, ErrTruncated
		}
		f.Payload = l4[udpLen:u.Length()]
		if u.Checksum() != 0 && !u.IsChecksumValid(src, dst, checksum.Checksum(f.Payload, 0)) {
			return f, fmt.Errorf("udp: %w", ErrChecksum)
		}
		f.Src, f.Dst = netip.AddrPortFrom(sa, u.SourcePort()), netip.AddrPortFrom(da, u.DestinationPort())
	case header.TCPProtocolNumber:
		if len(l4) < tcpLen {
			return f, ErrTruncated
		}
		t := header.TCP(l4)
		off := int(t.DataOffset())
		if off < tcpLen || off > len(l4) {
			return f, ErrTruncated
		}
		f.Payload = l4[off:]
		if !t.IsChecksumValid(src, dst, checksum.Checksum(f.Payload, 0), uint16(len(f.Payload))) {
			return f, fmt.Errorf("tcp: %w", ErrChecksum)
		}
		f.Src, f.Dst = netip.AddrPortFrom(sa, t.SourcePort()), netip.AddrPortFrom(da, t.DestinationPort())
		f.TCPFlags, f.Seq, f.Ack = t.Flags(), t.SequenceNumber(), t.AckNumber()
	default:
		return f, ErrUnsupported
	}
	return f, nil
}

// String summarises a parsed frame on one line.
func (f Frame) String() string {
	switch f.Proto {
	case header.TCPProtocolNumber:
		return fmt.Sprintf("tcp %s -> %s [%s] seq=%d len=%d", f.Src, f.Dst, f.TCPFlags, f.Seq, len(f.Payload))
	case header.UDPProtocolNumber:
		return fmt.Sprintf("udp %s -> %s len=%d", f.Src, f.Dst, len(f.Payload))
	}
	return fmt.Sprintf("proto %d %s -> %s", f.Proto, f.Src, f.Dst)
}
