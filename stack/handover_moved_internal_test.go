package stack

import (
	"errors"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

// pinLog is Filters that records the flows a handover pins.
type pinLog struct{ pinned []netip.AddrPort }

func (*pinLog) AddListener(Proto, netip.AddrPort) error    { return nil }
func (*pinLog) RemoveListener(Proto, netip.AddrPort) error { return nil }
func (p *pinLog) PinFlow(_ Proto, local, _ netip.AddrPort) error {
	p.pinned = append(p.pinned, local)
	return nil
}
func (*pinLog) UnpinFlow(Proto, netip.AddrPort, netip.AddrPort) error { return nil }

// TestHandoverAddressMoved: HandoverChecked gives its check the
// connection's local address, binds the kernel socket to that address
// and pins the flow of that address, or refuses: a process that writes
// another port into its image after onloadd checked the first
// (between the check and the use) has the handover refused
// (ErrHandoverMoved), nothing pinned, and the connection stays the
// stack's, working. Before, onloadd read the address three times, and
// the flow pinned to the stack was the one the image named last.
func TestHandoverAddressMoved(t *testing.T) {
	ownNetns(t, "a repaired socket")
	a, b, _ := memStacks(t, nil)
	pins := &pinLog{}
	a.filters = pins
	const port = 7100
	lst, c := listenDial(t, a, b, port)
	pollUntil(t, "a connection", func() bool { return a.Events(lst)&Readable != 0 }, a, b)
	ours, err := a.Accept(lst)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	want := netip.AddrPortFrom(a.Addr(), port)
	var checked []netip.AddrPort
	check := func(local netip.AddrPort) error {
		checked = append(checked, local)
		// The process moves the connection to another port once the
		// check has passed.
		a.lock()
		sk, err := a.sockLocked(ours)
		if err == nil {
			sk.localPort = port + 1
		}
		a.unlock()
		return err
	}
	_, err = a.HandoverChecked(ours, fd, 0, check)
	if len(checked) != 1 || checked[0] != want {
		t.Fatalf("check given %v; want [%v]", checked, want)
	}
	if !errors.Is(err, ErrHandoverMoved) {
		t.Fatalf("handover of a connection whose address moved after the check: %v; want ErrHandoverMoved", err)
	}
	if len(pins.pinned) != 0 {
		t.Fatalf("flows pinned for a refused handover: %v", pins.pinned)
	}
	// The connection is still the stack's: put its port back and use it.
	a.lock()
	sk, err := a.sockLocked(ours)
	if err != nil {
		a.unlock()
		t.Fatalf("the connection after a refused handover: %v", err)
	}
	sk.localPort = port
	a.unlock()
	if _, err := b.Send(c, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "data after the refused handover", func() bool { return a.Events(ours)&Readable != 0 }, a, b)
	buf := make([]byte, 32)
	if n, err := a.Recv(ours, buf, false); err != nil || string(buf[:n]) != "still here" {
		t.Fatalf("read after the refused handover: %q, %v", buf[:n], err)
	}
	// A refused check refuses the handover, nothing changed.
	refused := errors.New("not steered here")
	if _, err := a.HandoverChecked(ours, fd, 0, func(netip.AddrPort) error { return refused }); !errors.Is(err, refused) {
		t.Fatalf("handover whose check failed: %v; want the check's error", err)
	}
	if len(pins.pinned) != 0 {
		t.Fatalf("flows pinned for a refused handover: %v", pins.pinned)
	}
}
