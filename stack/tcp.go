package stack

import (
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/timers"
	"github.com/xdp-onload/onload/vnic"
)

// TCP states, RFC 9293 section 3.3.2.
const (
	tcpClosed = iota
	tcpListen
	tcpSynSent
	tcpSynReceived
	tcpEstablished
	tcpFinWait1
	tcpFinWait2
	tcpCloseWait
	tcpClosing
	tcpLastAck
	tcpTimeWait
	tcpHandedOver // the kernel has the connection now (handover.go)
)

var tcpStateNames = [...]string{"CLOSED", "LISTEN", "SYN-SENT", "SYN-RECEIVED", "ESTABLISHED",
	"FIN-WAIT-1", "FIN-WAIT-2", "CLOSE-WAIT", "CLOSING", "LAST-ACK", "TIME-WAIT", "HANDED-OVER"}

func stateName(st uint8) string {
	if int(st) < len(tcpStateNames) {
		return tcpStateNames[st]
	}
	return "?"
}

// synchronized reports whether the state is past the handshake.
func synchronized(st uint8) bool { return st >= tcpEstablished && st <= tcpTimeWait }

// TCB flags.
const (
	tfNoDelay     = 1 << iota // TCP_NODELAY: no Nagle
	tfSackOK                  // both sides offered SACK
	tfTSOK                    // both sides offered timestamps
	tfWSOK                    // both sides offered window scaling
	tfFinQueued               // the user closed or shut down writing: FIN after the data
	tfFinSent                 // our FIN has been sent (sndMax covers it)
	tfRcvFin                  // the peer's FIN has been received
	tfAckNow                  // send an ACK at the end of this round
	tfDelAck                  // an ACK is owed, on the delayed-ACK timer
	tfShutRd                  // the user shut down reading
	tfOrphan                  // the user closed the socket; it lives on to finish
	tfKeepAlive               // SO_KEEPALIVE
	tfLinger0                 // SO_LINGER with a zero timeout: close resets
	tfReuseAddr               // SO_REUSEADDR
	tfPassive                 // made by a listener (SYN-RECEIVED child)
	tfAccepted                // handed to the user by Accept
	tfWindowProbe             // the send timer is the persist timer
	tfInAcceptQ               // a passive child in its listener\'s accept queue
	tfReordered               // the peer has seen reordering: RACK waits a reordering window
	tfUndo                    // the current recovery may yet be undone as spurious
	tfTLPOut                  // tail loss probes are out, unacknowledged (tlpCount of them)
	tfFinLost                 // a timeout found our FIN unacknowledged: send it again after the data
	tfHolding                 // HANDED-OVER: data segments are held for HandoverCatchUp
	tfCork                    // TCP_CORK: partial segments wait for more data
	tfPush                    // the next partial segment goes, whatever cork and Nagle say
	tfAutoCork                // the last partial segment waits for its sender's next wait (tcp_autocork.go)
	tfSynAgain                // SYN-SENT: our SYN went again at once, after our reset of an old connection's ACK
	tfPeerDelAck              // a probe of one segment proved needless: the peer delays its ACK longer than tlpDelAckWait
	tfPeerSlow                // a probe of several segments proved needless: the probe timeout is at least tlpMinPTOSlow
	tfDSack                   // a duplicate segment arrived: the next segment we send reports it (dsackStart, dsackEnd)
	tfPingPong                // we answer the peer's segments within the delayed-ACK time: a read leaves the ACK to the answer (windowUpdateLocked)
	tfLate                    // HANDED-OVER after HandoverCatchUp: segments are kept whole for EndHandover to give the kernel
)

// userClosed reports whether the user closed the socket (an unaccepted
// passive child is an orphan too, but one waiting for its user).
func (sk *sock) userClosed() bool {
	return sk.tflags&tfOrphan != 0 && (sk.tflags&tfAccepted != 0 || sk.tflags&tfPassive == 0)
}

