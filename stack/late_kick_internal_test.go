package stack

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/xdp-onload/onload/vnic"
)

// lateNIC is an in-memory NIC that leaves its kicks for after the lock
// (vnic.LateKicker), as vnic.XDP does, and records whether the stack
// lock was held when it was told to give one.
type lateNIC struct {
	*vnic.Mem
	s             *Stack
	due           bool
	kicks, locked int
}

func (n *lateNIC) Transmit(hs []vnic.Handle) (int, error) {
	n.due = true
	return n.Mem.Transmit(hs)
}

func (n *lateNIC) TransmitKeep(hs []vnic.Handle) (int, error) {
	n.due = true
	return n.Mem.TransmitKeep(hs)
}

func (n *lateNIC) SetLateKicks(bool) {}

func (n *lateNIC) TakeKick() bool {
	if n.s != nil && !n.s.img.hdr.lock.Held() {
		panic("TakeKick without the stack lock")
	}
	d := n.due
	n.due = false
	return d
}

func (n *lateNIC) KickUnlocked() error {
	n.kicks++
	if n.s != nil && n.s.img.hdr.lock.Held() {
		n.locked++
	}
	return nil
}

// TestKicksAfterTheLock: a stack whose NIC leaves its kicks for later
// (vnic.LateKicker) gives every kick its operations made due once it has
// let the lock go, never under it: connect, send, receive and poll.
func TestKicksAfterTheLock(t *testing.T) {
	var nic *lateNIC
	a, b, _ := memStacks(t, func(m *vnic.Mem) vnic.NIC { nic = &lateNIC{Mem: m}; return nic })
	nic.s = a
	if a.late == nil {
		t.Fatal("the stack did not take the NIC's late kicks")
	}
	addrB := b.Addr()
	l, _ := b.Open(TCP)
	if err := b.Bind(l, netip.AddrPortFrom(netip.Addr{}, 80)); err != nil {
		t.Fatal(err)
	}
	if err := b.Listen(l, 0); err != nil {
		t.Fatal(err)
	}
	c, _ := a.Open(TCP)
	a.Connect(c, netip.AddrPortFrom(addrB, 80))
	var srv SockID
	until := func(what string, ok func() bool) { t.Helper(); pollUntil(t, what, ok, a, b) }
	until("accept", func() bool { var err error; srv, err = b.Accept(l); return err == nil })
	msg := bytes.Repeat([]byte("late"), 1000)
	if n, err := a.Send(c, msg); n != len(msg) || err != nil {
		t.Fatalf("send: %d, %v", n, err)
	}
	got := make([]byte, 0, len(msg))
	buf := make([]byte, 8192)
	until("data", func() bool {
		if n, err := b.Recv(srv, buf, false); err == nil {
			got = append(got, buf[:n]...)
		}
		return len(got) == len(msg)
	})
	if !bytes.Equal(got, msg) {
		t.Fatal("the data arrived changed")
	}
	b.Send(srv, []byte("back"))
	until("reply", func() bool { n, err := a.Recv(c, buf, false); return err == nil && n == 4 })
	if nic.kicks == 0 || nic.locked != 0 || nic.due {
		t.Errorf("%d kicks given, %d of them under the lock, one still due: %v; want some, none, false", nic.kicks, nic.locked, nic.due)
	}
}

// pollUntil polls stacks until ok, failing the test if that takes 5 s.
func pollUntil(t *testing.T, what string, ok func() bool, stacks ...*Stack) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !ok(); {
		if time.Now().After(end) {
			t.Fatalf("no %s within 5s", what)
		}
		for _, s := range stacks {
			s.Poll()
		}
	}
}

// listenDial makes a listener on a's port and dials it from b (the
// connection is on its way).
func listenDial(t *testing.T, a, b *Stack, port uint16) (lst, c SockID) {
	t.Helper()
	lst, _ = a.Open(TCP)
	if err := a.Bind(lst, netip.AddrPortFrom(netip.Addr{}, port)); err != nil {
		t.Fatal(err)
	}
	if err := a.Listen(lst, 0); err != nil {
		t.Fatal(err)
	}
	c, _ = b.Open(TCP)
	b.Connect(c, netip.AddrPortFrom(a.Addr(), port))
	return lst, c
}

// memStacks is a stack on each end of an in-memory wire, 198.18.0.1 (a,
// over wrap(its end), if wrap is not nil) and 198.18.0.2 (b), torn down
// with the test; ma is a's end.
func memStacks(t *testing.T, wrap func(*vnic.Mem) vnic.NIC) (a, b *Stack, ma *vnic.Mem) {
	t.Helper()
	ma, mb, err := vnic.NewMemPair(vnic.MemConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ma.Close() })
	addrA, addrB := netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("198.18.0.2/24")
	var nic vnic.NIC = ma
	if wrap != nil {
		nic = wrap(ma)
	}
	if a, err = New(nic, Config{Addr: addrA, MAC: ma.Info().MAC}, Options{
		Neighbours: map[netip.Addr]net.HardwareAddr{addrB.Addr(): mb.Info().MAC},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Destroy() })
	if b, err = New(mb, Config{Addr: addrB, MAC: mb.Info().MAC}, Options{
		Neighbours: map[netip.Addr]net.HardwareAddr{addrA.Addr(): ma.Info().MAC},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Destroy() })
	return a, b, ma
}

// TestUnlockedAfterWakes: Options.Unlocked runs after a poll's wakes, with
// the stack lock let go, before the poll returns: the wakes' system calls
// left to it (sockets' owedSignals) are made at once, outside the lock.
func TestUnlockedAfterWakes(t *testing.T) {
	a, b, _ := memStacks(t, nil)
	woken, flushed, held, calls := 0, 0, 0, 0
	a.wake = func(SockID) {
		if !a.img.hdr.lock.Held() {
			t.Error("Wake without the stack lock")
		}
		woken++
	}
	a.unlocked = func() {
		calls++
		if a.img.hdr.lock.Held() {
			held++
		}
		flushed = woken
	}
	u, _ := a.Open(UDP)
	if err := a.Bind(u, netip.AddrPortFrom(netip.Addr{}, 5000)); err != nil {
		t.Fatal(err)
	}
	if ev := a.WaitFor(u, Readable); ev != 0 {
		t.Fatalf("WaitFor: ready at once (%v)", ev)
	}
	ub, _ := b.Open(UDP)
	if _, err := b.SendTo(ub, []byte("wake"), netip.AddrPortFrom(a.Addr(), 5000)); err != nil {
		t.Fatal(err)
	}
	a.Poll()
	if woken != 1 {
		t.Fatalf("the poll woke %d waiters, want 1", woken)
	}
	if flushed != woken {
		t.Errorf("Unlocked did not run after the wake, before Poll returned (%d calls)", calls)
	}
	if held != 0 {
		t.Errorf("Unlocked ran %d of %d times with the stack lock held", held, calls)
	}
}
