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

// sentHeld is what the send queue of (s, id) has sent and not seen
// acknowledged, and what it holds unsent.
func sentHeld(t *testing.T, s *stack.Stack, id stack.SockID) (sent, held uint32) {
	t.Helper()
	ti, err := s.TCPInfo(id)
	if err != nil {
		t.Fatal(err)
	}
	return ti.Unacked, ti.Queued - ti.Unacked
}

// mustSend queues all of b on (s, id).
func mustSend(t *testing.T, s *stack.Stack, id stack.SockID, b []byte) {
	t.Helper()
	if n, err := s.Send(id, b); n != len(b) || err != nil {
		t.Fatalf("send of %d bytes: %d, %v", len(b), n, err)
	}
}

// recvAll reads what (s, id) has, polling with poll for up to d, until it
// has want bytes; it returns how many arrived.
func recvAll(s *stack.Stack, id stack.SockID, want int, d time.Duration, poll func()) int {
	buf := make([]byte, 64<<10)
	got := 0
	for deadline := time.Now().Add(d); got < want && time.Now().Before(deadline); {
		poll()
		n, err := s.Recv(id, buf, false)
		if err == nil {
			got += n
		} else if !errors.Is(err, stack.ErrWouldBlock) {
			return got
		}
	}
	return got
}

// TestCork checks TCP_CORK as tcp(7) has it: partial segments wait,
// corked writes leave as one segment when the cork comes out, full
// segments go at once, TCP_NODELAY pushes what is held once, and corked
// data waits 200 ms at most.
func TestCork(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	if err := a.SetOption(c, stack.Cork, 2); !errors.Is(err, stack.ErrInvalid) {
		t.Errorf("TCP_CORK 2: %v, want ErrInvalid", err)
	}
	if err := a.SetOption(c, stack.Cork, 1); err != nil {
		t.Fatal(err)
	}
	if v, err := a.Option(c, stack.Cork); v != 1 || err != nil {
		t.Errorf("TCP_CORK reads %d, %v; want 1", v, err)
	}

	// An HTTP server's header and body: nothing leaves while corked.
	frames := a.Counters().TxFrames
	mustSend(t, a, c, make([]byte, 239))
	mustSend(t, a, c, make([]byte, 1024))
	if got := recvAll(b, srv, 1, 50*time.Millisecond, poll); got != 0 {
		t.Fatalf("%d bytes arrived through the cork", got)
	}
	if sent, held := sentHeld(t, a, c); sent != 0 || held != 1263 {
		t.Fatalf("corked: %d bytes sent, %d held; want 0 and 1263", sent, held)
	}
	// Out comes the cork: one segment, at once.
	if err := a.SetOption(c, stack.Cork, 0); err != nil {
		t.Fatal(err)
	}
	if n := a.Counters().TxFrames - frames; n != 1 {
		t.Errorf("uncorking sent %d frames, want 1 (the writes in one segment)", n)
	}
	if got := recvAll(b, srv, 1263, 5*time.Second, poll); got != 1263 {
		t.Fatalf("after uncorking %d of 1263 bytes arrived", got)
	}

	// Full segments go while corked; the partial tail waits.
	waitFor(t, "the ACK", 5*time.Second, poll, func() bool { sent, _ := sentHeld(t, a, c); return sent == 0 })
	ti, _ := a.TCPInfo(c)
	mss := ti.MSS
	a.SetOption(c, stack.Cork, 1)
	mustSend(t, a, c, make([]byte, mss+100))
	if sent, held := sentHeld(t, a, c); sent != uint32(mss) || held != 100 {
		t.Errorf("corked, %d bytes: %d sent, %d held; want %d and 100", mss+100, sent, held, mss)
	}
	// TCP_NODELAY pushes what is held, once (Linux's TCP_NAGLE_PUSH).
	a.SetOption(c, stack.NoDelay, 1)
	if _, held := sentHeld(t, a, c); held != 0 {
		t.Errorf("TCP_NODELAY left %d bytes held", held)
	}
	if got := recvAll(b, srv, mss+100, 5*time.Second, poll); got != mss+100 {
		t.Fatalf("%d of %d bytes arrived", got, mss+100)
	}
	mustSend(t, a, c, make([]byte, 10))
	if _, held := sentHeld(t, a, c); held != 10 {
		t.Errorf("still corked after TCP_NODELAY, %d of 10 bytes held", held)
	}

	// The ceiling: held data goes within 200 ms, not much before.
	start := time.Now()
	if got := recvAll(b, srv, 10, 100*time.Millisecond, poll); got != 0 {
		t.Fatalf("corked data arrived after %v", time.Since(start))
	}
	if got := recvAll(b, srv, 10, 2*time.Second, poll); got != 10 {
		t.Fatalf("corked data not sent in 2 s")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("corked data waited %v, want about 200 ms", d)
	}
}

