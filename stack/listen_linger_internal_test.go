package stack

import (
	"net/netip"
	"testing"
	"time"
)

// TestRetiredListenerLingers: a listener retired as its socket went to
// another process (RetireListener), then closed by its process while a
// connection waits in its queue, stays for listenLinger on a stack
// processes share: the process it went to takes it (ShareListener) and
// accepts the connection, as it would from the socket they share on the
// kernel. Nobody taking it, the connection is reset at the end, as at a
// close. Before, the close reset it at once: a server's reload (haproxy's
// passes its listener and closes its copy) lost the connections that came
// just before it.
func TestRetiredListenerLingers(t *testing.T) {
	a, b, ma := memStacks(t, nil)
	// h is the process the listener goes to, a the one that passes it:
	// two processes of one stack (two slots).
	h := Attach(a.img, ma, Options{})
	if err := h.JoinWakes(); err != nil {
		t.Fatal(err)
	}
	defer h.LeaveWakes()
	a.joined.Store(h.joined.Load() + 1)
	poll := func() { a.Poll(); b.Poll() }
	wait := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); !cond(); poll() {
			if time.Now().After(end) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	// queued makes a listener on port, dials it from b, and retires and
	// closes it with the connection in its queue; it returns b's end.
	queued := func(port uint16) SockID {
		t.Helper()
		lst, c := listenDial(t, a, b, port)
		wait("the connection queued", func() bool { return a.Events(lst)&Readable != 0 && b.Events(c)&Writable != 0 })
		if err := a.RetireListener(lst); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(lst); err != nil {
			t.Fatal(err)
		}
		for range 10 {
			poll()
		}
		if b.Events(c)&Error != 0 {
			t.Fatalf("port %d: the queued connection was reset as its retired listener closed: %v", port, b.SockError(c))
		}
		return c
	}

	c := queued(80)
	id, ok := h.ShareListener(netip.AddrPortFrom(netip.Addr{}, 80))
	if !ok {
		t.Fatal("the process the listener went to could not take it")
	}
	srv, err := h.Accept(id)
	if err != nil {
		t.Fatalf("accept of the connection the listener kept: %v", err)
	}
	if _, err := b.Send(c, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	wait("the data", func() bool { return h.Events(srv)&Readable != 0 })
	time.Sleep(listenLinger + 100*time.Millisecond)
	poll()
	if b.Events(c)&Error != 0 || h.Events(id)&Error != 0 {
		t.Fatalf("the listener taken, or its connection, ended after %v: %v", listenLinger, b.SockError(c))
	}

	c = queued(81)
	start := time.Now()
	wait("the reset of a connection whose retired listener nobody took", func() bool { return b.Events(c)&Error != 0 })
	if d := time.Since(start); d < listenLinger/2 {
		t.Fatalf("the connection was reset %v after its listener closed, want about %v", d, listenLinger)
	}
}
