package stack

import (
	"math"
	"time"
)

// Congestion control, per connection: CUBIC (RFC 9438, the default) or
// NewReno (RFC 5681, RFC 6582). Both grow the window only while the
// connection is limited by it (RFC 7661's point: an application-limited
// sender has not validated a larger window), and slow start counts bytes
// (ABC, RFC 3465, L = 2) and leaves early when the RTT climbs (HyStart,
// RFC 9406's delay rule).
const (
	ccCubic = iota
	ccReno
)

// Values of the Congestion option.
const (
	CongestionCubic = ccCubic
	CongestionReno  = ccReno
)

var congestionNames = [...]string{ccCubic: "cubic", ccReno: "reno"}

// congestionAlgo is the algorithm named name, or -1.
func congestionAlgo(name string) int {
	for i, n := range congestionNames {
		if n == name {
			return i
		}
	}
	return -1
}

const (
	cubicBeta = 0.7 // multiplicative decrease (RFC 9438 4.6)
	cubicC    = 0.4 // segments per second cubed (RFC 9438 5)
)

// ccSsthreshLocked is the slow-start threshold after a congestion event
// (RFC 5681 eq. 4 for NewReno; RFC 9438 4.6-4.7 for CUBIC, with fast
// convergence).
func (s *Stack) ccSsthreshLocked(sk *sock) uint32 {
	mss := uint32(sk.mss)
	sk.abcBytes, sk.cubCarry = 0, 0
	if sk.ccAlgo == ccReno {
		return max(sk.cwnd/2, 2*mss)
	}
	sk.cubEpoch = 0
	if sk.cwnd < sk.cubWMax {
		sk.cubWMax = uint32(float64(sk.cwnd) * (1 + cubicBeta) / 2)
	} else {
		sk.cubWMax = sk.cwnd
	}
	return max(uint32(float64(sk.cwnd)*cubicBeta), 2*mss)
}

// ccAckLocked grows the window for acked bytes newly delivered, outside
// recovery.
func (s *Stack) ccAckLocked(sk *sock, acked uint32, now uint32) {
	if !sk.cwndLimited || acked == 0 {
		return
	}
	mss := uint32(sk.mss)
	defer s.sndAutotuneLocked(sk)
	if sk.cwnd < sk.ssthresh {
		sk.cwnd += min(acked, 2*mss) // ABC, L = 2
		return
	}
	if sk.ccAlgo == ccReno {
		// Congestion avoidance by byte counting (RFC 3465 2.1).
		sk.abcBytes += acked
		if sk.abcBytes >= sk.cwnd {
			sk.abcBytes -= sk.cwnd
			sk.cwnd += mss
		}
		return
	}
	s.cubicAckLocked(sk, acked, now)
}

// cubicAckLocked is CUBIC's congestion avoidance (RFC 9438 4.2-4.5).
func (s *Stack) cubicAckLocked(sk *sock, acked uint32, now uint32) {
	mss := float64(sk.mss)
	cwnd := float64(sk.cwnd)
	if sk.cubEpoch == 0 {
		sk.cubEpoch = max(now, 1)
		if sk.cwnd < sk.cubWMax {
			k := math.Cbrt((float64(sk.cubWMax) - cwnd) / mss / cubicC)
			sk.cubK = uint32(k * 1e6)
			sk.cubOrigin = sk.cubWMax
		} else {
			sk.cubK, sk.cubOrigin = 0, sk.cwnd
		}
		sk.cubWEst = sk.cwnd
		sk.cubCarry = 0
	}
	rtt := sk.minRTT
	if rtt == 0 {
		rtt = sk.srtt
	}
	t := (float64(now-sk.cubEpoch) + float64(rtt) - float64(sk.cubK)) / 1e6
	target := float64(sk.cubOrigin) + cubicC*t*t*t*mss
	target = min(max(target, cwnd), 1.5*cwnd)
	// The Reno-friendly region (RFC 9438 4.3): W_est grows by alpha
	// segments per window acknowledged.
	alpha := 3 * (1 - cubicBeta) / (1 + cubicBeta)
	if sk.cubWEst >= sk.cubWMax {
		alpha = 1
	}
	sk.cubWEst += uint32(alpha * float64(acked) * mss / cwnd)
	if w := float64(sk.cubWEst); w > target {
		target = w
	}
	// cwnd grows by (target - cwnd) / cwnd per byte acknowledged; the
	// fraction of a byte left over carries in cubCarry (in 1/1024ths).
	inc := (target-cwnd)*float64(acked)/cwnd*1024 + float64(sk.cubCarry)
	sk.cwnd += uint32(inc / 1024)
	sk.cubCarry = uint32(math.Mod(inc, 1024))
}

