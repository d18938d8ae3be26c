package stack

import (
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// predictedLocked is header prediction (Van Jacobson's; Linux's
// tcp_rcv_established fast path): it takes the segment that an established
// connection in its steady state expects next, in order and carrying an
// acknowledgement, with the steps segmentKeepsLocked would take for it,
// in the same order, and none of the tests that cannot apply to it.
//
// The prediction holds when: the segment is the next in sequence with
// only ACK among SYN, FIN, RST and ACK; it passes PAWS and carries no SACK
// blocks; its acknowledgement lies in [sndUna, sndMax]; an acknowledgement
// that moves finds the sender in order (no loss, no SACKed data, no
// recovery to undo, no window probe, no FIN sent); and its payload fits
// the window and the buffer, with nothing waiting out of order and frames
// to spare. Then RFC 9293 3.10.7.4's window and RST and SYN checks pass,
// the acknowledgement is neither bad nor duplicate, recovery reduces to
// growing the window (RFC 5681), and the text joins the receive queue as
// it is. ok is false, with nothing changed, for a segment that needs the
// general path.
func (s *Stack) predictedLocked(sk *sock, h vnic.Handle, g *segment) (keep, ok bool) {
	tsOK := sk.tflags&tfTSOK != 0
	if g.opts.nsack != 0 || tsOK && (!g.opts.ts || int32(g.opts.tsVal-sk.tsRecent) < 0) ||
		g.ack.LessThan(sk.sndUna) || sk.sndMax.LessThan(g.ack) || sk.tflags&tfWindowProbe != 0 {
		return false, false
	}
	advanced := g.ack != sk.sndUna
	if advanced {
		if sk.caState != caOpen || sk.tflags&(tfUndo|tfFinSent) != 0 || sk.sackedBytes != 0 ||
			sk.needRexmit() || sk.dupAck != 0 {
			return false, false
		}
	} else if g.n == 0 {
		return false, false // a duplicate ACK or a window update: the general path counts them
	}
	if g.n > 0 {
		wnd := 0
		if sk.rcvNxt.LessThan(sk.rcvAdv) {
			wnd = int(sk.rcvNxt.Size(sk.rcvAdv))
		}
		if g.n > wnd || sk.oooHead != vnic.Null || sk.userClosed() ||
			!sk.rcvFits(sk.rcvBytes+uint32(g.n), sk.rcvFrames+1) || s.lowFramesLocked() {
			return false, false
		}
	}

	// Taken: segmentKeepsLocked's steps for this segment.
	s.img.hdr.counters.TCPPredicted++
	if tsOK {
		sk.tsRecent = g.opts.tsVal // RFC 7323 4.3
	}
	// Fifth, the ACK field (ackLocked).
	if advanced {
		now := s.micros()
		delivered := s.ackedDataLocked(sk, g.ack, sk.sndUna.Size(g.ack), now)
		sk.dupAck = 0
		// recoverLocked, in the open state with nothing lost.
		s.ccAckLocked(sk, delivered, now)
		if sk.sndUna == sk.sndMax {
			s.stopRTOLocked(sk)
		} else {
			s.armRTOLocked(sk, true)
		}
	}
	if advanced || sk.sndWl1.LessThan(g.seq) || sk.sndWl1 == g.seq && sk.sndWl2.LessThanEq(g.ack) {
		sk.sndWnd, sk.sndWl1, sk.sndWl2 = uint32(g.wnd)<<sk.sndWS, g.seq, g.ack
	}
	if g.n == 0 {
		return false, true
	}
	// Seventh, the segment text (dataLocked), in order and within bounds.
	s.enqueueRcvLocked(sk, h, g.n)
	sk.rcvNxt = sk.rcvNxt.Add(seqnum.Size(g.n))
	s.rcvAutotuneLocked(sk, g.opts.tsEcr)
	s.ackPolicyLocked(sk, g.n)
	s.inOrder = true
	return true, true
}
