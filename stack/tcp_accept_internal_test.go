package stack

import (
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"
)

// TestAcceptable is the segment acceptance table of RFC 9293 3.10.7.4,
// with the right edge allowed for empty segments.
func TestAcceptable(t *testing.T) {
	const nxt = seqnum.Value(1000)
	for _, c := range []struct {
		seq  seqnum.Value
		len  seqnum.Size
		wnd  seqnum.Size
		want bool
	}{
		{1000, 0, 0, true},     // zero window: only RCV.NXT
		{1001, 0, 0, false},    //
		{999, 0, 0, false},     //
		{1000, 0, 100, true},   // left edge
		{1099, 0, 100, true},   // inside
		{1100, 0, 100, true},   // right edge: a pure ACK from a peer past our window
		{1101, 0, 100, false},  // beyond it
		{999, 0, 100, false},   // old
		{1000, 10, 0, false},   // data into a zero window
		{990, 20, 100, true},   // overlaps the left edge
		{1099, 10, 100, true},  // starts inside
		{1100, 10, 100, false}, // starts at the right edge
		{980, 20, 100, false},  // entirely old
	} {
		if got := acceptable(c.seq, c.len, nxt, c.wnd); got != c.want {
			t.Errorf("seq %d len %d wnd %d (RCV.NXT %d): acceptable %v, want %v", c.seq, c.len, c.wnd, nxt, got, c.want)
		}
	}
}