// TestNagle checks Nagle's algorithm: a partial segment waits while data
// is unacknowledged, full ones do not, and the ACK sends what waited.
func TestNagle(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	ti, _ := a.TCPInfo(c)
	mss := ti.MSS
	mustSend(t, a, c, make([]byte, 100))
	if sent, held := sentHeld(t, a, c); sent != 100 || held != 0 {
		t.Errorf("a small write with nothing in flight: %d sent, %d held; want it sent", sent, held)
	}
	mustSend(t, a, c, make([]byte, 2*mss+50))
	if sent, held := sentHeld(t, a, c); sent != uint32(2*mss+100) || held != 50 {
		t.Errorf("%d more bytes: %d sent, %d held; want the full segments sent and 50 held", 2*mss+50, sent, held)
	}
	if got := recvAll(b, srv, 2*mss+150, 5*time.Second, poll); got != 2*mss+150 {
		t.Fatalf("%d of %d bytes arrived", got, 2*mss+150)
	}
}

// TestAutoCork checks autocorking (tcp_autocork.go): with TCP_NODELAY
// set, a SendCorked's partial segment waits for its sender's next wait
// (KickHeld) or the stack's next poll, a second SendCorked tops it up, and
// out they go as one segment; a Send, a full segment and a FIN go at once.
func TestAutoCork(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	a.SetOption(c, stack.NoDelay, 1)
	ti, _ := a.TCPInfo(c)
	mss := ti.MSS

	// nginx's header (writev) and body (sendfile): one segment.
	frames := a.Counters().TxFrames
	for _, n := range []int{239, 1024} {
		if k, err := a.SendCorked(c, make([]byte, n)); k != n || err != nil {
			t.Fatalf("SendMore of %d bytes: %d, %v", n, k, err)
		}
	}
	if sent, held := sentHeld(t, a, c); sent != 0 || held != 1263 {
		t.Fatalf("before the wait: %d bytes sent, %d held; want 0 and 1263", sent, held)
	}
	if !a.KickOwed() {
		t.Error("KickOwed is false with a segment waiting for the sender's wait")
	}
	a.KickHeld()
	if n := a.Counters().TxFrames - frames; n != 1 {
		t.Errorf("the wait sent %d frames, want 1 (both writes in one segment)", n)
	}
	if a.KickOwed() {
		t.Error("KickOwed is still true after KickHeld")
	}
	if got := recvAll(b, srv, 1263, 5*time.Second, poll); got != 1263 {
		t.Fatalf("%d of 1263 bytes arrived", got)
	}

	// A poll of the stack sends it too.
	mustSendMore := func(n int) {
		t.Helper()
		if k, err := a.SendCorked(c, make([]byte, n)); k != n || err != nil {
			t.Fatalf("SendMore of %d bytes: %d, %v", n, k, err)
		}
	}
	waitFor(t, "the ACK", 5*time.Second, poll, func() bool { sent, _ := sentHeld(t, a, c); return sent == 0 })
	mustSendMore(100)
	a.Poll()
	if sent, held := sentHeld(t, a, c); sent != 100 || held != 0 {
		t.Errorf("after a poll: %d sent, %d held; want 100 sent", sent, held)
	}
	// Full segments go at once, the partial tail waits.
	waitFor(t, "the ACK", 5*time.Second, poll, func() bool { sent, _ := sentHeld(t, a, c); return sent == 0 })
	mustSendMore(mss + 50)
	if sent, held := sentHeld(t, a, c); sent != uint32(mss) || held != 50 {
		t.Errorf("SendMore of %d bytes: %d sent, %d held; want %d and 50", mss+50, sent, held, mss)
	}
	a.KickHeld()
	// A plain Send is not held.
	waitFor(t, "the ACK", 5*time.Second, poll, func() bool { sent, _ := sentHeld(t, a, c); return sent == 0 })
	mustSend(t, a, c, make([]byte, 10))
	if sent, held := sentHeld(t, a, c); sent != 10 || held != 0 {
		t.Errorf("Send of 10 bytes: %d sent, %d held; want them sent", sent, held)
	}
	// Nor is the Go library's SendMore (its kick is held, not its segment).
	waitFor(t, "the ACK", 5*time.Second, poll, func() bool { sent, _ := sentHeld(t, a, c); return sent == 0 })
	if k, err := a.SendMore(c, make([]byte, 10)); k != 10 || err != nil {
		t.Fatalf("SendMore: %d, %v", k, err)
	}
	if sent, held := sentHeld(t, a, c); sent != 10 || held != 0 {
		t.Errorf("SendMore of 10 bytes: %d sent, %d held; want them sent", sent, held)
	}
	a.KickHeld()
	// A FIN pushes what waits, and rides on it: one segment.
	waitFor(t, "the ACK", 5*time.Second, poll, func() bool { sent, _ := sentHeld(t, a, c); return sent == 0 })
	mustSendMore(20)
	frames = a.Counters().TxFrames
	if err := a.Shutdown(c, syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	if sent, _ := sentHeld(t, a, c); sent != 21 {
		t.Errorf("after shutdown: %d sent; want the 20 bytes and the FIN", sent)
	}
	if n := a.Counters().TxFrames - frames; n != 1 {
		t.Errorf("the held 20 bytes and the FIN left in %d frames, want 1", n)
	}
	if got := recvAll(b, srv, mss+50+100+10+10+20, 5*time.Second, poll); got != mss+50+100+10+10+20 {
		t.Fatalf("%d of %d bytes arrived", got, mss+50+100+10+10+20)
	}
	waitFor(t, "the end of the stream", 5*time.Second, poll, func() bool { return eof(b, srv) })

	// A sender that answers many sockets in one turn: what it held
	// longer than the bound (50 µs) goes at its next SendMore.
	c2, _ := connectPair(t, a, b, poll)
	c3, _ := connectPair(t, a, b, poll)
	a.SetOption(c2, stack.NoDelay, 1)
	a.SetOption(c3, stack.NoDelay, 1)
	if k, err := a.SendCorked(c2, make([]byte, 30)); k != 30 || err != nil {
		t.Fatalf("SendMore: %d, %v", k, err)
	}
	time.Sleep(time.Millisecond)
	if k, err := a.SendCorked(c3, make([]byte, 30)); k != 30 || err != nil {
		t.Fatalf("SendMore: %d, %v", k, err)
	}
	if sent, held := sentHeld(t, a, c2); sent != 30 || held != 0 {
		t.Errorf("held for a millisecond, then another socket's SendMore: %d sent, %d held; want 30 sent", sent, held)
	}
	if sent, held := sentHeld(t, a, c3); sent != 0 || held != 30 {
		t.Errorf("the other socket: %d sent, %d held; want 30 held", sent, held)
	}
	a.KickHeld()
}

// TestReadAckWaits checks that the ACK a read owes (windowUpdateLocked:
// the read emptied the queue of a connection not yet known to answer)
// waits, for a RecvCorked, until its reader's answer carries it or its
// next wait sends it; a plain Recv sends it at once.
func TestReadAckWaits(t *testing.T) {
	var a, b *stack.Stack
	// request connects a client (a) to a server (b), each a stack of its
	// own, and has the request reach the server.
	request := func(t *testing.T) (stack.SockID, stack.SockID) {
		t.Helper()
		a, b, _, _ = twoStacksNICs(t, vnic.MemConfig{})
		c, srv := connectPair(t, a, b, pollBoth(a, b))
		mustSend(t, a, c, []byte("GET /"))
		waitFor(t, "the request", 5*time.Second, func() { b.Poll() }, func() bool { return b.Events(srv)&stack.Readable != 0 })
		return c, srv
	}
	read := func(t *testing.T, srv stack.SockID, corked bool) {
		t.Helper()
		buf := make([]byte, 64)
		recv := b.Recv
		if corked {
			recv = b.RecvCorked
		}
		if n, err := recv(srv, buf, false); n != 5 || err != nil {
			t.Fatalf("read: %d, %v; want the request's 5 bytes", n, err)
		}
	}
	acked := func(t *testing.T, c stack.SockID) {
		t.Helper()
		a.Poll()
		if sent, _ := sentHeld(t, a, c); sent != 0 {
			t.Errorf("the client's request is unacknowledged (%d bytes)", sent)
		}
	}

	for _, tc := range []struct {
		name           string
		corked, answer bool
		atRead, atWait uint64 // frames sent by the read, and by then the wait
		why            string
	}{
		{"answered", true, true, 0, 1, "the answer carries the ACK"},
		{"unanswered", true, false, 0, 1, "the wait sends the ACK"},
		{"plain", false, false, 1, 1, "a plain read sends its ACK at once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, srv := request(t)
			frames := b.Counters().TxFrames
			read(t, srv, tc.corked)
			if n := b.Counters().TxFrames - frames; n != tc.atRead {
				t.Errorf("the read sent %d frames, want %d (%s)", n, tc.atRead, tc.why)
			}
			if tc.corked && !b.KickOwed() {
				t.Error("KickOwed is false with an ACK waiting for the reader's wait")
			}
			if tc.answer {
				if k, err := b.SendCorked(srv, []byte("200 OK")); k != 6 || err != nil {
					t.Fatalf("answer: %d, %v", k, err)
				}
			}
			b.KickHeld()
			if n := b.Counters().TxFrames - frames; n != tc.atWait {
				t.Errorf("by the wait %d frames, want %d (%s)", n, tc.atWait, tc.why)
			}
			acked(t, c)
		})
	}
}

