package stack

// The receivers' share of the NIC's receive depth.
//
// The kernel delivers frames into the AF_XDP socket only while the fill
// ring holds free frames, and only a poll refills it. The peers may send
// as much as the windows we advertised, all at once: over many connections
// that is far more than the fill ring holds, and a burst that arrives
// while the program's threads do their own work (or wait for a CPU) is
// dropped in the kernel (the socket's RxFillRingEmptyDescs), to come again
// after the senders' loss recovery. The kernel's own TCP receives into
// memory it allocates as frames come, and has no such edge.
//
// So the windows are shared: every connection that took in data lately
// may open its window to its share of three quarters of the receive depth
// (the rest is for ACKs, handshakes and segments that carry less than an
// MSS), and no less than rcvShareMin segments. One busy connection may
// use nearly all of it. Windows are never shrunk (rcvWindowLocked): a
// smaller share takes hold as each connection's window is used and opens
// again.

// rcvCountNs is how often the receivers are counted (in a poll that took
// frames in), and rcvHoldCounts how many counts a connection stays a
// receiver after its last data: one whose window is closed until its
// program reads takes no data meanwhile, but opens its window again when
// it does.
const (
	rcvCountNs    = 10_000_000
	rcvHoldCounts = 10
)

// rcvShareMin is the least window share, in segments: the delayed ACK
// waits for two, and a sender needs a few in flight to detect a loss by
// duplicate ACKs.
const rcvShareMin = 4

// countReceiversLocked counts the connections that took in data in the
// last rcvHoldCounts counts, if the last count is rcvCountNs old.
func (s *Stack) countReceiversLocked() {
	hdr := s.img.hdr
	if s.nowNs-hdr.rcvCountAt < rcvCountNs && s.nowNs >= hdr.rcvCountAt {
		return
	}
	hdr.rcvCountAt = s.nowNs
	hdr.rcvEpoch++
	n := uint32(0)
	socks := s.img.socks[:min(int(hdr.sockHigh), len(s.img.socks))]
	for i := range socks {
		sk := &socks[i]
		if sk.kind != kindTCP || !synchronized(sk.state) {
			continue
		}
		if sk.rcvSeen != sk.rcvNxt {
			sk.rcvSeen, sk.rcvSeenAt = sk.rcvNxt, hdr.rcvEpoch
		}
		if hdr.rcvEpoch-sk.rcvSeenAt < rcvHoldCounts {
			sk.rcvCounted = hdr.rcvEpoch + 1
			n++
		}
	}
	hdr.rcvActive = n
}

// rcvShareLocked is how far sk's window may open beyond rcvNxt, in bytes:
// its share of the receive depth, or no limit for a NIC without one.
//
// A connection that the last count did not count, and that has taken
// something in since (a new connection, or one idle at the count), is
// counted now, until the next count counts again: otherwise each such
// connection would open its window to the share of the receivers the
// count saw, up to the whole depth, and together they would overrun the
// fill ring before the next count (TestStackTCPReceiveShare: sixteen
// connections whose windows opened in the poll that took their first
// data, the count made before their handshakes; the kernel found the
// fill ring empty 229 times). Counted one by one, k new receivers beside
// n counted ones open to 1/(n+1), 1/(n+2), ... of the depth's three
// quarters, which add up to more than it (about ln((n+k)/n)), but only
// until the next count, 10 ms on, and a sender opens its window to its
// congestion window's measure, which starts at ten segments: with counts
// a second apart, the sixteen connections of that test never found the
// fill ring empty in 16 runs, where they had found it so 3651-5533 times
// in each run without this.
func (s *Stack) rcvShareLocked(sk *sock) uint32 {
	if s.rxDepth == 0 {
		return ^uint32(0)
	}
	if hdr := s.img.hdr; sk.rcvCounted != hdr.rcvEpoch+1 && sk.rcvSeen != sk.rcvNxt {
		sk.rcvCounted = hdr.rcvEpoch + 1
		hdr.rcvActive++
	}
	return s.rcvShareFrames() * uint32(max(sk.mss, 536))
}

// rcvShareFrames is a receiver's share of the receive depth, in frames (0:
// no limit).
func (s *Stack) rcvShareFrames() uint32 {
	if s.rxDepth == 0 {
		return 0
	}
	return max(uint32(s.rxDepth)*3/4/max(s.img.hdr.rcvActive, 1), rcvShareMin)
}
