package stack_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// waitFor polls until cond holds or the time runs out.
func waitFor(t *testing.T, what string, timeout time.Duration, poll func(), cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		poll()
	}
}

func pollBoth(a, b *stack.Stack) func() {
	return func() {
		a.Poll()
		b.Poll()
	}
}

// waitAcked waits until everything st sent on id is acknowledged.
func waitAcked(t *testing.T, st *stack.Stack, id stack.SockID, poll func(), timeout time.Duration) {
	t.Helper()
	waitFor(t, "the ACK", timeout, poll, func() bool {
		info, _ := st.TCPInfo(id)
		return info.Unacked == 0
	})
}

// sendAcked sends msg from a on c, polls a alone for stall (as if b's
// process were off its CPU), and waits for the ACK; b must have
// received msg on s. It returns what a's counters moved by, and the time
// from the send to the ACK.
func sendAcked(t *testing.T, a *stack.Stack, c stack.SockID, b *stack.Stack, s stack.SockID, msg []byte, stall time.Duration, poll func()) (stack.Counters, time.Duration) {
	t.Helper()
	before := a.Counters()
	if n, err := a.Send(c, msg); n != len(msg) || err != nil {
		t.Fatalf("send: %d %v", n, err)
	}
	start := time.Now()
	for end := start.Add(stall); time.Now().Before(end); {
		a.Poll()
	}
	waitAcked(t, a, c, poll, 2*time.Second)
	took := time.Since(start)
	got := make([]byte, 2*len(msg))
	if n, _ := b.Recv(s, got, false); !bytes.Equal(got[:n], msg) {
		t.Fatalf("received %q, not the %d bytes sent", got[:min(n, 64)], len(msg))
	}
	return a.Counters().Sub(before), took
}

// connectPair connects a to a listener on b (made on port 80 the first
// time) and accepts.
func connectPair(t *testing.T, a, b *stack.Stack, poll func()) (client, server stack.SockID) {
	t.Helper()
	l, ok := listeners[b]
	if !ok {
		var err error
		if l, err = b.Open(stack.TCP); err != nil {
			t.Fatal(err)
		}
		if err := b.Bind(l, netip.AddrPortFrom(netip.Addr{}, 80)); err != nil {
			t.Fatal(err)
		}
		if err := b.Listen(l, 0); err != nil {
			t.Fatal(err)
		}
		listeners[b] = l
		t.Cleanup(func() { delete(listeners, b) })
	}
	c, err := a.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(c, netip.AddrPortFrom(b.Addr(), 80)); !errors.Is(err, syscall.EINPROGRESS) {
		t.Fatalf("connect: %v, want EINPROGRESS", err)
	}
	waitFor(t, "connection", 5*time.Second, poll, func() bool { return a.Events(c)&stack.Writable != 0 })
	var srv stack.SockID
	waitFor(t, "accept", 5*time.Second, poll, func() bool {
		var err error
		srv, err = b.Accept(l)
		return err == nil
	})
	return c, srv
}

// listeners are the listening sockets connectPair made, by stack.
var listeners = map[*stack.Stack]stack.SockID{}

