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

// TestCookieTimestamp holds the options a cookie SYN-ACK's timestamp
// carries: every window scale and none, with and without SACK, at clock
// values on either side of a 64 ms boundary, read back from the echo as
// they went in, and never a TSval ahead of the clock. An echo from the
// future is refused.
func TestCookieTimestamp(t *testing.T) {
	for _, now := range []uint32{0x1000, 0x103f, 0x1040, 0xffffffc0, 5} {
		for ws := int8(-1); ws <= 14; ws++ {
			for _, sack := range []bool{false, true} {
				in := tcpOpts{ws: ws, sackOK: sack, ts: true, tsVal: 777}
				ts := cookieTS(now, &in)
				if int32(ts-now) > 0 || now-ts > cookieTSMask {
					t.Fatalf("now %#x: TSval %#x ahead of the clock or more than 63 ms behind", now, ts)
				}
				g := segment{opts: tcpOpts{ts: true, tsVal: 999, tsEcr: ts}}
				out, ok := cookieOptions(now+100, &g)
				if !ok || out.ws != ws || out.sackOK != sack || !out.ts || out.tsVal != 999 {
					t.Fatalf("now %#x ws %d sack %v: read back %+v, %v", now, ws, sack, out, ok)
				}
			}
		}
	}
	g := segment{opts: tcpOpts{ts: true, tsEcr: 2000}}
	if _, ok := cookieOptions(1000, &g); ok {
		t.Error("an echo from the future was taken")
	}
	if o, ok := cookieOptions(1000, &segment{}); !ok || o.ws != -1 || o.sackOK || o.ts {
		t.Errorf("no timestamp: %+v, %v; want no options", o, ok)
	}
}

// TestSockFlagsDistinct: every socket flag is a bit of its own. (The wake
// flag once shared sfRcvBufSet's: a listener's waiting Accept turned
// receive autotuning off for every connection it accepted.)
func TestSockFlagsDistinct(t *testing.T) {
	flags := map[string]uint16{
		"sfBound": sfBound, "sfConnected": sfConnected, "sfHashed": sfHashed, "sfRemoteMAC": sfRemoteMAC,
		"sfRcvBufSet": sfRcvBufSet, "sfSndBufSet": sfSndBufSet, "sfWake": sfWake,
		"sfPortHolder": sfPortHolder, "sfPortRetired": sfPortRetired, "sfTimeWaitList": sfTimeWaitList, "sfFlowSteered": sfFlowSteered, "sfListenRetired": sfListenRetired,
	}
	var seen uint16
	for name, f := range flags {
		if f == 0 || f&(f-1) != 0 {
			t.Errorf("%s = %#x: not one bit", name, f)
		}
		if seen&f != 0 {
			t.Errorf("%s = %#x: a bit another flag has", name, f)
		}
		seen |= f
	}
}
