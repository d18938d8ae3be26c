package stack

import (
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLateKeptForAnotherHandle: a segment that reaches a HANDED-OVER
// socket after its handover ended, polled by a handle that cannot give
// it to the kernel's socket (no raw socket: a process of onloadd's
// stack), is kept (LateWaiting), and the handle that can (onloadd's,
// which made one in EndHandover) gives it (GiveLate, counted
// TCPHandoverLate) if it is of the connection as that handle handed it
// over; one nobody gives is dropped, counted, when the socket's grace
// ends. Before, the first handle dropped it, and the
// peer sent it again at its retransmission timeout.
//
// The test runs in a network namespace of its own, with a's address on
// its loopback: what the raw socket sends stays there.
func TestLateKeptForAnotherHandle(t *testing.T) {
	ownNetns(t, "a raw socket")
	a, b, ma := memStacks(t, nil)
	h := Attach(a.img, ma, Options{}) // another process's handle on a
	// connect makes a connection from b to a and hands a's end over,
	// as onloadd does (its handle a ends it); it returns b's end.
	port := uint16(7000)
	connect := func() SockID {
		t.Helper()
		port++
		lst, c := listenDial(t, a, b, port)
		pollUntil(t, "a connection", func() bool { return a.Events(lst)&Readable != 0 }, a, b)
		ours, err := a.Accept(lst)
		if err != nil {
			t.Fatal(err)
		}
		a.Close(lst)
		rc, err := a.BeginHandover(ours)
		if err != nil {
			t.Fatal(err)
		}
		a.rememberHanded(ours, rc.Local, rc.Remote) // as handover does
		if _, err := a.HandoverCatchUp(ours); err != nil {
			t.Fatal(err)
		}
		if err := a.EndHandover(ours); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// late sends from b a segment that h polls.
	late := func(c SockID) {
		t.Helper()
		if _, err := b.Send(c, []byte("late")); err != nil {
			t.Fatal(err)
		}
		b.Poll()
		h.Poll()
		if !a.LateWaiting() {
			t.Fatalf("the segment h polled for the HANDED-OVER socket was not kept for another handle: %+v", a.Counters())
		}
	}
	c0 := a.Counters()
	// A segment not of the connection a handed over (the image is
	// another process's to write) is not given: a's record of the
	// connection says another peer port here.
	c := connect()
	late(c)
	for id, tu := range a.handedTuples {
		tu.remote = netip.AddrPortFrom(tu.remote.Addr(), tu.remote.Port()+1)
		a.handedTuples[id] = tu
	}
	a.GiveLate()
	if c1 := a.Counters(); a.LateWaiting() || c1.TCPHandoverLate != c0.TCPHandoverLate || c1.TCPHandoverDrops-c0.TCPHandoverDrops != 1 {
		t.Fatalf("GiveLate of a segment not of the connection handed over: waiting %v, given %d, dropped %d; want it dropped",
			a.LateWaiting(), c1.TCPHandoverLate-c0.TCPHandoverLate, c1.TCPHandoverDrops-c0.TCPHandoverDrops)
	}
	c0 = a.Counters()
	late(connect())
	a.GiveLate()
	c1 := a.Counters()
	if a.LateWaiting() || c1.TCPHandoverLate-c0.TCPHandoverLate != 1 || c1.TCPHandoverDrops != c0.TCPHandoverDrops {
		t.Fatalf("GiveLate: waiting %v, given %d, dropped %d; want the kept segment given",
			a.LateWaiting(), c1.TCPHandoverLate-c0.TCPHandoverLate, c1.TCPHandoverDrops-c0.TCPHandoverDrops)
	}
	// Kept and never given: dropped at the grace's end.
	late(connect())
	pollUntil(t, "end of the grace", func() bool { return !a.LateWaiting() }, h)
	c2 := a.Counters()
	if c2.TCPHandoverDrops-c1.TCPHandoverDrops != 1 || c2.TCPHandoverLate != c1.TCPHandoverLate {
		t.Fatalf("at the grace's end: dropped %d, given %d; want the kept segment dropped", c2.TCPHandoverDrops-c1.TCPHandoverDrops, c2.TCPHandoverLate-c1.TCPHandoverLate)
	}
}

// ownNetns moves the test's goroutine, locked to its thread for good (the
// thread ends with the test), into a network namespace of its own with
// memStacks' a address (198.18.0.1) on its loopback: what a test's kernel
// sockets, raw or repaired, send stays there. It skips the test without
// root (for why: the test's need of it).
func ownNetns(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root: a network namespace and %s", why)
	}
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		t.Skipf("no network namespace of its own: %v", err)
	}
	for _, args := range [][]string{{"link", "set", "lo", "up"}, {"addr", "add", "198.18.0.1/32", "dev", "lo"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
}