// transfer sends data from (ss, sid) to (ds, did) while reading at the
// other end, and returns what arrived.
func transfer(t *testing.T, ss *stack.Stack, sid stack.SockID, ds *stack.Stack, did stack.SockID, data []byte, poll func(), timeout time.Duration) []byte {
	t.Helper()
	got := make([]byte, 0, len(data))
	buf := make([]byte, 64<<10)
	sent := 0
	deadline := time.Now().Add(timeout)
	for len(got) < len(data) {
		if time.Now().After(deadline) {
			t.Fatalf("transfer: sent %d, received %d of %d in %v (sender %s; receiver %s)",
				sent, len(got), len(data), timeout, ptr(ss.Counters()), ptr(ds.Counters()))
		}
		if sent < len(data) {
			n, err := ss.Send(sid, data[sent:min(len(data), sent+64<<10)])
			if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
				t.Fatalf("send: %v", err)
			}
			sent += n
		}
		poll()
		n, err := ds.Recv(did, buf, false)
		if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
			t.Fatalf("recv: %v", err)
		}
		if err == nil && n == 0 {
			t.Fatalf("early end of stream after %d bytes", len(got))
		}
		got = append(got, buf[:n]...)
	}
	return got
}

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func TestTCPBetweenOurStacks(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	for _, size := range []int{1, 100, 1460, 1461, 100000} {
		data := randomBytes(size, uint64(size))
		if got := transfer(t, a, c, b, s, data, poll, 10*time.Second); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes a->b differ", size)
		}
		if got := transfer(t, b, s, a, c, data, poll, 10*time.Second); !bytes.Equal(got, data) {
			t.Fatalf("%d bytes b->a differ", size)
		}
	}
	la, _ := a.LocalAddr(c)
	ra, _ := a.RemoteAddr(c)
	if la.Addr() != addrA.Addr() || ra != netip.AddrPortFrom(addrB.Addr(), 80) {
		t.Errorf("client addresses %v -> %v", la, ra)
	}
	// Graceful close from the client: the server reads the end of the
	// stream, closes too, and both sockets go away.
	if err := a.Close(c); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	waitFor(t, "end of stream", 5*time.Second, poll, func() bool {
		n, err := b.Recv(s, buf, false)
		return n == 0 && err == nil
	})
	b.Close(s)
	// The client closed first: it ends in TIME-WAIT; the server's socket
	// went through LAST-ACK and is gone. (The listener is b's only TCP
	// socket left.)
	waitFor(t, "both closed", 5*time.Second, poll, func() bool {
		sa, sb := a.TCPStates(), b.TCPStates()
		return len(sa) == 1 && sa["TIME-WAIT"] == 1 && len(sb) == 1 && sb["LISTEN"] == 1
	})
}

// TestTCPZeroAllocs checks that the per-packet paths allocate nothing: a
// send, its segment's arrival, delivery to the socket, the read and the
// ACK's return. They must not use a stale frame handle either (the pool
// counts every refusal).
func TestTCPZeroAllocs(t *testing.T) {
	a, b, na, nb := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	a.SetOption(c, stack.NoDelay, 1)
	msg := make([]byte, 64)
	bulk := make([]byte, 16<<10)
	buf := make([]byte, 64<<10)
	round := func(m []byte) {
		a.Send(c, m)
		for got, i := 0, 0; got < len(m); i++ {
			if i == 100000 {
				panic("data did not arrive")
			}
			b.Poll()
			n, _ := b.Recv(s, buf, false)
			got += n
			a.Poll()
		}
	}
	for range 100 { // warm up: windows open, RTT settles
		round(msg)
		round(bulk)
	}
	if n := testing.AllocsPerRun(1000, func() { round(msg) }); n != 0 {
		t.Errorf("64-byte message: %v allocations", n)
	}
	if n := testing.AllocsPerRun(200, func() { round(bulk) }); n != 0 {
		t.Errorf("16 KiB of segments: %v allocations", n)
	}
	for _, nic := range []*vnic.Mem{na, nb} {
		if st := nic.Pool().Stats(); st.Stale != 0 {
			t.Errorf("%d frame handles refused as stale", st.Stale)
		}
	}
	// Every segment of these exchanges is one header prediction expects.
	if ca, cb := a.Counters(), b.Counters(); ca.TCPPredicted < 1000 || cb.TCPPredicted < 1000 {
		t.Errorf("header prediction took %d and %d segments; want every one of more than 1000", ca.TCPPredicted, cb.TCPPredicted)
	}
}

