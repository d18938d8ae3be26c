package stack

import (
	"net/netip"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWakeSocket: a process that waits on its wake socket (the shim's
// threads) is woken by another sharer's poll through it: a datagram, and
// TakeRemoteWakes then wakes the socket its thread waits on; its futex
// word is not touched.
func TestWakeSocket(t *testing.T) {
	a, b, ma := memStacks(t, nil)
	// A second handle on a's image, as the process whose thread waits.
	var woken []SockID
	h := Attach(a.img, ma, Options{Wake: func(id SockID) { woken = append(woken, id) }})
	if _, err := h.WakeSocket(); err == nil {
		t.Fatal("WakeSocket before JoinWakes: no error")
	}
	if err := h.JoinWakes(); err != nil {
		t.Fatal(err)
	}
	defer h.LeaveWakes()
	fd, err := h.WakeSocket()
	if err != nil {
		t.Fatal(err)
	}
	// a stands for another process: another slot.
	a.joined.Store(h.joined.Load() + 1)

	// The waiting socket in a slot above others (TakeRemoteWakes reads
	// the slots ever used).
	for range 5 {
		if _, err := h.Open(UDP); err != nil {
			t.Fatal(err)
		}
	}
	u, _ := h.Open(UDP)
	if err := h.Bind(u, netip.AddrPortFrom(netip.Addr{}, 5000)); err != nil {
		t.Fatal(err)
	}
	if ev := h.WaitFor(u, Readable); ev != 0 {
		t.Fatalf("WaitFor: ready at once (%v)", ev)
	}
	word := atomic.LoadUint32(&a.img.hdr.procs[h.proc()-1].wake)
	ub, _ := b.Open(UDP)
	if _, err := b.SendTo(ub, []byte("wake"), netip.AddrPortFrom(a.Addr(), 5000)); err != nil {
		t.Fatal(err)
	}
	a.Poll()
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(p, 2000); n != 1 {
		t.Fatal("the other sharer's poll sent no datagram to the wake socket within 2s")
	}
	if n := h.TakeRemoteWakes(); n != 1 || len(woken) != 1 || woken[0] != u {
		t.Errorf("TakeRemoteWakes = %d, woke %v; want 1, [%v]", n, woken, u)
	}
	if w := atomic.LoadUint32(&a.img.hdr.procs[h.proc()-1].wake); w != word {
		t.Errorf("the futex word moved (%d to %d): the wake went both ways", word, w)
	}
	var buf [16]byte
	if n, _ := unix.Read(fd, buf[:]); n != 1 {
		t.Errorf("read %d bytes from the wake socket, want 1", n)
	}
}
