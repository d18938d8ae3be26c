package stack_test

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/xdp-onload/onload/vnic"
)

// TestTCPLoopback: a connection between two sockets of one stack (its own
// address to its own address) is carried inside the stack: data both
// ways, byte-exact, an orderly close, and not one frame on the wire.
func TestTCPLoopback(t *testing.T) {
	a, _, nicA, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := func() { a.Poll() }
	if a.Listening(netip.AddrPortFrom(a.Addr(), 80)) {
		t.Fatal("Listening before anything listens")
	}
	before := nicA.Stats().TxFrames
	c, s := connectPair(t, a, a, poll)
	if !a.Listening(netip.AddrPortFrom(a.Addr(), 80)) {
		t.Error("Listening is false for the listener connectPair made")
	}
	for _, size := range []int{1, 1460, 1461, 3 << 20} {
		data := randomBytes(size, uint64(size))
		if got := transfer(t, a, c, a, s, data, poll, 10*time.Second); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes client->server differ", size)
		}
		if got := transfer(t, a, s, a, c, data, poll, 10*time.Second); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes server->client differ", size)
		}
	}
	a.Close(c)
	waitFor(t, "the server's end of stream", 5*time.Second, poll, func() bool { return eof(a, s) })
	a.Close(s)
	if sent := nicA.Stats().TxFrames - before; sent != 0 {
		t.Errorf("the NIC sent %d frames for a connection within the stack", sent)
	}
	cs := a.Counters()
	if cs.LoopFrames == 0 || cs.LoopDropped != 0 || cs.TCPRetransmits != 0 {
		t.Errorf("looped %d frames, dropped %d, retransmitted %d: want some, none, none", cs.LoopFrames, cs.LoopDropped, cs.TCPRetransmits)
	}
}
