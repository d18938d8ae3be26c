package stack

import (
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// The SACK scoreboard (RFC 6675) lives in the send queue: each sent frame
// carries afSacked when a SACK block covered it, afLost when loss
// detection (RACK, the duplicate-ACK rule without SACK, or a timeout)
// marked it, and afRexmit when it was retransmitted after that. The tcb
// keeps the byte sums, so the data in flight ("pipe") is arithmetic:
//
//	pipe = (sndMax - sndUna) - sacked - lost + retransmitted-since-lost

// flight is the data in flight (RFC 6675's pipe, as Linux counts it;
// our FIN is not data).
func (sk *sock) flight() uint32 {
	out := uint32(sk.sndUna.Size(sk.sndMax))
	if sk.tflags&tfFinSent != 0 && out > 0 {
		out--
	}
	out -= min(out, sk.sackedBytes+sk.lostBytes)
	return out + sk.rexmitBytes
}

// needRexmit reports whether frames marked lost wait to be sent again.
func (sk *sock) needRexmit() bool { return sk.lostBytes > sk.rexmitBytes }

// sackLocked applies the SACK blocks of an acknowledgement (RFC 2018,
// RFC 6675 5) to the scoreboard and returns the bytes newly covered.
// Blocks that do not lie within what is in flight are ignored and counted:
// only a D-SACK (RFC 2883 4: the first block, below the cumulative ACK or
// inside the second block) reports something else, a segment the peer got
// twice, and it is returned as dsack.
func (s *Stack) sackLocked(sk *sock, g *segment, now uint32) (newly uint32, dsack bool) {
	c := &s.img.hdr.counters
	var blocks [4]sackBlock
	n := 0
	for i, b := range g.opts.sack[:g.opts.nsack] {
		if !b.start.LessThan(b.end) {
			c.TCPBadSacks++
			continue
		}
		if i == 0 && (b.start.LessThan(g.ack) ||
			g.opts.nsack > 1 && g.opts.sack[1].start.LessThanEq(b.start) && b.end.LessThanEq(g.opts.sack[1].end)) {
			dsack = true
			c.TCPDSacks++
			continue
		}
		if b.start.LessThan(sk.sndUna) || sk.sndMax.LessThan(b.end) {
			c.TCPBadSacks++
			continue
		}
		// Insertion sort by start.
		j := n
		for j > 0 && b.start.LessThan(blocks[j-1].start) {
			blocks[j] = blocks[j-1]
			j--
		}
		blocks[j] = b
		n++
	}
	if n == 0 {
		return 0, dsack
	}
	p := s.pool
	bi := 0
	for h, steps := sk.sndHead, 0; h != vnic.Null && h != sk.sndUnsent && bi < n; steps++ {
		f, ok := p.Frame(h)
		if !ok {
			c.ImageCorrupt++
			break
		}
		if s.overWalkLocked(steps) {
			break
		}
		next := f.Next()
		seq := seqnum.Value(f.Aux(auxSeq))
		l := f.Aux(auxLen)
		end := seq.Add(seqnum.Size(l))
		for bi < n && blocks[bi].end.LessThanEq(seq) {
			bi++
		}
		if bi == n {
			break
		}
		fl := f.Aux(auxFlags)
		if fl&afSacked == 0 && blocks[bi].start.LessThanEq(seq) && end.LessThanEq(blocks[bi].end) {
			s.unmarkLostLocked(sk, f, fl)
			fl = f.Aux(auxFlags)
			f.SetAux(auxFlags, fl|afSacked)
			sk.sackedBytes += l
			newly += l
			if end.LessThan(sk.highSacked) && fl&afRetransmitted == 0 {
				sk.tflags |= tfReordered // delivered after a later segment (RFC 8985 6.2 step 2)
			}
			if sk.highSacked.LessThan(end) {
				sk.highSacked = end
			}
			s.rackUpdateLocked(sk, f.Aux(auxTime), end, fl&afRetransmitted != 0, now)
		}
		h = next
	}
	c.TCPSackRecovered += uint64(newly)
	return newly, dsack
}

// unmarkLostLocked takes frame f (flags fl) out of the lost sums: it was
// delivered after all.
func (s *Stack) unmarkLostLocked(sk *sock, f vnic.Frame, fl uint32) {
	if fl&afLost == 0 {
		return
	}
	sk.forgetLost(f.Aux(auxLen), fl)
	f.SetAux(auxFlags, fl&^(afLost|afRexmit))
}

// forgetLost takes a frame of l bytes with flags fl out of the lost and
// retransmitted sums.
func (sk *sock) forgetLost(l, fl uint32) {
	if fl&afLost == 0 {
		return
	}
	sk.lostBytes -= min(sk.lostBytes, l)
	if fl&afRexmit != 0 {
		sk.rexmitBytes -= min(sk.rexmitBytes, l)
	}
}

// markLostLocked marks frame f lost: it is to be sent again. A frame
// already marked and retransmitted is marked again (its retransmission
// was lost too).
func (s *Stack) markLostLocked(sk *sock, f vnic.Frame) {
	fl := f.Aux(auxFlags)
	if fl&(afSacked|afSent) != afSent {
		return
	}
	l := f.Aux(auxLen)
	switch {
	case fl&afLost == 0:
		sk.lostBytes += l
	case fl&afRexmit != 0:
		sk.rexmitBytes -= min(sk.rexmitBytes, l)
	default:
		return // already waiting to be resent
	}
	f.SetAux(auxFlags, fl&^afRexmit|afLost)
}

// ackedFrameLocked takes a cumulatively acknowledged frame (flags fl) out
// of the scoreboard sums and returns the bytes it newly delivers (none if
// a SACK block had already counted it).
func (sk *sock) ackedFrame(l, fl uint32) uint32 {
	if fl&afSacked != 0 {
		sk.sackedBytes -= min(sk.sackedBytes, l)
		return 0
	}
	sk.forgetLost(l, fl)
	return l
}

// clearScoreboardLocked forgets every mark: the send queue is empty, or
// the peer may have reneged.
func (sk *sock) clearScoreboard() {
	sk.sackedBytes, sk.lostBytes, sk.rexmitBytes = 0, 0, 0
}