// TestDeferAccept checks TCP_DEFER_ACCEPT as Linux has it: a connection
// whose client sends nothing is not accepted while the listener waits,
// one whose client sends is accepted at once with its data, and once the
// wait is over the silent one is accepted too.
func TestDeferAccept(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	l, _ := b.Open(stack.TCP)
	if err := b.Bind(l, netip.AddrPortFrom(netip.Addr{}, 81)); err != nil {
		t.Fatal(err)
	}
	if err := b.Listen(l, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.SetOption(l, stack.DeferAccept, -1); !errors.Is(err, stack.ErrInvalid) {
		t.Errorf("TCP_DEFER_ACCEPT -1: %v, want ErrInvalid", err)
	}
	if err := b.SetOption(l, stack.DeferAccept, 1); err != nil {
		t.Fatal(err)
	}
	if v, err := b.Option(l, stack.DeferAccept); v != 1 || err != nil {
		t.Errorf("TCP_DEFER_ACCEPT reads %d, %v; want 1", v, err)
	}
	dial := func() stack.SockID {
		t.Helper()
		c, _ := a.Open(stack.TCP)
		if err := a.Connect(c, netip.AddrPortFrom(b.Addr(), 81)); !errors.Is(err, syscall.EINPROGRESS) {
			t.Fatalf("connect: %v", err)
		}
		waitFor(t, "the client's handshake", 5*time.Second, poll, func() bool { return a.Events(c)&stack.Writable != 0 })
		return c
	}
	accept := func(d time.Duration) (stack.SockID, bool) {
		for end := time.Now().Add(d); time.Now().Before(end); {
			poll()
			if c, err := b.Accept(l); err == nil {
				return c, true
			}
		}
		return stack.NullSock, false
	}
	silent := dial()
	start := time.Now()
	if _, ok := accept(300 * time.Millisecond); ok {
		t.Fatal("a connection that sent nothing was accepted during the wait")
	}
	talker := dial()
	mustSend(t, a, talker, []byte("hello"))
	srv, ok := accept(5 * time.Second)
	if !ok {
		t.Fatal("a connection that sent data was not accepted")
	}
	buf := make([]byte, 16)
	if n, err := b.Recv(srv, buf, false); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("the first accepted: %q, %v; want the talker's hello", buf[:n], err)
	}
	if v, err := b.Option(srv, stack.DeferAccept); v != 0 || err != nil {
		t.Errorf("an accepted connection's TCP_DEFER_ACCEPT reads %d, %v; want 0, as on Linux", v, err)
	}
	srv2, ok := accept(5 * time.Second)
	if !ok {
		t.Fatal("the silent connection was not accepted after the wait")
	}
	if d := time.Since(start); d < 900*time.Millisecond {
		t.Errorf("the silent connection was accepted after %v, within the wait of 1 s", d)
	}
	if _, err := b.Recv(srv2, buf, false); !errors.Is(err, stack.ErrWouldBlock) {
		t.Errorf("the silent connection reads %v, want ErrWouldBlock", err)
	}
	mustSend(t, a, silent, []byte("late"))
	if got := recvAll(b, srv2, 4, 5*time.Second, poll); got != 4 {
		t.Errorf("the silent connection, accepted, got %d of 4 bytes", got)
	}
}

