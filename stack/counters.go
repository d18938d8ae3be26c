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

	TxFrames      uint64 // frames handed to the NIC
	TxNoFrames    uint64 // sends refused: no free frame
	TxNoNeighbour uint64 // sends refused: next hop's Ethernet address unknown
	TxRingFull    uint64 // frames dropped: the NIC's transmit ring was full

	SocketsExhausted uint64 // socket creations refused: table full
	ImageCorrupt     uint64 // inconsistencies found in the image and stepped around
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
