package stack

// Output at the end of a poll's batch.
//
// A poll takes in up to rxBudget frames. A connection receiving in bulk
// has many of them, in order: answered one by one, every second segment
// would have its ACK (RFC 9293 3.8.6.3), each a frame through the NIC and,
// on veth, the peer's TCP run in our kicking thread. Instead the output of
// a connection that took data in order (header prediction) waits for the
// batch's end, or for its batchAckSegs-th segment in a row: one ACK then
// acknowledges several, as Linux's receive offload (GRO) makes one
// segment of a burst and acknowledges it once. Any other segment (out of
// order, a duplicate, a FIN, an ACK that frees the send queue) is answered
// at once, as before, which also acknowledges what waited: a loss still
// has its duplicate ACKs.

// deferOutputLocked leaves sk's output for the batch's end.
func (s *Stack) deferOutputLocked(sk *sock) {
	id := s.idOf(sk)
	if n := len(s.batch); n > 0 && s.batch[n-1] == id {
		// Frames of one connection come together. A sender answers an
		// ACK with as much as it acknowledged, at once: acknowledging
		// more than batchAckSegs would overrun a small ring on the way
		// (veth's holds 256 frames).
		if s.batchRun++; s.batchRun >= batchAckSegs {
			s.batchRun = 0
			s.tcpOutputLocked(sk)
		}
		return
	}
	if len(s.batch) == cap(s.batch) {
		s.tcpOutputLocked(sk) // more connections than frames: cannot happen
		return
	}
	s.batch = append(s.batch, id)
	s.batchRun = 1
}

// batchAckSegs is the most segments one deferred ACK acknowledges. 4 is
// twice the ACK rate's stretch of RFC 9293 3.8.6.3 (every second
// segment): on veth, iperf3 -R -P 4 under the shim did 2.6-2.8 Gbit/s with
// it, where 2 did 2.1-2.6; 8 and 16 did no better and lost 0.5-1% of the
// segments to veth's ring, 4 about 0.15% (the kernel's own receiver 0-0.04%).
const batchAckSegs = 4

// outputBatchLocked ends a batch: the connections' deferred output.
func (s *Stack) outputBatchLocked() {
	batch := s.batch
	s.batch = nil
	for _, id := range batch {
		if sk, err := s.anySockLocked(id); err == nil && sk.kind == kindTCP && sk.state != tcpClosed {
			s.tcpOutputLocked(sk)
		}
	}
}
