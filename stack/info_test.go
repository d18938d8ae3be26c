package stack_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// TestTCPInfoAppBytes: TCPInfo's Read and Written count what the
// application read and wrote, not what crossed the wire: 0 and 0 on a
// connection whose data waits unread, then the bytes as they are read
// and written, a FIN either way counting for nothing (in the states
// that have the connection's sequence numbers: up to CLOSE-WAIT and
// FIN-WAIT-2 here). (The LD_PRELOAD
// shim tells a connection a forked child served, which its parent
// never used, by them.)
func TestTCPInfoAppBytes(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	want := func(what string, s *stack.Stack, id stack.SockID, read, written uint32) {
		t.Helper()
		ti, err := s.TCPInfo(id)
		if err != nil {
			t.Fatal(err)
		}
		if ti.Read != read || ti.Written != written {
			t.Errorf("%s: Read %d, Written %d; want %d and %d", what, ti.Read, ti.Written, read, written)
		}
	}
	want("a new connection, the server", b, srv, 0, 0)
	want("a new connection, the client", a, c, 0, 0)

	mustSend(t, a, c, []byte("request!"))
	want("the client's request queued", a, c, 0, 8)
	waitAcked(t, a, c, poll, 2*time.Second)
	want("the client's request acknowledged", a, c, 0, 8)
	waitFor(t, "the request", 2*time.Second, poll, func() bool { return b.Events(srv)&stack.Readable != 0 })
	want("the request arrived, unread", b, srv, 0, 0)

	buf := make([]byte, 5)
	if n, err := b.Recv(srv, buf, true); n != 5 || err != nil {
		t.Fatalf("peek: %d, %v", n, err)
	}
	want("the request peeked at", b, srv, 0, 0)
	if n, err := b.Recv(srv, buf, false); n != 5 || err != nil {
		t.Fatalf("read: %d, %v", n, err)
	}
	want("5 bytes of it read", b, srv, 5, 0)

	a.Shutdown(c, syscall.SHUT_WR)
	waitFor(t, "the client's FIN", 2*time.Second, poll, func() bool {
		n, err := b.Recv(srv, buf, false)
		return n == 0 && err == nil
	})
	want("the request read to its end", b, srv, 8, 0)
	mustSend(t, b, srv, []byte("answer"))
	waitAcked(t, b, srv, poll, 2*time.Second)
	want("the answer acknowledged", b, srv, 8, 6)
	want("the client, its FIN acknowledged", a, c, 0, 8)
}
