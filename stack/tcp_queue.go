package stack

import (
	"iter"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// walkLimit bounds every walk over a frame list that frees nothing as it
// goes: a list of a sound image holds at most the pool's frames, so a
// longer walk is going round a cycle that a broken or hostile writer of
// the image made. The walk stops there and the damage is counted
// (ImageCorrupt). (A walk that frees each frame it passes ends by itself:
// the freed handle goes stale, and the pool refuses it.)
func (s *Stack) walkLimit() int { return s.pool.Count() }

// overWalkLocked reports, and counts, a walk that went past walkLimit.
func (s *Stack) overWalkLocked(steps int) bool {
	if steps < s.walkLimit() {
		return false
	}
	s.img.hdr.counters.ImageCorrupt++
	return true
}

// The out-of-order queue holds segments that arrived ahead of rcvNxt,
// sorted by sequence number, each frame's data exactly its payload. Owner
// words: the sequence number and a FIN mark.
const (
	auxOOOSeq = 0
	auxOOOFin = 1
)

// oooInsertLocked queues a segment that arrived ahead of rcvNxt. Bytes it
// shares with a queued segment are trimmed from it; a segment wholly
// covered by queued ones is dropped. It reports whether it kept the frame.
func (s *Stack) oooInsertLocked(sk *sock, h vnic.Handle, seq seqnum.Value, n int, fin bool) bool {
	p := s.pool
	var prev vnic.Handle
	cur := sk.oooHead
	limit := min(int(sk.oooFrames), s.walkLimit())
	for steps := 0; cur != vnic.Null && steps <= limit; steps++ {
		cseq := seqnum.Value(p.Aux(cur, auxOOOSeq))
		if seq.LessThan(cseq) {
			break
		}
		prev, cur = cur, p.Next(cur)
	}
	end := seq.Add(seqnum.Size(n))
	if prev != vnic.Null {
		pend := seqnum.Value(p.Aux(prev, auxOOOSeq)).Add(seqnum.Size(len(p.Data(prev))))
		if end.LessThanEq(pend) && !(fin && end == pend && p.Aux(prev, auxOOOFin) == 0) {
			s.img.hdr.counters.RxTCPDuplicate++
			return false
		}
		if seq.LessThan(pend) {
			cut := int(seq.Size(pend))
			if cut > n {
				cut = n
			}
			p.Trim(h, cut, n-cut)
			seq, n = seq.Add(seqnum.Size(cut)), n-cut
		}
	}
	if cur != vnic.Null {
		cseq := seqnum.Value(p.Aux(cur, auxOOOSeq))
		if cseq.LessThan(end) {
			n = int(seq.Size(cseq))
			p.Trim(h, 0, n)
			fin = false
		}
	}
	p.SetAux(h, auxOOOSeq, uint32(seq))
	var f uint32
	if fin {
		f = 1
	}
	p.SetAux(h, auxOOOFin, f)
	p.SetNext(h, cur)
	if prev == vnic.Null {
		sk.oooHead = h
	} else {
		p.SetNext(prev, h)
	}
	sk.oooBytes += uint32(n)
	sk.oooFrames++
	return true
}

// oooDrainLocked moves segments that rcvNxt has reached from the
// out-of-order queue to the receive queue.
func (s *Stack) oooDrainLocked(sk *sock) {
	p := s.pool
	for h := sk.oooHead; h != vnic.Null; h = sk.oooHead {
		seq := seqnum.Value(p.Aux(h, auxOOOSeq))
		if sk.rcvNxt.LessThan(seq) {
			return
		}
		sk.oooHead = p.Next(h)
		n := len(p.Data(h))
		sk.oooBytes -= min(sk.oooBytes, uint32(n))
		sk.oooFrames -= min(sk.oooFrames, 1)
		fin := p.Aux(h, auxOOOFin) != 0
		end := seq.Add(seqnum.Size(n))
		if end.LessThanEq(sk.rcvNxt) && !(fin && end == sk.rcvNxt) {
			p.Free(h)
			continue
		}
		if dup := int(seq.Size(sk.rcvNxt)); dup > 0 {
			p.Trim(h, dup, n-dup)
			n -= dup
		}
		if n > 0 {
			s.enqueueRcvLocked(sk, h, n)
			sk.rcvNxt = sk.rcvNxt.Add(seqnum.Size(n))
		} else {
			p.Free(h)
		}
		if fin {
			s.finLocked(sk)
		}
	}
}

// sackBlocksLocked describes the out-of-order queue as SACK blocks (RFC
// 2018), contiguous segments merged, into out; it returns how many.
func (s *Stack) sackBlocksLocked(sk *sock, out []sackBlock) int {
	p := s.pool
	k := 0
	for h, steps := sk.oooHead, 0; h != vnic.Null && k <= len(out); h, steps = p.Next(h), steps+1 {
		if s.overWalkLocked(steps) {
			break
		}
		seq := seqnum.Value(p.Aux(h, auxOOOSeq))
		end := seq.Add(seqnum.Size(len(p.Data(h))))
		if k > 0 && !out[k-1].end.LessThan(seq) {
			if out[k-1].end.LessThan(end) {
				out[k-1].end = end
			}
			continue
		}
		if k == len(out) {
			break
		}
		out[k] = sackBlock{seq, end}
		k++
	}
	return k
}

// freeQueuesLocked gives back every frame a socket holds: the receive and
// out-of-order queues, and the send queue unless keepSend.
func (s *Stack) freeQueuesLocked(sk *sock, keepSend bool) {
	p := s.pool
	for h := s.dequeueRcvLocked(sk); h != vnic.Null; h = s.dequeueRcvLocked(sk) {
		p.Free(h)
	}
	s.pruneOOOLocked(sk)
	if !keepSend {
		s.freeSendLocked(sk)
	}
}

// freeSendLocked gives back the send queue's frames.
func (s *Stack) freeSendLocked(sk *sock) {
	p := s.pool
	for h := sk.sndHead; h != vnic.Null; {
		next := p.Next(h)
		s.freeSendFrameLocked(h)
		h = next
	}
	sk.sndHead, sk.sndTail, sk.sndUnsent, sk.sndBytes = vnic.Null, vnic.Null, vnic.Null, 0
	sk.clearScoreboard()
}

// freeSendFrameLocked frees a send-queue frame and takes it off the count
// of frames the send queues hold (sendFramesFullLocked).
func (s *Stack) freeSendFrameLocked(h vnic.Handle) {
	s.pool.Free(h)
	s.img.hdr.sndFrames -= min(s.img.hdr.sndFrames, 1)
}

// sentFrames walks the send queue's frames that have been sent, oldest
// first, stopping at a handle the pool does not know (counted as image
// corruption). The walk reads each frame's link before yielding it, and
// the loop body may mark and transmit frames but not unlink them.
func (s *Stack) sentFrames(sk *sock) iter.Seq[vnic.Frame] {
	return func(yield func(vnic.Frame) bool) {
		for h, steps := sk.sndHead, 0; h != vnic.Null && h != sk.sndUnsent; steps++ {
			f, ok := s.pool.Frame(h)
			if !ok {
				s.img.hdr.counters.ImageCorrupt++
				return
			}
			if s.overWalkLocked(steps) {
				return
			}
			h = f.Next()
			if !yield(f) {
				return
			}
		}
	}
}

// pruneOOOLocked drops the out-of-order queue (the sender will send it
// again: SACK no longer covers it).
func (s *Stack) pruneOOOLocked(sk *sock) {
	p := s.pool
	for h := sk.oooHead; h != vnic.Null; {
		next := p.Next(h)
		p.Free(h)
		h = next
	}
	sk.oooHead, sk.oooBytes, sk.oooFrames = vnic.Null, 0, 0
}
