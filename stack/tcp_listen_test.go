package stack_test

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// hookFilters calls onAdd as a port is steered to the stack: inside
// bind, under the stack lock.
type hookFilters struct{ onAdd *func() }

func (h hookFilters) AddListener(stack.Proto, netip.AddrPort) error {
	if f := *h.onAdd; f != nil {
		*h.onAdd = nil
		f()
	}
	return nil
}

func (hookFilters) RemoveListener(stack.Proto, netip.AddrPort) error { return nil }

// TestBindListenNoWindow checks that BindListen leaves no moment in which
// the port is steered to the stack and its socket does not listen: a SYN
// that arrives as the port is steered, taken by another thread's poll
// that waits on the lock meanwhile, finds a listener and is answered
// with a SYN-ACK, not a reset. (The shim accelerates a listener the
// program has made in the kernel, and a cluster's member joins while the
// others serve: a reset there refuses a connection to a port that
// listens.)
func TestBindListenNoWindow(t *testing.T) {
	var onAdd func()
	a, na, nb := memPair(t, vnic.MemConfig{})
	b := peerStack(t, na, nb, stack.Config{}, stack.Options{Filters: hookFilters{&onAdd}})
	c, err := a.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	l, err := b.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	polled := make(chan struct{})
	onAdd = func() {
		if err := a.Connect(c, netip.AddrPortFrom(b.Addr(), 80)); !errors.Is(err, syscall.EINPROGRESS) {
			t.Errorf("connect: %v, want EINPROGRESS", err)
		}
		a.Poll() // the SYN is on the wire
		go func() {
			b.Poll() // another thread of the server's: it waits for the lock
			close(polled)
		}()
		time.Sleep(20 * time.Millisecond)
	}
	if err := b.BindListen(l, netip.AddrPortFrom(netip.Addr{}, 80), 16); err != nil {
		t.Fatal(err)
	}
	<-polled
	poll := pollBoth(a, b)
	waitFor(t, "the connection", 5*time.Second, poll, func() bool { return a.Events(c)&(stack.Writable|stack.Error|stack.Hangup) != 0 })
	if err := a.SockError(c); err != nil {
		t.Fatalf("the client's connect: %v (a SYN taken between bind and listen draws a reset)", err)
	}
	waitFor(t, "accept", 5*time.Second, poll, func() bool { _, err := b.Accept(l); return err == nil })
}
