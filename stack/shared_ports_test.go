package stack_test

import (
	"errors"
	"io"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// filterLog records a stack's filter requests.
type filterLog struct{ added, removed []netip.AddrPort }

func (f *filterLog) AddListener(p stack.Proto, local netip.AddrPort) error {
	f.added = append(f.added, local)
	return nil
}

func (f *filterLog) RemoveListener(p stack.Proto, local netip.AddrPort) error {
	f.removed = append(f.removed, local)
	return nil
}

// TestConnectShared: connections from shared local ports (HoldPort,
// ConnectShared) to gVisor's netstack. Each port is steered once, by its
// holder's bind: connections to different peers share a port, a second
// connection to the same peer takes the next port, and with every port
// carrying one to that peer ConnectShared refuses (EADDRNOTAVAIL) and
// binds nothing. A connection in TIME-WAIT gives its four-tuple up to the
// next. A plain bind of a held port is refused; the port's filter stays
// while its connections come and go, and goes with the last socket on it.
func TestConnectShared(t *testing.T) {
	var fl filterLog
	s, peer := withNetstackOptions(t, vnic.MemConfig{}, stack.Config{TimeWait: 200 * time.Millisecond}, stack.Options{Filters: &fl})
	netstackServe(t, peer, 6000, func(c io.ReadWriter) { io.Copy(c, c) })
	netstackServe(t, peer, 6001, func(c io.ReadWriter) { io.Copy(c, c) })
	poll := func() { s.Poll() }
	ports := []uint16{40000, 40001}

	var holders []stack.SockID
	for _, p := range ports {
		id, err := s.Open(stack.TCP)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.HoldPort(id); !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("HoldPort of an unbound socket: %v, want EINVAL", err)
		}
		if err := s.Bind(id, netip.AddrPortFrom(addrA.Addr(), p)); err != nil {
			t.Fatal(err)
		}
		if err := s.HoldPort(id); err != nil {
			t.Fatal(err)
		}
		holders = append(holders, id)
	}
	if len(fl.added) != 2 {
		t.Fatalf("filters after two holders: %v", fl.added)
	}

	dial := func(to uint16, start int) (stack.SockID, uint16, error) {
		t.Helper()
		id, err := s.Open(stack.TCP)
		if err != nil {
			t.Fatal(err)
		}
		port, err := s.ConnectShared(id, ports, start, netip.AddrPortFrom(addrB.Addr(), to))
		if !errors.Is(err, syscall.EINPROGRESS) {
			if la, _ := s.LocalAddr(id); la.Port() != 0 {
				t.Fatalf("ConnectShared failed (%v) and left the socket bound to %v", err, la)
			}
			s.Close(id)
			return stack.NullSock, 0, err
		}
		waitFor(t, "established", 5*time.Second, poll, func() bool { return s.Events(id)&stack.Writable != 0 })
		return id, port, nil
	}
	echo := func(id stack.SockID, msg string) { t.Helper(); echoOn(t, s, poll, id, msg) }

	a, pa, err := dial(6000, 0)
	if err != nil || pa != 40000 {
		t.Fatalf("first connection: port %d, %v; want 40000", pa, err)
	}
	b, pb, err := dial(6000, 0)
	if err != nil || pb != 40001 {
		t.Fatalf("second connection to the same peer: port %d, %v; want 40001", pb, err)
	}
	if _, _, err := dial(6000, 0); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("a third connection to the same peer on two ports: %v, want EADDRNOTAVAIL", err)
	}
	c, pc, err := dial(6001, 1)
	if err != nil || pc != 40001 {
		t.Fatalf("a connection to another peer from port 40001: port %d, %v", pc, err)
	}
	echo(a, "a")
	echo(b, "b")
	echo(c, "c")
	if len(fl.added) != 2 || len(fl.removed) != 0 {
		t.Fatalf("filters added %v, removed %v: want only the holders'", fl.added, fl.removed)
	}
	plain, err := s.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(plain, netip.AddrPortFrom(addrA.Addr(), 40000)); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("a plain bind of a held port: %v, want EADDRINUSE", err)
	}
	s.Close(plain)
	var holderRows int
	for _, r := range s.Sockets() {
		if r.State == "SHARED-PORT" {
			holderRows++
		}
	}
	if holderRows != 2 {
		t.Fatalf("%d SHARED-PORT rows, want 2", holderRows)
	}

	// a closes first: TIME-WAIT, which the next connection to that peer
	// from that port takes over.
	s.Close(a)
	waitFor(t, "TIME-WAIT", 5*time.Second, poll, func() bool {
		for _, r := range s.Sockets() {
			if r.ID == a {
				return r.State == "TIME-WAIT"
			}
		}
		return false
	})
	d, pd, err := dial(6000, 0)
	if err != nil || pd != 40000 {
		t.Fatalf("over the TIME-WAIT of port 40000: port %d, %v", pd, err)
	}
	if n := s.Counters().TCPTimeWaitReuse; n != 1 {
		t.Fatalf("TIME-WAIT connections recycled: %d, want 1", n)
	}
	echo(d, "d")

	// Every connection gone (through TIME-WAIT): the holders keep the
	// ports steered; each port's filter goes with its holder.
	for _, id := range []stack.SockID{b, c, d} {
		s.Close(id)
	}
	waitFor(t, "the connections to go", 5*time.Second, poll, func() bool { return s.InUse() == 2 })
	if len(fl.removed) != 0 {
		t.Fatalf("filters removed with holders left: %v", fl.removed)
	}
	s.Close(holders[0])
	if want := netip.AddrPortFrom(addrA.Addr(), 40000); len(fl.removed) != 1 || fl.removed[0] != want {
		t.Fatalf("filters removed after the first holder's close: %v, want %v", fl.removed, want)
	}
}

// checkLog is a filterLog that also records the checks of the kernel's
// connections its stack asks for.
type checkLog struct {
	filterLog
	checked []netip.AddrPort
}

func (f *checkLog) CheckKernelFlows(p stack.Proto, local netip.AddrPort) {
	f.checked = append(f.checked, local)
}

// TestListenChecksKernelFlows: a listening socket's port, and only that,
// is checked for connections of the kernel's (stack.KernelFlowsChecker):
// a dialled connection's bind steers its port without a check.
func TestListenChecksKernelFlows(t *testing.T) {
	var fl checkLog
	s, peer := withNetstackOptions(t, vnic.MemConfig{}, stack.Config{}, stack.Options{Filters: &fl})
	netstackServe(t, peer, 6000, func(c io.ReadWriter) { io.Copy(c, c) })
	ln, err := s.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(ln, netip.AddrPortFrom(addrA.Addr(), 7100)); err != nil {
		t.Fatal(err)
	}
	if len(fl.checked) != 0 {
		t.Fatalf("checked at bind: %v", fl.checked)
	}
	if err := s.Listen(ln, 8); err != nil {
		t.Fatal(err)
	}
	if len(fl.checked) != 1 || fl.checked[0].Port() != 7100 {
		t.Fatalf("checked after listen: %v, want port 7100", fl.checked)
	}
	c, err := s.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Connect(c, netip.AddrPortFrom(addrB.Addr(), 6000)); !errors.Is(err, syscall.EINPROGRESS) {
		t.Fatalf("connect: %v", err)
	}
	if len(fl.added) != 2 || len(fl.checked) != 1 {
		t.Fatalf("after a connect: filters %v, checked %v; want two filters, one check", fl.added, fl.checked)
	}
}
