package stack

import (
	"fmt"
	"reflect"
	"strings"
)

// Counters count what the stack did and refused, in the image (a second
// process sees them). Field names are the metric names.
type Counters struct {
	RxFrames         uint64 // frames taken from the NIC
	RxNotIPv4        uint64 // frames that are not IPv4: dropped
	RxBadIPHeader    uint64 // IPv4 header truncated, bad length or version: dropped
	RxBadIPChecksum  uint64 // IPv4 header checksum wrong: dropped
	RxFragments      uint64 // IPv4 fragments: not reassembled, dropped
	RxNotForUs       uint64 // IPv4 destination not our address: dropped
	RxOtherProto     uint64 // neither TCP nor UDP: dropped
	RxUDP            uint64 // UDP datagrams delivered to a socket
	RxUDPBadChecksum uint64 // UDP checksum wrong, or truncated: dropped
	RxUDPNoSocket    uint64 // UDP to a port nobody has: dropped
	RxUDPQueueFull   uint64 // UDP receive queue full: dropped

	RxTCP            uint64 // TCP segments taken in by a socket
	RxTCPBadChecksum uint64 // TCP checksum wrong: dropped
	RxTCPBadHeader   uint64 // TCP header truncated or data offset wrong: dropped
	RxTCPNoSocket    uint64 // TCP to a port nobody has: answered with a reset
	RxTCPOutOfWindow uint64 // segments outside the receive window: acknowledged and dropped
	RxTCPPAWS        uint64 // segments with a timestamp older than the last (RFC 7323 PAWS): acknowledged and dropped
	RxTCPOutOfOrder  uint64 // segments queued out of order
	RxTCPDuplicate   uint64 // segments whose data was all received already
	RxTCPBufferFull  uint64 // data dropped: receive buffer full
	RxLowFrames      uint64 // data dropped: the frame pool is down to its reserve
	RxTCPResets      uint64 // resets accepted
	RxTCPBadAck      uint64 // acknowledgements of data never sent: acknowledged and dropped

	TCPActiveOpens          uint64 // connections we initiated
	TCPPassiveOpens         uint64 // connections accepted
	TCPListenDrops          uint64 // SYNs dropped: accept queue full (or SYN queue full with SYN cookies off)
	TCPSynCookiesSent       uint64 // SYN-ACKs sent with a SYN cookie: the SYN queue was full (RFC 4987)
	TCPSynCookiesOK         uint64 // connections made from a valid SYN cookie
	TCPSynCookiesFailed     uint64 // ACKs to a listener with no valid cookie: answered with a reset
	TCPChallengeAcks        uint64 // challenge ACKs sent for in-window RSTs and SYNs (RFC 5961)
	TCPChallengeAcksLimited uint64 // challenge ACKs not sent: over the per-second limit
	TCPEstablished          uint64 // connections that reached ESTABLISHED
	TCPTimeouts             uint64 // connections that gave up retransmitting
	TCPRetransmits          uint64 // segments sent again
	TCPFastRetrans          uint64 // fast recoveries entered (SACK/RACK loss detection, or three duplicate ACKs)
	TCPRTOs                 uint64 // retransmission timeouts
	TCPWindowProbes         uint64 // zero-window probes sent on the persist timer
	TCPSackRecovered        uint64 // bytes newly covered by SACK blocks
	TCPDSacks               uint64 // D-SACK blocks received: a segment arrived twice (RFC 2883)
	TCPBadSacks             uint64 // SACK blocks outside what is in flight: ignored
	TCPRackLost             uint64 // segments RACK marked lost (RFC 8985)
	TCPTLPs                 uint64 // tail loss probes sent (RFC 8985 7)
	TCPTLPSpurious          uint64 // tail loss probes a D-SACK proved needless: the peer was slower to ACK than the probe allowed, and now gets longer
	TCPUndos                uint64 // recoveries undone as spurious (timestamps, RFC 3522, or D-SACK)
	TCPPredicted            uint64 // segments taken by header prediction, the in-order fast path
	TCPTimeWaitReuse        uint64 // TIME-WAIT sockets recycled for a new socket
	TCPHandovers            uint64 // connections handed over to the kernel (handover.go)
	TCPHandoverDrops        uint64 // data segments of a connection being handed over that could not be kept: the peer sends them again
	TCPHandoverLate         uint64 // segments that came after a handover's catch-up, given to the kernel's socket as the peer's (EndHandover)
	TxTCPResets             uint64 // resets sent

	TxFrames      uint64 // frames handed to the NIC
	TxNoFrames    uint64 // sends refused: no free frame
	TxNoNeighbour uint64 // sends refused: next hop's Ethernet address unknown
	TxRingFull    uint64 // frames dropped: the NIC's transmit ring was full
	LoopFrames    uint64 // frames to the stack's own address, taken in without the NIC
	LoopDropped   uint64 // such frames dropped: too many waiting, or no free frame

	SocketsExhausted uint64 // socket creations refused: table full
	SocketsOverflow  uint64 // times the table filled with live sockets and new connections went to the kernel (Options.Overflow)
	ImageCorrupt     uint64 // inconsistencies found in the image and stepped around
}

// Sub is c - before, counter by counter: what happened between two
// readings.
func (c Counters) Sub(before Counters) Counters {
	a, b := reflect.ValueOf(&c).Elem(), reflect.ValueOf(before)
	for i := range a.NumField() {
		a.Field(i).SetUint(a.Field(i).Uint() - b.Field(i).Uint())
	}
	return c
}

// String lists the non-zero counters as name=value.
func (c *Counters) String() string {
	var b strings.Builder
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		if n := v.Field(i).Uint(); n != 0 {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s=%d", v.Type().Field(i).Name, n)
		}
	}
	if b.Len() == 0 {
		return "(all zero)"
	}
	return b.String()
}