// hystartLocked watches the RTT in slow start (RFC 9406 4.2, the delay
// rule, without the conservative phase): when a round's minimum RTT
// exceeds the last round's by an eighth (between 4 and 16 ms), the queue
// is filling, and slow start ends before it overflows.
func (s *Stack) hystartLocked(sk *sock, rtt uint32) {
	if sk.cwnd >= sk.ssthresh || sk.caState != caOpen {
		return
	}
	if sk.hsRoundEnd.LessThanEq(sk.sndUna) {
		sk.hsLastMin, sk.hsCurMin, sk.hsSamples = sk.hsCurMin, math.MaxUint32, 0
		sk.hsRoundEnd = sk.sndMax
	}
	sk.hsCurMin = min(sk.hsCurMin, rtt)
	sk.hsSamples++
	if sk.cwnd < 16*uint32(sk.mss) || sk.hsSamples < 8 || sk.hsLastMin == 0 || sk.hsLastMin == math.MaxUint32 {
		return
	}
	eta := min(max(sk.hsLastMin/8, uint32(4*time.Millisecond/time.Microsecond)), uint32(16*time.Millisecond/time.Microsecond))
	if sk.hsCurMin >= sk.hsLastMin+eta {
		sk.ssthresh = sk.cwnd
	}
}

// restartAfterIdleLocked shrinks a window that went unused for longer than
// the RTO: it no longer says what the path can take (RFC 7661 5, in
// Linux's form: halved per RTO of idleness, never below the initial
// window).
func (s *Stack) restartAfterIdleLocked(sk *sock, now uint32) {
	if sk.sndUna != sk.sndMax || sk.lastSend == 0 || sk.caState != caOpen {
		return
	}
	idle := now - sk.lastSend
	rto := s.rtoNow(sk)
	if idle < rto {
		return
	}
	iw := initialCwnd * uint32(sk.mss)
	sk.ssthresh = max(sk.ssthresh, sk.cwnd*3/4)
	for ; idle >= rto && sk.cwnd > iw; idle -= rto {
		sk.cwnd /= 2
	}
	sk.cwnd = max(sk.cwnd, iw)
	sk.cubEpoch = 0
}

// rcvBufMax is how far sk's receive buffer may grow.
func (s *Stack) rcvBufMax(sk *sock) uint32 {
	if sk.flags&sfRcvBufSet != 0 {
		return sk.rcvBuf
	}
	return max(s.img.hdr.recvMax, sk.rcvBuf)
}

// rcvAutotuneLocked grows the receive buffer to twice what arrived in
// order in the last round trip (Linux's dynamic right-sizing,
// tcp_rcv_space_adjust): a sender limited by our window delivers a whole
// window per round trip, so its buffer doubles each round trip until the
// window stops being the limit, up to RecvBufferMax. The round trip is
// measured from the timestamps the peer echoes (ms; without timestamps, 1
// ms, which only grows buffers on fast paths). The window scale was
// chosen for the maximum at the handshake. Called with in-order data just
// taken; tsEcr is the segment's echoed timestamp (0: none).
func (s *Stack) rcvAutotuneLocked(sk *sock, tsEcr uint32) {
	if sk.flags&sfRcvBufSet != 0 {
		return
	}
	now := s.tsNow()
	if tsEcr != 0 {
		if r := now - tsEcr; r < 60_000 && (sk.rcvRTT == 0 || r < sk.rcvRTT) {
			sk.rcvRTT = max(r, 1)
		}
	}
	if sk.rcvSpaceAt == 0 {
		sk.rcvSpaceAt, sk.rcvSpaceSeq = max(now, 1), sk.rcvNxt
		return
	}
	if now-sk.rcvSpaceAt < max(sk.rcvRTT, 1) {
		return
	}
	got := uint32(sk.rcvSpaceSeq.Size(sk.rcvNxt))
	sk.rcvSpaceAt, sk.rcvSpaceSeq = max(now, 1), sk.rcvNxt
	lim := s.rcvBufMax(sk)
	if lim>>sk.rcvWS > 0xffff {
		lim = 0xffff << sk.rcvWS
	}
	if want := 2 * got; want > sk.rcvBuf && sk.rcvBytes <= sk.rcvBuf/2 && !s.framesTightLocked() {
		sk.rcvBuf = min(want, lim)
	}
}

// sndAutotuneLocked keeps the send buffer at twice the congestion window
// (room for a window in flight and the next one queued, as Linux's
// tcp_sndbuf_expand), up to SendBufferMax.
func (s *Stack) sndAutotuneLocked(sk *sock) {
	if sk.flags&sfSndBufSet != 0 || sk.sndBuf >= 2*sk.cwnd || s.framesTightLocked() {
		return
	}
	sk.sndBuf = max(sk.sndBuf, min(2*sk.cwnd, s.img.hdr.sendMax))
}