// TestQuickAck: TCP_QUICKACK as Linux has it. 1 sends at once the ACK a
// connection owes on its delayed-ACK timer, and reads back 1; 0 reads
// back 0 (ping-pong mode: reads leave their ACK to the answer).
func TestQuickAck(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	waitAcked(t, a, c, poll, 2*time.Second)
	mustSend(t, a, c, []byte("abc"))
	waitFor(t, "the data", 2*time.Second, func() { a.Poll(); b.Poll() }, func() bool { return b.Events(srv)&stack.Readable != 0 })
	if sent, _ := sentHeld(t, a, c); sent != 3 {
		t.Fatalf("the client's 3 bytes acknowledged before the delayed-ACK timer (%d unacknowledged): nothing to test", sent)
	}
	frames, dump := b.Counters().TxFrames, b.DumpSocket(srv)
	if err := b.SetOption(srv, stack.QuickAck, 1); err != nil {
		t.Fatal(err)
	}
	if n := b.Counters().TxFrames - frames; n != 1 {
		t.Errorf("TCP_QUICKACK 1 sent %d frames, want 1: the ACK owed (before: %s)", n, dump)
	}
	waitAcked(t, a, c, func() { a.Poll() }, time.Second) // the wire's delay
	for _, v := range []int{1, 0, 1, 2} {
		if err := b.SetOption(srv, stack.QuickAck, v); err != nil {
			t.Fatal(err)
		}
		if got, err := b.Option(srv, stack.QuickAck); got != min(v, 1) || err != nil {
			t.Errorf("TCP_QUICKACK set to %d reads back %d, %v; want %d", v, got, err, min(v, 1))
		}
	}
	// An even value with an ACK owed sends it, then delays again.
	mustSend(t, a, c, []byte("def"))
	waitFor(t, "more data", 2*time.Second, func() { a.Poll(); b.Poll() }, func() bool {
		ti, _ := b.TCPInfo(srv)
		return ti.Unread == 6
	})
	frames = b.Counters().TxFrames
	b.SetOption(srv, stack.QuickAck, 2)
	if n := b.Counters().TxFrames - frames; n != 1 {
		t.Errorf("TCP_QUICKACK 2 with an ACK owed sent %d frames, want 1", n)
	}
	if got, _ := b.Option(srv, stack.QuickAck); got != 0 {
		t.Errorf("TCP_QUICKACK 2 with an ACK owed reads back %d, want 0 (delaying again)", got)
	}
}

