package stack_test

import (
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// TestWindowUpdateAtRead checks when a read sends a segment of its own,
// as Linux has it (tcp_cleanup_rbuf): on a connection that answers what
// it reads (request and response), not while the window is open more
// than half way, where the answer carries the ACK and the new edge (a
// server would otherwise send a pure ACK a request); once when reading
// reopens a window that had closed past half; and on a connection that
// answers nothing, the ACK its last segment waits for, at the read that
// empties the queue.
func TestWindowUpdateAtRead(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	a.SetOption(c, stack.NoDelay, 1) // a request's tail does not wait for the ACK of its head
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
	request := func(n int) {
		t.Helper()
		mustSend(t, a, c, make([]byte, n))
		waitFor(t, "the request", 5*time.Second, poll, unread(n))
	}

	// The server has answered nothing: its read acknowledges at once.
	request(100)
	if n := readAll(100); n != 1 {
		t.Errorf("reading a segment on a connection that answers nothing sent %d frames, want 1 (its ACK)", n)
	}
	mustSend(t, b, srv, []byte("STORED\r\n"))
	waitAcked(t, a, c, poll, 2*time.Second)

	// Now it answers: a request of three segments, read at once, draws
	// nothing from the read, and the answer acknowledges all of it.
	req := 2*mss + 100
	request(req)
	if n := readAll(req); n != 0 {
		t.Errorf("reading a %d-byte request from a %d-byte window sent %d frames, want 0", req, buf, n)
	}
	mustSend(t, b, srv, []byte("STORED\r\n"))
	waitAcked(t, a, c, poll, 2*time.Second)

	// A segment it leaves unanswered past the delayed-ACK time: the
	// timer acknowledges it, and the server no longer counts as
	// answering.
	request(100)
	for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
		b.Poll() // past the delayed ACK's 40 ms, the client silent
	}
	waitAcked(t, a, c, poll, 2*time.Second)
	readAll(100)
	request(100)
	if n := readAll(100); n != 1 {
		t.Errorf("reading a segment after a delayed ACK went unanswered sent %d frames, want 1 (its ACK)", n)
	}
	mustSend(t, b, srv, []byte("STORED\r\n")) // answering again

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
