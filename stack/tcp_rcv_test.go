package stack_test

import (
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// TestWindowUpdateAtRead checks when a read sends a window update of its
// own, as Linux has it (tcp_cleanup_rbuf): not while the window is open
// more than half way, where the reply's ACK carries the new edge (a
// request/response server would otherwise send a pure ACK a request), and
// once when reading reopens a window that had closed past half.
func TestWindowUpdateAtRead(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	const buf = 64 << 10
	if err := b.SetOption(srv, stack.RecvBuffer, buf); err != nil {
		t.Fatal(err)
	}
	ti, _ := b.TCPInfo(srv)
	mss := int(ti.MSS)
	unread := func(n int) func() bool {
		return func() bool { ti, _ := b.TCPInfo(srv); return int(ti.Unread) == n }
	}
	readAll := func(n int) (frames uint64) {
		t.Helper()
		before := b.Counters().TxFrames
		got, err := b.Recv(srv, make([]byte, n+1), false)
		if got != n || err != nil {
			t.Fatalf("recv: %d, %v; want %d bytes", got, err, n)
		}
		return b.Counters().TxFrames - before
	}

	// A request of four segments, read at once: the read sends nothing,
	// and the reply acknowledges the whole request.
	req := 3*mss + 100
	mustSend(t, a, c, make([]byte, req))
	waitFor(t, "the request", 5*time.Second, poll, unread(req))
	if n := readAll(req); n != 0 {
		t.Errorf("reading a %d-byte request from a %d-byte window sent %d frames, want 0", req, buf, n)
	}
	mustSend(t, b, srv, []byte("STORED\r\n"))
	waitAcked(t, a, c, poll, 2*time.Second)

	// Three quarters of the buffer, unread: the window left is under
	// half, and the read that empties the buffer announces it.
	waitAcked(t, b, srv, poll, 2*time.Second)
	fill := buf * 3 / 4
	mustSend(t, a, c, make([]byte, fill))
	waitFor(t, "the data", 5*time.Second, poll, unread(fill))
	if n := readAll(fill); n != 1 {
		t.Errorf("reading %d bytes from a %d-byte buffer sent %d frames, want 1 (the window update)", fill, buf, n)
	}
	mustSend(t, a, c, make([]byte, fill))
	if got := recvAll(b, srv, fill, 5*time.Second, poll); got != fill {
		t.Fatalf("after the update: %d of %d bytes arrived", got, fill)
	}
}