// TestTCPProbeLearnsDelayedAck sends one segment at a time to a peer
// that holds its ACK for 150ms, as a Linux receiver's ACK timeout may in
// an interactive exchange (it doubles up to 200ms). The first tail loss
// probe comes after our 40ms allowance, needlessly: the peer reports the
// copy with a D-SACK (RFC 2883), and the sender must learn from it to
// allow the peer RFC 8985's 200ms, so that the next lone segment goes
// without a probe.
func TestTCPProbeLearnsDelayedAck(t *testing.T) {
	a, na, nb := memPair(t, vnic.MemConfig{})
	b := peerStack(t, na, nb, stack.Config{DelayedAck: 150 * time.Millisecond}, stack.Options{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	a.SetOption(c, stack.NoDelay, 1)
	// A few exchanges give a µs RTT sample, so 2·SRTT alone is short.
	for range 3 {
		if got := transfer(t, a, c, b, s, []byte("warm"), poll, 5*time.Second); string(got) != "warm" {
			t.Fatalf("warm-up: %q", got)
		}
		if got := transfer(t, b, s, a, c, []byte("back"), poll, 5*time.Second); string(got) != "back" {
			t.Fatalf("warm-up: %q", got)
		}
	}
	lone := func() (stack.Counters, time.Duration) {
		t.Helper()
		return sendAcked(t, a, c, b, s, []byte("one segment"), 0, poll)
	}
	first, took := lone()
	if first.TCPTLPs != 1 || first.TCPTLPSpurious != 1 || first.TCPDSacks != 1 {
		t.Fatalf("the first lone segment, acknowledged after %v: %d probes, %d of them found needless, %d D-SACKs; want 1 of each (a probe after 40ms, the peer's D-SACK for it)",
			took.Round(time.Millisecond), first.TCPTLPs, first.TCPTLPSpurious, first.TCPDSacks)
	}
	for i := range 3 {
		d, took := lone()
		if d.TCPTLPs != 0 {
			t.Fatalf("lone segment %d, acknowledged after %v: %d probes (%d retransmissions): the stack did not learn that the peer delays its ACK",
				i+2, took.Round(time.Millisecond), d.TCPTLPs, d.TCPRetransmits)
		}
		if took < 100*time.Millisecond {
			t.Fatalf("lone segment %d acknowledged after %v: the peer did not delay its ACK, and the test proves nothing", i+2, took)
		}
	}
}

// TestTCPProbeLearnsSlowPeer sends two segments at a time to a peer
// whose process is starved of its CPU for a while after each (it is not
// polled): a tail loss probe at 2·SRTT, floored at 2ms, goes needlessly,
// and the peer's D-SACK for it must raise that connection's floor to
// 10ms, so that a stall of 4ms draws no probe and one of 25ms still does.
func TestTCPProbeLearnsSlowPeer(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	a.SetOption(c, stack.NoDelay, 1)
	for range 3 { // µs RTT samples
		if got := transfer(t, a, c, b, s, []byte("warm"), poll, 5*time.Second); string(got) != "warm" {
			t.Fatalf("warm-up: %q", got)
		}
	}
	msg := randomBytes(2500, 3)
	starved := func(stall time.Duration) stack.Counters {
		t.Helper()
		d, _ := sendAcked(t, a, c, b, s, msg, stall, poll)
		return d
	}
	// The first stall draws a probe at 2ms (a second at 6ms, under the
	// race detector's slowness), each found needless.
	if d := starved(5 * time.Millisecond); d.TCPTLPs == 0 || d.TCPTLPSpurious == 0 {
		t.Fatalf("the first 5ms stall: %d probes, %d of them found needless; want some of each (a probe after 2ms, the peer's D-SACK for it); %s; b %s", d.TCPTLPs, d.TCPTLPSpurious, &d, ptr(b.Counters()))
	}
	if d := starved(4 * time.Millisecond); d.TCPTLPs != 0 {
		t.Fatalf("a 4ms stall after it: %d probes: the stack did not learn that the peer is slow to ACK", d.TCPTLPs)
	}
	if d := starved(25 * time.Millisecond); d.TCPTLPs == 0 {
		t.Fatalf("a 25ms stall: no probe; want one at the 10ms floor")
	}
}

// TestTCPRTOAckedHole loses every ACK of a burst and of the two tail loss
// probes after it, so the sender's timer fires and marks the whole burst
// lost. The ACK of the one retransmission covers the burst: the rest must
// leave the queue without being sent again, and no RTT sample may come of
// it (Karn, RFC 6298 section 3): the burst was sent once, a whole RTO
// earlier.
func TestTCPRTOAckedHole(t *testing.T) {
	a, b, _, nb := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	a.SetOption(c, stack.NoDelay, 1)
	// A first exchange gives a µs RTT sample.
	if got := transfer(t, a, c, b, s, []byte("warm"), poll, 5*time.Second); string(got) != "warm" {
		t.Fatalf("warm-up: %q", got)
	}
	nb.Impair(vnic.Impairment{Loss: 1})
	burst := randomBytes(8*1448, 9)
	if n, err := a.Send(c, burst); n != len(burst) || err != nil {
		t.Fatalf("send: %d %v", n, err)
	}
	// b gets the burst; its ACKs are lost, and so is the probe's.
	waitFor(t, "burst delivered", 5*time.Second, poll, func() bool {
		info, _ := b.TCPInfo(s)
		return info.Unread == uint32(len(burst))
	})
	waitFor(t, "the tail loss probes", 5*time.Second, poll, func() bool { return a.Counters().TCPTLPs >= 2 })
	rtx := a.Counters().TCPRetransmits
	nb.Impair(vnic.Impairment{})
	waitAcked(t, a, c, poll, 5*time.Second)
	poll()
	if n := a.Counters().TCPRetransmits - rtx; n != 1 {
		t.Errorf("%d segments sent again, want 1: the ACK of the first covered the rest", n)
	}
	if a.Counters().TCPRTOs == 0 {
		t.Error("no RTO: the test proves nothing")
	}
	info, _ := a.TCPInfo(c)
	if info.RTT > 10*time.Millisecond {
		t.Errorf("smoothed RTT %v after the RTO: a sample came from the burst sent once, an RTO before", info.RTT)
	}
	if _, err := a.TCPInfo(stack.SockID(0)); err == nil {
		t.Error("TCPInfo of a bad socket: no error")
	}
	got := make([]byte, len(burst)+4)
	n, _ := b.Recv(s, got, false)
	if !bytes.Equal(got[:n], burst) {
		t.Errorf("received %d bytes, not the burst", n)
	}
}

// TestTCPUndelivered closes a connection while the peer's ACKs are lost:
// it counts as undelivered (and lingering) until the peer has
// acknowledged its data and FIN, and then only as lingering while it waits
// in FIN-WAIT-2 for the peer's own FIN; with that, neither.
func TestTCPUndelivered(t *testing.T) {
	a, b, _, nb := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	nb.Impair(vnic.Impairment{Loss: 1})
	if n, err := a.Send(c, []byte("last words")); n != 10 || err != nil {
		t.Fatalf("send: %d %v", n, err)
	}
	if err := a.Close(c); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		poll()
	}
	if u, l := a.Undelivered(), a.Lingering(); u != 1 || l != 1 {
		t.Fatalf("closed, nothing acknowledged: %d undelivered, %d lingering; want 1 and 1 (%v)", u, l, a.TCPStates())
	}
	nb.Impair(vnic.Impairment{})
	waitFor(t, "FIN-WAIT-2", 5*time.Second, poll, func() bool { return a.TCPStates()["FIN-WAIT-2"] == 1 })
	if u, l := a.Undelivered(), a.Lingering(); u != 0 || l != 1 {
		t.Fatalf("data and FIN acknowledged: %d undelivered, %d lingering; want 0 and 1", u, l)
	}
	got := make([]byte, 64)
	if n, _ := b.Recv(s, got, false); string(got[:n]) != "last words" {
		t.Fatalf("received %q", got[:n])
	}
	if err := b.Close(s); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "TIME-WAIT", 5*time.Second, poll, func() bool { return a.TCPStates()["TIME-WAIT"] == 1 })
	if u, l := a.Undelivered(), a.Lingering(); u != 0 || l != 0 {
		t.Fatalf("in TIME-WAIT: %d undelivered, %d lingering; want 0 and 0", u, l)
	}
}