// TestLowWaterMarks: SO_RCVLOWAT and TCP_NOTSENT_LOWAT as Linux has
// them. A connection is readable with the mark's bytes queued, not with
// fewer; the mark is at most half the receive buffer SO_RCVBUF set. With
// TCP_NOTSENT_LOWAT, it is writable while less than half the mark is
// unsent, and a send fills the last frame's room but takes no new frame
// once the mark is unsent.
func TestLowWaterMarks(t *testing.T) {
	a, b, _, _ := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	waitAcked(t, a, c, poll, 2*time.Second)
	if err := b.SetOption(srv, stack.RcvLowat, 100); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Option(srv, stack.RcvLowat); got != 100 {
		t.Errorf("SO_RCVLOWAT reads back %d, want 100", got)
	}
	unread := func(n uint32) func() bool {
		return func() bool { ti, _ := b.TCPInfo(srv); return ti.Unread == n }
	}
	mustSend(t, a, c, make([]byte, 40))
	waitFor(t, "40 bytes", 2*time.Second, poll, unread(40))
	if ev := b.Events(srv); ev&stack.Readable != 0 {
		t.Errorf("40 bytes queued under a mark of 100: events %v, want not readable", ev)
	}
	mustSend(t, a, c, make([]byte, 70))
	waitFor(t, "110 bytes", 2*time.Second, poll, unread(110))
	if ev := b.Events(srv); ev&stack.Readable == 0 {
		t.Errorf("110 bytes queued under a mark of 100: events %v, want readable", ev)
	}
	// 0 reads back as 1 (Linux's default); a negative value is the most.
	for _, v := range []int{0, -1} {
		b.SetOption(srv, stack.RcvLowat, v)
		if got, _ := b.Option(srv, stack.RcvLowat); v == 0 && got != 1 || v < 0 && got < 1<<20 {
			t.Errorf("SO_RCVLOWAT %d reads back %d", v, got)
		}
	}
	if err := b.SetOption(srv, stack.RecvBuffer, 8192); err != nil {
		t.Fatal(err)
	}
	b.SetOption(srv, stack.RcvLowat, 100000)
	if got, _ := b.Option(srv, stack.RcvLowat); got != 4096 {
		t.Errorf("SO_RCVLOWAT 100000 with SO_RCVBUF 8192 reads back %d, want 4096", got)
	}

	if err := a.SetOption(c, stack.NotSentLowat, 100); err != nil {
		t.Fatal(err)
	}
	if err := a.SetOption(c, stack.Cork, 1); err != nil {
		t.Fatal(err)
	}
	if ev := a.Events(c); ev&stack.Writable == 0 {
		t.Errorf("nothing unsent under TCP_NOTSENT_LOWAT 100: events %v, want writable", ev)
	}
	mustSend(t, a, c, make([]byte, 60))
	if ev := a.Events(c); ev&stack.Writable != 0 {
		t.Errorf("60 bytes unsent (corked) under TCP_NOTSENT_LOWAT 100: events %v, want not writable", ev)
	}
	if n, err := a.Send(c, make([]byte, 30)); n != 30 || err != nil {
		t.Errorf("a send into the last frame's room with 60 bytes unsent took %d, %v; want 30", n, err)
	}
	a.SetOption(c, stack.Cork, 0)
	waitFor(t, "writable", 2*time.Second, poll, func() bool { return a.Events(c)&stack.Writable != 0 })

	// The peer's window closed (its 8 KiB buffer unread): sends stop at
	// the mark, a frame past it at most, with the send buffer's room.
	unsent := func() int { ti, _ := a.TCPInfo(c); return int(ti.Queued - ti.Unacked) }
	blocked := false
	for i := 0; i < 100 && !blocked; i++ {
		_, err := a.Send(c, make([]byte, 4096))
		blocked = err == stack.ErrWouldBlock
		poll()
	}
	ti, _ := a.TCPInfo(c)
	if !blocked || ti.Queued >= ti.SndBuf/2 {
		t.Fatalf("sends into a closed window: blocked %v with %d bytes queued of a send buffer of %d", blocked, ti.Queued, ti.SndBuf)
	}
	if n := unsent(); n < 100 || n >= 100+ti.MSS {
		t.Errorf("sends stopped with %d bytes unsent, want from the mark (100) to a frame past it", n)
	}
	if ev := a.Events(c); ev&stack.Writable != 0 {
		t.Errorf("%d bytes unsent under TCP_NOTSENT_LOWAT 100: events %v, want not writable", unsent(), ev)
	}
	buf := make([]byte, 1<<16)
	waitFor(t, "all sent", 5*time.Second, func() { poll(); b.Recv(srv, buf, false) }, func() bool { return unsent() == 0 })
	if ev := a.Events(c); ev&stack.Writable == 0 {
		t.Errorf("nothing unsent under TCP_NOTSENT_LOWAT 100: events %v, want writable", ev)
	}
}

