package stack

import (
	"crypto/sha256"
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// SYN cookies (RFC 4987 3.6): when a listener's SYN queue is full, its
// SYN-ACK carries the connection's state in the initial sequence number
// and nothing is kept; the ACK that completes the handshake brings it
// back. The cookie is
//
//	bits 8-31  a keyed hash of the addresses, ports, the client's ISN and
//	           the time (64-second periods)
//	bits 2-7   the period, modulo 64
//	bits 0-1   the MSS, as an index into cookieMSS
//
// and is good for the period it was made in and the next.
//
// The options the client offered ride in the SYN-ACK's timestamp, as
// Linux's cookies carry them (cookie_init_timestamp): when the SYN has a
// timestamp, the SYN-ACK's TSval keeps the clock's value with its low six
// bits replaced by the client's window scale (0xf: none) and whether it
// may SACK; the ACK echoes it, and the connection gets window scaling,
// SACK and timestamps. A client without timestamps gets a connection
// without all three, as with Linux.

var cookieMSS = [4]uint16{536, 1200, 1440, 1460}

// The low bits of a cookie SYN-ACK's TSval.
const (
	cookieTSMask  = 0x3f
	cookieTSNoWS  = 0xf  // the client offered no window scale
	cookieTSSack  = 0x10 // the client may SACK
	cookieTSWSMax = 14   // RFC 7323 2.3
)

// cookieTS is the TSval of a cookie SYN-ACK for a SYN with options o: the
// clock with the options in its low bits, never ahead of the clock.
func cookieTS(now uint32, o *tcpOpts) uint32 {
	bits := uint32(cookieTSNoWS)
	if o.ws >= 0 {
		bits = uint32(min(o.ws, cookieTSWSMax))
	}
	if o.sackOK {
		bits |= cookieTSSack
	}
	ts := now&^cookieTSMask | bits
	if int32(ts-now) > 0 {
		ts -= cookieTSMask + 1
	}
	return ts
}

// cookieOptions reads back the options an ACK's timestamp echo carries,
// or ok false if the echo cannot be one we sent: it is from the future.
// (Four bits hold 0 to 14, a window scale, or 0xf, none: every value
// means something.)
func cookieOptions(now uint32, g *segment) (o tcpOpts, ok bool) {
	o.ws = -1
	if !g.opts.ts {
		return o, true // no timestamps: none of the three
	}
	e := g.opts.tsEcr
	if int32(e-now) > 0 {
		return o, false
	}
	if ws := e & 0xf; ws != cookieTSNoWS {
		o.ws = int8(ws)
	}
	o.sackOK = e&cookieTSSack != 0
	o.ts, o.tsVal = true, g.opts.tsVal
	return o, true
}

const cookiePeriodMs = 64_000

func (s *Stack) cookiePeriod() uint32 { return s.tsNow() / cookiePeriodMs }

// cookieHash keys the hash with the stack's ISN secret.
func (s *Stack) cookieHash(local, remote [4]byte, lport, rport uint16, theirISN seqnum.Value, period uint32) uint32 {
	var in [16 + 20]byte
	copy(in[:16], s.img.hdr.isnKey[:])
	copy(in[16:20], local[:])
	copy(in[20:24], remote[:])
	binary.BigEndian.PutUint16(in[24:], lport)
	binary.BigEndian.PutUint16(in[26:], rport)
	binary.BigEndian.PutUint32(in[28:], uint32(theirISN))
	binary.BigEndian.PutUint32(in[32:], period)
	sum := sha256.Sum256(in[:])
	return binary.BigEndian.Uint32(sum[:4])
}

func (s *Stack) makeCookie(p *ipPacket, g *segment, mssIdx uint32) uint32 {
	period := s.cookiePeriod()
	h := s.cookieHash(p.dst, p.src, g.dport, g.sport, g.seq, period)
	return h&^0xff | (period&0x3f)<<2 | mssIdx&3
}

// checkCookie validates the cookie an ACK returns (its ack - 1) and gives
// the MSS it carries.
func (s *Stack) checkCookie(p *ipPacket, g *segment) (mss uint16, ok bool) {
	v := uint32(g.ack.Add(^seqnum.Size(0)))
	now := s.cookiePeriod()
	age := (now - (v>>2)&0x3f) & 0x3f
	if age > 1 {
		return 0, false
	}
	h := s.cookieHash(p.dst, p.src, g.dport, g.sport, g.seq.Add(^seqnum.Size(0)), now-age)
	if h&^0xff != v&^0xff {
		return 0, false
	}
	return cookieMSS[v&3], true
}

// sendCookieSynAckLocked answers a SYN with a cookie SYN-ACK, addressed
// from the SYN's own headers: the MSS option, and if the SYN had a
// timestamp, the options the client offered (window scale, SACK) with the
// timestamp that carries them; the window field unscaled, as in any SYN.
func (s *Stack) sendCookieSynAckLocked(l *sock, frame []byte, p *ipPacket, g *segment) {
	c := &s.img.hdr.counters
	h := s.pool.Alloc()
	if h == vnic.Null {
		c.TxNoFrames++
		return
	}
	peer := g.opts.mss
	if peer == 0 {
		peer = 536
	}
	peer = min(peer, s.advMSS())
	idx := uint32(0)
	for i, m := range cookieMSS {
		if m <= peer {
			idx = uint32(i)
		}
	}
	var opts [20]byte
	opts[0], opts[1] = optMSS, 4
	binary.BigEndian.PutUint16(opts[2:], s.advMSS())
	n := 4
	if o := &g.opts; o.ts {
		if o.sackOK {
			opts[n], opts[n+1] = optSACKOK, 2
		} else {
			opts[n], opts[n+1] = optNOP, optNOP
		}
		opts[n+2], opts[n+3] = optTimestamp, 10
		binary.BigEndian.PutUint32(opts[n+4:], cookieTS(s.tsNow(), o))
		binary.BigEndian.PutUint32(opts[n+8:], o.tsVal)
		n += 12
		if o.ws >= 0 {
			opts[n], opts[n+1], opts[n+2], opts[n+3] = optNOP, optWS, 3, rcvWSFor(s.rcvBufMax(l))
			n += 4
		}
	}
	hdrLen := 20 + n
	var mac [6]byte
	copy(mac[:], frame[6:12])
	b := s.pool.Buf(h)
	s.writeIPv4Locked(b, l, mac, p.src, 6, hdrLen)
	t := b[ethLen+ipLen:]
	writeTCP(t, g.dport, g.sport, seqnum.Value(s.makeCookie(p, g, idx)), g.seq.Add(1), flagSYN|flagACK, hdrLen, uint16(min(l.rcvBuf, 0xffff)))
	copy(t[20:hdrLen], opts[:n])
	sum := checksum.Combine(pseudoSum(s.img.hdr.addr, p.src, 6, hdrLen), checksum.Checksum(t[:hdrLen], 0))
	binary.BigEndian.PutUint16(t[16:], ^sum)
	s.pool.SetLen(h, ethLen+ipLen+hdrLen)
	c.TCPSynCookiesSent++
	s.queueTxLocked(h)
}

// cookieAckLocked takes an ACK for listener l that matches no connection:
// if it returns a valid cookie, the connection is made, established, and
// queued for Accept, and the segment (which may carry data) goes to it. It
// reports whether it took the frame.
func (s *Stack) cookieAckLocked(l *sock, h vnic.Handle, p *ipPacket, g *segment) bool {
	c := &s.img.hdr.counters
	mss, ok := s.checkCookie(p, g)
	if !ok {
		return false
	}
	o, ok := cookieOptions(s.tsNow(), g)
	if !ok {
		return false
	}
	o.mss = mss
	if l.acceptLen >= l.backlog {
		c.TCPListenDrops++
		s.pool.Free(h)
		return true // dropped, as a SYN would be: the client retries
	}
	child := s.passiveChildLocked(l, h, p, g)
	if child == nil {
		s.pool.Free(h)
		return true
	}
	c.TCPSynCookiesOK++
	c.TCPPassiveOpens++
	child.irs = g.seq.Add(^seqnum.Size(0))
	child.rcvNxt = g.seq
	child.rcvWS = 0
	if o.ws >= 0 {
		child.rcvWS = rcvWSFor(s.rcvBufMax(child)) // what the SYN-ACK offered
	}
	child.rcvAdv = g.seq.Add(seqnum.Size(min(child.rcvBuf, 0xffff)))
	s.negotiateLocked(child, &o)
	child.iss = g.ack.Add(^seqnum.Size(0))
	child.sndUna, child.sndNxt, child.sndMax = g.ack, g.ack, g.ack
	child.sndWnd = uint32(g.wnd) << child.sndWS
	child.sndWl1, child.sndWl2 = g.seq, g.ack
	child.state = tcpEstablished
	c.TCPEstablished++
	s.hashLocked(child)
	l.synLen++ // establishedChildLocked takes it off again
	s.img.hdr.sockSynRcvd++
	s.establishedChildLocked(child)
	if child.kind != kindTCP {
		s.pool.Free(h)
		return true
	}
	// The segment's payload (if any) is the connection's first data.
	s.pool.Trim(h, p.l4off+len(p.l4)-g.n, g.n)
	s.segmentLocked(child, h, g)
	if child.kind == kindTCP && child.state != tcpClosed {
		s.tcpOutputLocked(child)
	}
	return true
}
