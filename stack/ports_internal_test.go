package stack

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

// TestPortChains checks that a bind finds every socket on its port
// through the port chains (sock.go) as a look through the whole table
// did: after the chain's head and a middle link go, with the freed slot
// bound again on another chain; with a listener's connection outliving
// the listener; with UDP beside TCP on one port; and, with a link of the
// chain broken in the image, through the whole table.
func TestPortChains(t *testing.T) {
	a, b, _ := memStacks(t, nil)
	stride := uint16(len(b.img.ports)) // ports this far apart share a chain
	const p = 5000
	open := func(proto Proto) SockID {
		t.Helper()
		id, err := b.Open(proto)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// bind binds a new TCP socket to port; the socket is closed if the
	// bind fails.
	bind := func(port uint16) (SockID, error) {
		t.Helper()
		id := open(TCP)
		err := b.Bind(id, netip.AddrPortFrom(netip.Addr{}, port))
		if err != nil {
			b.Close(id)
		}
		return id, err
	}
	mustBind := func(port uint16) SockID {
		t.Helper()
		id, err := bind(port)
		if err != nil {
			t.Fatalf("bind port %d: %v", port, err)
		}
		return id
	}
	inUse := func(port uint16, why string) {
		t.Helper()
		if _, err := bind(port); !errors.Is(err, ErrAddrInUse) {
			t.Fatalf("bind port %d (%s): %v, want EADDRINUSE", port, why, err)
		}
	}
	free := func(port uint16, why string) {
		t.Helper()
		id, err := bind(port)
		if err != nil {
			t.Fatalf("bind port %d (%s): %v, want it free", port, why, err)
		}
		b.Close(id)
	}

	mustBind(p)
	s2 := mustBind(p + stride)
	s3 := mustBind(p + 2*stride)
	inUse(p, "bound")

	// The chain's head goes, and its slot comes back at once, bound to a
	// port of another chain.
	b.Close(s3)
	if s5 := mustBind(p + 1); s5.Slot() != s3.Slot() {
		t.Fatalf("the freed slot %d did not come back (got %d): the test needs it to", s3.Slot(), s5.Slot())
	}
	inUse(p, "bound, behind a freed head")
	inUse(p+stride, "bound, behind a freed head")
	free(p+2*stride, "its socket closed")

	// A link in the middle goes.
	b.Close(s2)
	free(p+stride, "its socket closed")
	inUse(p, "bound, behind a freed link")

	// A listener's connection holds its port after the listener goes, as
	// Linux's does against a bind without SO_REUSEADDR.
	lp := p + 3*stride
	l := mustBind(lp)
	if err := b.Listen(l, 0); err != nil {
		t.Fatal(err)
	}
	c, _ := a.Open(TCP)
	a.Connect(c, netip.AddrPortFrom(b.Addr(), lp))
	var srv SockID
	for end := time.Now().Add(5 * time.Second); ; {
		var err error
		if srv, err = b.Accept(l); err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no connection accepted in 5s")
		}
		a.Poll()
		b.Poll()
	}
	b.Close(l)
	inUse(lp, "an accepted connection on it")
	_ = srv

	// Another kind on the same port.
	u := open(UDP)
	if err := b.Bind(u, netip.AddrPortFrom(netip.Addr{}, p)); err != nil {
		t.Fatalf("UDP bind of a port a TCP socket has: %v", err)
	}

	// A link broken in the image: the chain's head points out of the
	// table, and the bind still finds the socket behind it.
	head := mustBind(p + 4*stride)
	b.lock()
	b.img.socks[head.Slot()].portNext = uint32(len(b.img.socks)) + 7
	b.unlock()
	before := b.Counters().ImageCorrupt
	inUse(p, "bound, behind a broken link")
	if b.Counters().ImageCorrupt == before {
		t.Fatal("the broken link was not counted (ImageCorrupt)")
	}
}
