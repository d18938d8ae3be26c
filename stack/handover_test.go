package stack_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/xdp-onload/onload/vnic"
)

// TestHandoverState takes a connection between two of our stacks out of
// one of them (BeginHandover) and checks what it gives for the kernel:
// the addresses, the bytes it had not read, those it sent and the peer
// did not acknowledge, and those it never sent; then, while it is being
// handed over, the peer's new data is held and given back in order by
// HandoverCatchUp, and the socket answers nothing (the peer sees no
// acknowledgment and no reset).
func TestHandoverState(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)

	// 3,000 bytes from b that a does not read.
	unread := randomBytes(3000, 1)
	if _, err := b.Send(s, unread); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a has the bytes", 5*time.Second, poll, func() bool {
		info, _ := a.TCPInfo(c)
		return int(info.Unread) == len(unread)
	})
	// 5,000 bytes from a that b never sees acknowledged: only a polls.
	sent := randomBytes(5000, 2)
	if n, err := a.Send(c, sent); err != nil || n != len(sent) {
		t.Fatalf("send: %d, %v", n, err)
	}
	a.Poll()

	conn, err := a.BeginHandover(c)
	if err != nil {
		t.Fatal(err)
	}
	la, _ := b.RemoteAddr(s)
	ra, _ := b.LocalAddr(s)
	if conn.Local != la || conn.Remote.Port() != ra.Port() {
		t.Errorf("addresses %v -> %v, want %v -> port %d", conn.Local, conn.Remote, la, ra.Port())
	}
	if !bytes.Equal(conn.Unread, unread) {
		t.Errorf("unread: %d bytes, want the %d b sent", len(conn.Unread), len(unread))
	}
	if got := append(append([]byte{}, conn.Sent...), conn.Unsent...); !bytes.Equal(got, sent) {
		t.Errorf("sent %d + unsent %d bytes, want the %d a wrote", len(conn.Sent), len(conn.Unsent), len(sent))
	}
	if info, _ := b.TCPInfo(s); conn.RcvNxt != info.SndNxt || conn.SndUna != info.RcvNxt || conn.MSS == 0 {
		t.Errorf("rcvNxt %d sndUna %d mss %d; b's sndNxt %d rcvNxt %d", conn.RcvNxt, conn.SndUna, conn.MSS, info.SndNxt, info.RcvNxt)
	}
	if _, err := a.Recv(c, make([]byte, 10), false); err == nil {
		t.Error("the application still reads the handed-over socket")
	}

	// The peer goes on sending: held, and nothing answers it.
	more := randomBytes(4000, 3)
	if _, err := b.Send(s, more); err != nil {
		t.Fatal(err)
	}
	before := a.Counters()
	for range 20 {
		poll()
	}
	if after := a.Counters(); after.TxFrames != before.TxFrames {
		t.Errorf("the handed-over socket answered: a sent %d frames", after.TxFrames-before.TxFrames)
	}
	caught, err := a.HandoverCatchUp(c)
	if err != nil {
		t.Fatal(err)
	}
	// What b sent meanwhile (its window and cwnd allowed some of it),
	// in order.
	info, _ := b.TCPInfo(s)
	if n := int(info.SndNxt - conn.RcvNxt); len(caught) == 0 || len(caught) != n || !bytes.Equal(caught, more[:n]) {
		t.Errorf("caught up %d bytes, want the %d b sent meanwhile", len(caught), n)
	}
	if err := a.EndHandover(c); err != nil {
		t.Fatal(err)
	}
	if c := a.Counters(); c.TCPHandovers != 1 {
		t.Errorf("TCPHandovers %d, want 1", c.TCPHandovers)
	}
	if st := a.TCPStates(); st["HANDED-OVER"] != 1 {
		t.Errorf("a's sockets: %v, want one HANDED-OVER", st)
	}
}
