package sockets_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/xdp-onload/onload/interrupts"
	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

var (
	addrA = netip.MustParsePrefix("198.18.0.1/24")
	addrB = netip.MustParsePrefix("198.18.0.2/24")
)

// memStacks makes two accelerated stacks joined by an in-memory wire.
func memStacks(t testing.TB, mc vnic.MemConfig, cfg sockets.Config) (a, b *sockets.Stack) {
	t.Helper()
	na, nb, err := vnic.NewMemPair(mc)
	if err != nil {
		t.Fatal(err)
	}
	return memStacksOn(t, na, nb, cfg)
}

// memStacksOn makes the two stacks over a pair the caller keeps (to
// impair it).
func memStacksOn(t testing.TB, na, nb *vnic.Mem, cfg sockets.Config) (a, b *sockets.Stack) {
	t.Helper()
	mk := func(nic, peer *vnic.Mem, me, them netip.Prefix) *sockets.Stack {
		s, err := sockets.NewStack(nic, interrupts.Mem(nic),
			stack.Config{Addr: me, MAC: nic.Info().MAC},
			cfg,
			stack.Options{Neighbours: map[netip.Addr]net.HardwareAddr{them.Addr(): peer.Info().MAC}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a = mk(na, nb, addrA, addrB)
	b = mk(nb, na, addrB, addrA)
	t.Cleanup(func() {
		a.Close()
		b.Close()
		na.Close()
	})
	return a, b
}

// memStacksNICs is memStacks with the default configuration, and the
// wire's two ends (to impair them).
func memStacksNICs(t testing.TB) (a, b *sockets.Stack, na, nb *vnic.Mem) {
	t.Helper()
	na, nb, err := vnic.NewMemPair(vnic.MemConfig{})
	if err != nil {
		t.Fatal(err)
	}
	a, b = memStacksOn(t, na, nb, sockets.Config{})
	return a, b, na, nb
}

// connPair is pipe for a test: a connection from a to b, closed when the
// test ends.
func connPair(t testing.TB, a, b *sockets.Stack) (c1, c2 net.Conn) {
	t.Helper()
	c1, c2, stop, err := pipe(a, b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return c1, c2
}

// pipe connects a client on a to a server on b.
func pipe(a, b *sockets.Stack) (c1, c2 net.Conn, stop func(), err error) {
	lc := sockets.ListenConfig{Stack: b}
	ln, err := lc.Listen(context.Background(), "tcp", addrB.Addr().String()+":0")
	if err != nil {
		return nil, nil, nil, err
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		ch <- res{c, err}
	}()
	d := sockets.Dialer{Stack: a}
	c1, err = d.Dial("tcp", ln.Addr().String())
	if err != nil {
		return nil, nil, nil, err
	}
	r := <-ch
	if r.err != nil {
		c1.Close()
		return nil, nil, nil, r.err
	}
	return c1, r.c, func() { c1.Close(); r.c.Close() }, nil
}

// TestNettestMem runs x/net's net.Conn conformance suite on our TCP, our
// stack at both ends of an in-memory wire.
func TestNettestMem(t *testing.T) {
	for _, p := range []sockets.Profile{sockets.Balanced, sockets.Latency} {
		t.Run(string(p), func(t *testing.T) {
			cfg, _ := sockets.DefaultConfig(p)
			a, b := memStacks(t, vnic.MemConfig{}, cfg)
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return pipe(a, b) })
		})
	}
}

// TestSpinThreads checks how many waiters may spin at once: one by
// default, ONLOAD_SPIN_THREADS's number otherwise.
func TestSpinThreads(t *testing.T) {
	a, _ := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	if got := a.SpinThreads(); got != 1 {
		t.Fatalf("default: %d spinners, want 1", got)
	}
	if !a.TrySpin() || a.TrySpin() {
		t.Fatal("default: want one TrySpin to succeed and the second to fail")
	}
	a.EndSpin()
	c, _ := memStacks(t, vnic.MemConfig{}, sockets.Config{SpinThreads: 3})
	if got := c.SpinThreads(); got != 3 {
		t.Fatalf("ONLOAD_SPIN_THREADS=3: %d spinners, want 3", got)
	}
	if !c.TrySpin() || !c.TrySpin() || !c.TrySpin() || c.TrySpin() {
		t.Fatal("3 spinners: want three TrySpin to succeed and the fourth to fail")
	}
	for range 3 {
		c.EndSpin()
	}
}
