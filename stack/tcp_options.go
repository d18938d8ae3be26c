package stack

import (
	"encoding/binary"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// TCP option kinds (RFC 9293 3.2, RFC 7323, RFC 2018).
const (
	optEnd       = 0
	optNOP       = 1
	optMSS       = 2
	optWS        = 3
	optSACKOK    = 4
	optSACK      = 5
	optTimestamp = 8
)

// sackBlock is one SACK block: [start, end).
type sackBlock struct{ start, end seqnum.Value }

// tcpOpts are the options of one segment.
type tcpOpts struct {
	mss          uint16
	ws           int8 // -1: not offered
	sackOK       bool
	ts           bool
	tsVal, tsEcr uint32
	nsack        int
	sack         [4]sackBlock
}

// parseOptions reads the options of a segment. Malformed options (a length
// below 2 or past the end) end parsing: what was read before stands, as a
// robust receiver must (RFC 9293 3.1, "must be prepared to handle an
// illegal option length").
func parseOptions(b []byte, syn bool) tcpOpts {
	// The usual layout of a data segment: NOP NOP TIMESTAMP.
	if len(b) == 12 && !syn && b[0] == optNOP && b[1] == optNOP && b[2] == optTimestamp && b[3] == 10 {
		return tcpOpts{ws: -1, ts: true, tsVal: binary.BigEndian.Uint32(b[4:]), tsEcr: binary.BigEndian.Uint32(b[8:])}
	}
	o := tcpOpts{ws: -1}
	for len(b) > 0 {
		kind := b[0]
		if kind == optEnd {
			break
		}
		if kind == optNOP {
			b = b[1:]
			continue
		}
		if len(b) < 2 || int(b[1]) < 2 || int(b[1]) > len(b) {
			break
		}
		l := int(b[1])
		v := b[2:l]
		switch {
		case kind == optMSS && l == 4 && syn:
			o.mss = binary.BigEndian.Uint16(v)
		case kind == optWS && l == 3 && syn:
			o.ws = int8(min(v[0], 14)) // RFC 7323 2.3: treat more than 14 as 14
		case kind == optSACKOK && l == 2 && syn:
			o.sackOK = true
		case kind == optTimestamp && l == 10:
			o.ts = true
			o.tsVal = binary.BigEndian.Uint32(v[0:])
			o.tsEcr = binary.BigEndian.Uint32(v[4:])
		case kind == optSACK && !syn && (l-2)%8 == 0 && l > 2:
			for i := 0; i+8 <= len(v) && o.nsack < len(o.sack); i += 8 {
				o.sack[o.nsack] = sackBlock{seqnum.Value(binary.BigEndian.Uint32(v[i:])), seqnum.Value(binary.BigEndian.Uint32(v[i+4:]))}
				o.nsack++
			}
		}
		b = b[l:]
	}
	return o
}

// synOptions writes the options of our SYN or SYN-ACK into b and returns
// their length (a multiple of 4). On a SYN-ACK only what the peer offered
// is offered back (RFC 7323, RFC 2018).
func (s *Stack) synOptions(b []byte, sk *sock, synAck bool) int {
	n := 0
	binary.BigEndian.PutUint16(b[0:], uint16(optMSS)<<8|4)
	binary.BigEndian.PutUint16(b[2:], s.advMSS())
	n = 4
	sackOK := !synAck || sk.tflags&tfSackOK != 0
	ts := !synAck || sk.tflags&tfTSOK != 0
	ws := !synAck || sk.tflags&tfWSOK != 0
	if sackOK && ts {
		b[n], b[n+1] = optSACKOK, 2
		n += 2
	} else if sackOK {
		b[n], b[n+1], b[n+2], b[n+3] = optNOP, optNOP, optSACKOK, 2
		n += 4
	}
	if ts {
		if !sackOK {
			b[n], b[n+1] = optNOP, optNOP
			n += 2
		}
		b[n], b[n+1] = optTimestamp, 10
		binary.BigEndian.PutUint32(b[n+2:], s.tsNow())
		binary.BigEndian.PutUint32(b[n+6:], sk.tsRecent)
		n += 10
	}
	if ws {
		b[n], b[n+1], b[n+2], b[n+3] = optNOP, optWS, 3, sk.rcvWS
		n += 4
	}
	return n
}

// tsOptLen is the timestamp option with its two NOPs of padding.
const tsOptLen = 12

// dataOptions writes the options of a synchronized segment: the
// timestamp, and SACK blocks (a D-SACK block if one is owed, then the
// out-of-order queue's), as many as fit in room bytes (a full segment has
// room only for the timestamp, which the MSS already allows for).
//
// With timestamps and no SACK blocks (no data out of order) it writes
// exactly tsOptLen bytes, without timestamps none.
func (s *Stack) dataOptions(b []byte, sk *sock, room int) int {
	n := 0
	if sk.tflags&tfTSOK != 0 {
		b[0], b[1], b[2], b[3] = optNOP, optNOP, optTimestamp, 10
		binary.BigEndian.PutUint32(b[4:], s.tsNow())
		binary.BigEndian.PutUint32(b[8:], sk.tsRecent)
		n = tsOptLen
	}
	// A D-SACK block goes first (RFC 2883 4), once.
	dsack := sk.tflags&tfDSack != 0
	sk.tflags &^= tfDSack
	if sk.tflags&tfSackOK != 0 && (sk.oooHead != 0 || dsack) && room-n >= 12 {
		max := min((40-n-4)/8, (room-n-4)/8)
		var blocks [4]sackBlock
		k := 0
		if dsack {
			blocks[0] = sackBlock{sk.dsackStart, sk.dsackEnd}
			k = 1
		}
		k += s.sackBlocksLocked(sk, blocks[k:max])
		if k > 0 {
			b[n], b[n+1], b[n+2], b[n+3] = optNOP, optNOP, optSACK, byte(2+8*k)
			n += 4
			for _, blk := range blocks[:k] {
				binary.BigEndian.PutUint32(b[n:], uint32(blk.start))
				binary.BigEndian.PutUint32(b[n+4:], uint32(blk.end))
				n += 8
			}
		}
	}
	return n
}

// advMSS is the MSS we announce: what fits our MTU and one frame.
func (s *Stack) advMSS() uint16 {
	m := s.mtu - ipLen - 20
	if c := s.pool.FrameSize() - s.pool.Headroom() - txPayload; c < m {
		m = c
	}
	return uint16(m)
}
