package stack

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
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
	pollUntil(t, "a connection accepted", func() bool { var err error; srv, err = b.Accept(l); return err == nil }, a, b)
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

// TestTimeWaitList checks the TIME-WAIT list, from which a full table
// recycles a connection without a look through the table: it holds
// every connection in TIME-WAIT in the order they entered it; the
// recycle takes the first whose user has closed it, passing over one the
// user still holds; a connection leaves the list as it leaves TIME-WAIT;
// and with the list's head broken in the image, the recycle counts it
// and still finds the connection closest to its end.
func TestTimeWaitList(t *testing.T) {
	a, b, _ := memStacks(t, nil)
	until := func(what string, ok func() bool) { t.Helper(); pollUntil(t, what, ok, a, b) }
	l, _ := b.Open(TCP)
	if err := b.Bind(l, netip.AddrPortFrom(netip.Addr{}, 80)); err != nil {
		t.Fatal(err)
	}
	if err := b.Listen(l, 0); err != nil {
		t.Fatal(err)
	}
	// state reads the slot: a connection its user closed is no longer
	// the user's to ask about (TCPInfo).
	state := func(id SockID) string {
		a.lock()
		defer a.unlock()
		if sk := &a.img.socks[id.index()]; sk.gen == id.gen() && sk.kind == kindTCP {
			return stateName(sk.state)
		}
		return "gone"
	}
	// Five connections into TIME-WAIT on a, one after another: the first
	// by a shutdown (its user still holds it), the others by a close.
	var conns []SockID
	for i := range 5 {
		c, _ := a.Open(TCP)
		a.Connect(c, netip.AddrPortFrom(b.Addr(), 80))
		var srv SockID
		until("accept", func() bool { var err error; srv, err = b.Accept(l); return err == nil })
		if i == 0 {
			a.Shutdown(c, 1) // SHUT_WR
		} else {
			a.Close(c)
		}
		until("the peer's end", func() bool { _, err := b.Recv(srv, make([]byte, 8), false); return err == nil })
		b.Close(srv)
		until(fmt.Sprintf("TIME-WAIT for connection %d (in %s)", i, state(c)), func() bool { return state(c) == "TIME-WAIT" })
		conns = append(conns, c)
	}
	list := func() []int {
		a.lock()
		defer a.unlock()
		var slots []int
		for i, n := a.img.hdr.twHead, 0; i != noSlot && n < 10; n++ {
			slots = append(slots, int(i))
			i = a.img.socks[i].twNext
		}
		return slots
	}
	want := func(ids ...int) {
		t.Helper()
		var slots []int
		for _, i := range ids {
			slots = append(slots, conns[i].Slot())
		}
		if got := list(); !slices.Equal(got, slots) {
			t.Fatalf("TIME-WAIT list %v, want the slots of connections %v: %v", got, ids, slots)
		}
	}
	want(0, 1, 2, 3, 4)
	recycle := func() {
		t.Helper()
		a.lock()
		ok := a.recycleTimeWaitLocked()
		a.unlock()
		if !ok {
			t.Fatal("nothing recycled")
		}
	}
	recycle()
	if state(conns[0]) != "TIME-WAIT" || state(conns[1]) != "gone" {
		t.Fatalf("recycled: connection 0 %s, 1 %s; want the first the user closed, 1, gone", state(conns[0]), state(conns[1]))
	}
	want(0, 2, 3, 4)
	a.Close(conns[0]) // now closed by its user too: the oldest to go
	recycle()
	want(2, 3, 4)

	a.lock()
	a.img.hdr.twHead = uint32(len(a.img.socks)) + 5
	a.unlock()
	before := a.Counters().ImageCorrupt
	recycle()
	if a.Counters().ImageCorrupt == before {
		t.Fatal("the broken list was not counted (ImageCorrupt)")
	}
	if state(conns[2]) == "TIME-WAIT" && state(conns[3]) == "TIME-WAIT" && state(conns[4]) == "TIME-WAIT" {
		t.Fatal("with the list broken, nothing was recycled")
	}
}