// tcb is the TCP part of a socket slot, with RFC 9293's names.
type tcb struct {
	state  uint8
	sndWS  uint8 // shift applied to the peer's advertised window
	rcvWS  uint8 // shift the peer applies to ours
	dupAck uint8
	tflags uint32

	iss, irs       seqnum.Value
	sndUna, sndNxt seqnum.Value
	sndMax         seqnum.Value // highest sequence number sent, plus one
	sndWnd         uint32       // the peer's window, scaled
	sndWl1, sndWl2 seqnum.Value
	rcvNxt         seqnum.Value
	rcvAdv         seqnum.Value // right edge of the window we last advertised
	rcvSeen        seqnum.Value // rcvNxt at the last count of receivers (tcp_rcvshare.go)
	rcvSeenAt      uint32       // the count that saw rcvNxt move last
	rcvCounted     uint32       // the count of receivers that counted it, plus one (0: none)
	recover        seqnum.Value // NewReno: sndMax when fast recovery began
	// A segment received twice, for the D-SACK block of our next segment
	// (RFC 2883; tfDSack).
	dsackStart, dsackEnd seqnum.Value

	mss     uint16 // what we send in a segment
	peerMSS uint16

	tsRecent   uint32
	srtt       uint32 // µs; 0 until the first sample
	rttvar     uint32 // µs
	rto        uint32 // µs
	backoff    uint8
	retries    uint8
	keepProbes uint8
	_          uint8
	cwnd       uint32
	ssthresh   uint32

	// The send queue: frames of payload, oldest first; sndUnsent is the
	// first frame not yet sent. sndBytes counts every queued byte.
	sndHead, sndTail, sndUnsent vnic.Handle
	sndBytes                    uint32

	// The out-of-order queue: frames sorted by sequence number.
	oooHead   vnic.Handle
	oooBytes  uint32
	oooFrames uint32

	// Listening sockets: the accept queue (slot indices linked by
	// acceptNext) and counts against the backlog.
	acceptHead, acceptTail uint32
	acceptNext             uint32
	parent                 uint32 // the listener of a passive child
	acceptLen              uint16
	synLen                 uint16
	backlog                uint16
	_                      uint16

	keepIdle, keepIntvl uint32 // seconds
	keepCnt             uint32
	lastRcv             uint32 // tick (low 32 bits) of the last segment received
	synTime             uint32 // µs clock when our SYN was first sent

	// Lazy timers: the deadline that counts is here (0: not running); the
	// wheel timer may be armed earlier, and when it fires early it is
	// moved to the deadline. Steady traffic then re-arms and cancels
	// without touching the wheel.
	rtoAt    timers.Tick
	delAckAt timers.Tick

	// Loss recovery (tcp_sack.go, tcp_rack.go, tcp_recovery.go). The
	// scoreboard is in the send-queue frames' flags (afSacked, afLost,
	// afRexmit); these are its sums, in bytes.
	caState     uint8 // caOpen, caRecovery, caLoss
	ccAlgo      uint8 // ccCubic, ccReno
	timerMode   uint8 // what the RTO timer slot is armed for: tmRTO, tmTLP, tmReorder
	reoMult     uint8 // RACK reordering window, in quarters of the minimum RTT
	sackedBytes uint32
	lostBytes   uint32 // marked lost (retransmitted or not)
	rexmitBytes uint32 // marked lost and retransmitted since
	highSacked  seqnum.Value
	rackXmit    uint32 // RACK.xmit_ts: µs send time of the latest-sent delivered frame
	rackEnd     seqnum.Value
	rackRTT     uint32 // µs
	minRTT      uint32 // µs, 0 until the first sample
	// PRR (RFC 6937) during recovery.
	prrDelivered, prrOut, recoverFS uint32
	// Undo of a spurious recovery: the state before it, when it began (our
	// timestamp) and the retransmissions not yet shown spurious by DSACK.
	priorCwnd, priorSsthresh uint32
	undoTS, undoRetrans      uint32
	// Congestion control state (tcp_cc.go).
	cubWMax, cubOrigin  uint32 // bytes
	cubK, cubEpoch      uint32 // µs
	cubWEst             uint32 // bytes, the Reno-friendly estimate
	abcBytes            uint32 // NewReno: bytes acknowledged towards the next increase
	cubCarry            uint32 // CUBIC: growth carried to the next ACK, in 1/1024ths of a byte
	hsRoundEnd          seqnum.Value
	hsCurMin, hsLastMin uint32 // µs
	hsSamples           uint32
	lastSend            uint32 // µs clock of the last data segment sent
	cwndLimited         bool   // the last output stopped at the congestion window
	tlpCount            uint8  // tail loss probes sent since the last ACK of new data
	tlpProbe            uint8  // what the last probe sent again, its verdict awaited: tlpLone or tlpSeveral (0: none)
	_                   [2]byte
	tlpHigh             seqnum.Value // sndMax when that probe went (RFC 8985's TLP.end_seq)
	// RFC 5482 user timeout, in ms (0: off), and the ms clock when the
	// peer last acknowledged something or, with nothing in flight, when
	// sending began.
	userTimeout, progressAt uint32
	// Receive-buffer autotuning: the measurement's start (ms clock, and
	// rcvNxt then) and the least round trip seen from echoed timestamps.
	rcvSpaceAt, rcvRTT uint32
	rcvSpaceSeq        seqnum.Value
	// TCP_CORK: when the held data goes anyway (0: none).
	corkAt timers.Tick
	// TCP_DEFER_ACCEPT: on a listener, seconds; on a passive child in
	// SYN-RECEIVED, the ms clock (tsNow) until which a bare ACK does not
	// complete its handshake; 0 once it has (and none).
	deferAccept uint32
	// SO_RCVLOWAT and TCP_NOTSENT_LOWAT, bytes (0: unset, Linux's 1 and
	// the stack's net.ipv4.tcp_notsent_lowat, notsentLowatOf): the socket
	// is readable with rcvLowat bytes queued (rcvReady), writable with
	// less than half its TCP_NOTSENT_LOWAT unsent, and a send queues
	// while less than it is unsent.
	rcvLowat, notsentLowat uint32
}

