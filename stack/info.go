package stack

import (
	"math/bits"
	"net/netip"
	"time"
)

// TCPInfo is a connection's transport state, as Linux's TCP_INFO reports
// it: for tests, the inspector and applications that tune on it.
type TCPInfo struct {
	State      string
	RTT        time.Duration // smoothed round-trip time (RFC 6298 SRTT)
	RTTVar     time.Duration // its variation (RTTVAR)
	RTO        time.Duration // retransmission timeout, before backoff
	Backoff    int           // RTO doublings in force
	Cwnd       uint32        // congestion window, bytes
	Ssthresh   uint32        // slow-start threshold, bytes
	MSS        int           // send maximum segment size
	SndWnd     uint32        // the peer's advertised window, bytes
	Unacked    uint32        // bytes sent and not acknowledged
	Queued     uint32        // bytes in the send queue (sent or not)
	Unread     uint32        // bytes received in order and not read
	OutOfOrder uint32        // bytes held out of order
	// Sequence numbers, raw: the first unacknowledged byte, the next to
	// send and the next expected from the peer.
	SndUna, SndNxt, RcvNxt uint32
	Sacked                 uint32 // bytes in flight the peer SACKed
	Lost                   uint32 // bytes marked lost, retransmitted or not
	Retrans                uint32 // bytes marked lost and retransmitted since
	CAState                string // "open", "recovery" or "loss"
	Congestion             string // "cubic" or "reno"
	RcvBuf, SndBuf         uint32 // the buffers, as autotuning left them
	// The options the handshake settled: timestamps (RFC 7323), SACK
	// (RFC 2018), and the window scale shifts each way (-1: no window
	// scaling).
	Timestamps, SACK     bool
	SndWScale, RcvWScale int

	// Read and Written count the bytes the application has read from
	// the connection and written to it (modulo 2^32): both 0 for one it
	// never used (appBytesLocked).
	Read, Written uint32
}

// TCPInfo reports the state of TCP connection id.
func (s *Stack) TCPInfo(id SockID) (TCPInfo, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return TCPInfo{}, err
	}
	if sk.kind != kindTCP {
		return TCPInfo{}, ErrNotSupported
	}
	return tcpInfoLocked(sk), nil
}

// SocketRow is one socket as the inspector lists it (netstat's columns
// and TCP's vital signs).
type SocketRow struct {
	ID            SockID
	Proto         string // "tcp" or "udp"
	State         string // TCP's state; "" for UDP
	Local, Remote netip.AddrPort
	SendQ, RecvQ  uint32 // bytes queued to send (sent or not), received and not read
	Cwnd          uint32
	RTT           time.Duration
	Retrans       uint32 // bytes retransmitted
	// Owner is the pid of the process that holds the socket (opened or
	// accepted it; the first, for a listener several share), where
	// processes share the stack; 0 if unknown.
	Owner int
}

// Sockets lists the sockets in use.
func (s *Stack) Sockets() []SocketRow {
	s.lock()
	defer s.unlock()
	return s.socketsLocked()
}

func (s *Stack) socketsLocked() []SocketRow {
	var rows []SocketRow
	for i := range s.img.socks {
		sk := &s.img.socks[i]
		if sk.kind == kindFree {
			continue
		}
		r := SocketRow{
			ID:     makeSockID(uint32(i), sk.gen),
			Local:  netip.AddrPortFrom(netip.AddrFrom4(sk.localAddr), sk.localPort),
			Remote: netip.AddrPortFrom(netip.AddrFrom4(sk.remoteAddr), sk.remotePort),
		}
		if o := sk.openers; o != 0 {
			r.Owner = int(s.img.hdr.procs[bits.TrailingZeros32(o)].pid)
		}
		switch sk.kind {
		case kindTCP:
			ti := tcpInfoLocked(sk)
			r.Proto, r.State, r.SendQ, r.RecvQ, r.Cwnd, r.RTT, r.Retrans = "tcp", ti.State, ti.Queued, ti.Unread, ti.Cwnd, ti.RTT, ti.Retrans
			if sk.flags&sfPortHolder != 0 {
				r.State = "SHARED-PORT" // a shared local port's holder (shared_ports.go)
			}
			if sk.flags&sfListenRetired != 0 && sk.state == tcpListen {
				r.State = "LISTEN-RETIRED" // its port the kernel's (RetireListener)
			}
		case kindUDP:
			r.Proto, r.RecvQ = "udp", sk.rcvBytes
		default:
			continue
		}
		rows = append(rows, r)
	}
	return rows
}

func tcpInfoLocked(sk *sock) TCPInfo {
	read, written := appBytesLocked(sk)
	return TCPInfo{
		State:      stateName(sk.state),
		RTT:        time.Duration(sk.srtt) * time.Microsecond,
		RTTVar:     time.Duration(sk.rttvar) * time.Microsecond,
		RTO:        time.Duration(sk.rto) * time.Microsecond,
		Backoff:    int(sk.backoff),
		Cwnd:       sk.cwnd,
		Ssthresh:   sk.ssthresh,
		MSS:        int(sk.mss),
		SndWnd:     sk.sndWnd,
		Unacked:    uint32(sk.sndUna.Size(sk.sndMax)),
		Queued:     sk.sndBytes,
		Unread:     sk.rcvBytes,
		OutOfOrder: sk.oooBytes,
		SndUna:     uint32(sk.sndUna), SndNxt: uint32(sk.sndNxt), RcvNxt: uint32(sk.rcvNxt),
		Sacked: sk.sackedBytes, Lost: sk.lostBytes, Retrans: sk.rexmitBytes,
		CAState:    caStateNames[min(sk.caState, caLoss)],
		Congestion: congestionNames[min(sk.ccAlgo, ccReno)],
		RcvBuf:     sk.rcvBuf, SndBuf: sk.sndBuf,
		Timestamps: sk.tflags&tfTSOK != 0, SACK: sk.tflags&tfSackOK != 0,
		SndWScale: wscale(sk, sk.sndWS), RcvWScale: wscale(sk, sk.rcvWS),
		Read: read, Written: written,
	}
}

// appBytesLocked is what the application has read from sk and written
// to it, from the sequence space: the peer's bytes acknowledged past its
// SYN (and FIN) less those still queued for reading; ours acknowledged
// past our SYN (and FIN) plus those queued. Outside the synchronized
// states (before the handshake, after a handover), 0.
func appBytesLocked(sk *sock) (read, written uint32) {
	if !synchronized(sk.state) {
		return 0, 0
	}
	got := uint32(sk.irs.Add(1).Size(sk.rcvNxt))
	if sk.tflags&tfRcvFin != 0 && got > 0 {
		got-- // the peer's FIN takes a sequence number and no byte
	}
	read = got - min(got, sk.rcvBytes)
	acked := uint32(0)
	if sk.sndUna != sk.iss {
		acked = uint32(sk.iss.Add(1).Size(sk.sndUna))
		if sk.tflags&tfFinSent != 0 && sk.sndUna == sk.sndMax && acked > 0 {
			acked-- // our FIN, acknowledged
		}
	}
	return read, acked + sk.sndBytes
}

// wscale is a window scale shift as TCPInfo reports it: -1 when the
// connection has no window scaling.
func wscale(sk *sock, shift uint8) int {
	if sk.tflags&tfWSOK == 0 {
		return -1
	}
	return int(shift)
}