// TestNotSentLowatDefault: a connection that sets no TCP_NOTSENT_LOWAT
// (or sets 0) has its stack's (net.ipv4.tcp_notsent_lowat,
// Config.NotSentLowat), as Linux's tcp_notsent_lowat, and reads back 0;
// its own mark, set, stands instead.
func TestNotSentLowatDefault(t *testing.T) {
	a, wa, wb := memPair(t, vnic.MemConfig{})
	b := peerStack(t, wa, wb, stack.Config{NotSentLowat: 100}, stack.Options{})
	poll := pollBoth(a, b)
	c, srv := connectPair(t, a, b, poll)
	if got, _ := b.Option(srv, stack.NotSentLowat); got != 0 {
		t.Errorf("TCP_NOTSENT_LOWAT of an accepted connection that set none reads %d, want 0", got)
	}
	if err := b.SetOption(srv, stack.Cork, 1); err != nil {
		t.Fatal(err)
	}
	writable := func() bool { return b.Events(srv)&stack.Writable != 0 }
	if !writable() {
		t.Errorf("nothing unsent under the stack's TCP_NOTSENT_LOWAT 100: not writable")
	}
	mustSend(t, b, srv, make([]byte, 60))
	if writable() {
		t.Errorf("60 bytes unsent (corked) under the stack's TCP_NOTSENT_LOWAT 100: writable")
	}
	b.SetOption(srv, stack.NotSentLowat, 1000)
	if !writable() {
		t.Errorf("60 bytes unsent under its own TCP_NOTSENT_LOWAT 1000: not writable")
	}
	b.SetOption(srv, stack.NotSentLowat, 0)
	if writable() {
		t.Errorf("60 bytes unsent with TCP_NOTSENT_LOWAT set to 0 (the stack's 100): writable")
	}
	// The other stack's default is no limit.
	if err := a.SetOption(c, stack.Cork, 1); err != nil {
		t.Fatal(err)
	}
	mustSend(t, a, c, make([]byte, 60))
	if a.Events(c)&stack.Writable == 0 {
		t.Errorf("60 bytes unsent on a stack with no TCP_NOTSENT_LOWAT: not writable")
	}
	b.SetOption(srv, stack.Cork, 0)
	waitFor(t, "writable", 2*time.Second, poll, writable)
}