// Congestion-avoidance states (Linux's names).
const (
	caOpen     = iota // no loss detected
	caRecovery        // fast recovery after a loss
	caLoss            // after a retransmission timeout
)

var caStateNames = [...]string{caOpen: "open", caRecovery: "recovery", caLoss: "loss"}

// What the RTO timer slot is armed for.
const (
	tmRTO     = iota // retransmission timeout (RFC 6298)
	tmTLP            // tail loss probe (RFC 8985 7)
	tmReorder        // RACK reordering timer (RFC 8985 6.3)
)

// Per-socket timers.
const (
	timerRTO    = 0 // retransmission, SYN retries, persist (zero window)
	timerDelAck = 1
	timerTW     = 2 // TIME-WAIT, FIN-WAIT-2 for orphans, keepalive
	timerCork   = 3 // TCP_CORK's ceiling
)

// corkCeiling is how long TCP_CORK holds data at most (tcp(7)).
const corkCeiling = 200 * time.Millisecond

// maxDeferAccept bounds TCP_DEFER_ACCEPT, in seconds: the SYN-ACK's
// retransmissions, which draw the ACK that ends a deferral, give up after
// about a minute (synRetries).
const maxDeferAccept = 60

func (s *Stack) sockTimer(sk *sock, n int) timers.ID {
	return timers.ID(s.slotOf(sk)*timersPerSock + uint32(n))
}

// Protocol parameters.
const (
	defaultMinRTO    = 200 * time.Millisecond
	maxRTO           = 120 * time.Second
	initialRTO       = time.Second // RFC 6298 2.1
	defaultDelAck    = 40 * time.Millisecond
	defaultTimeWait  = 60 * time.Second // 2MSL, MSL = 30s
	finWait2Timeout  = 60 * time.Second // an orphan's wait for the peer's FIN
	synRetries       = 6
	dataRetries      = 15
	initialCwnd      = 10 // segments, RFC 6928
	defaultBacklog   = 128
	keepIdleDefault  = 7200
	keepIntvlDefault = 75
	keepCntDefault   = 9
)

// Owner words of a send-queue frame.
const (
	auxSeq   = 0 // sequence number of the first payload byte
	auxLen   = 1 // payload length
	auxTime  = 2 // µs clock (low 32 bits) when last sent
	auxFlags = 3 // afRetransmitted, afSent
)

// auxFlags holds flags in its low byte and, above, the socket's slot: a
// frame the NIC refuses can be handed back to its socket as unsent.
const (
	afRetransmitted = 1 << 0 // sent more than once (Karn)
	afSent          = 1 << 1
	afSacked        = 1 << 2 // covered by a SACK block
	afLost          = 1 << 3 // marked lost
	afRexmit        = 1 << 4 // marked lost, and retransmitted since
	afQueued        = 1 << 5 // in this lock hold's transmit batch (txKeep), not yet the NIC's
	afSlotShift     = 8
)

// txPayload is where the payload of a send-queue frame starts, counted
// from Buf: room enough before it for Ethernet, IPv4 and the largest TCP
// header, so that each transmission writes its headers in place.
const (
	maxTCPHeader = 60
	txPayload    = 96 // >= ethLen + ipLen + maxTCPHeader, 8-aligned
)

func durationNs(ns uint64) time.Duration { return time.Duration(ns) }
