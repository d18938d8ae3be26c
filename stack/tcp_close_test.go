package stack_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/internal/gvisorpeer"
	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// eof reports whether a receive sees the end of the stream.
func eof(s *stack.Stack, id stack.SockID) bool {
	n, err := s.Recv(id, make([]byte, 16), false)
	return n == 0 && err == nil
}

// gone reports whether a socket ID no longer names a socket.
func gone(s *stack.Stack, id stack.SockID) bool {
	_, err := s.LocalAddr(id)
	return errors.Is(err, syscall.EBADF)
}

func TestTCPCloseFromServer(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	ourSendBoth := func(st *stack.Stack, id stack.SockID, msg string) {
		if _, err := st.Send(id, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	ourSendBoth(b, s, "last words")
	b.Close(s)
	var got []byte
	waitFor(t, "data then end of stream", 5*time.Second, poll, func() bool {
		buf := make([]byte, 100)
		n, err := a.Recv(c, buf, false)
		got = append(got, buf[:n]...)
		return n == 0 && err == nil
	})
	if string(got) != "last words" {
		t.Errorf("client read %q before the end of the stream", got)
	}
	// Half-closed: the client can still send; the server closed, so its
	// stack answers data with a reset.
	if _, err := a.Send(c, []byte("too late")); err != nil {
		t.Fatalf("send on a half-closed connection: %v", err)
	}
	waitFor(t, "reset for data after close", 5*time.Second, poll, func() bool { return a.Events(c)&stack.Error != 0 })
	// The reset came in CLOSE-WAIT: EPIPE, as Linux's tcp_reset has it, and
	// the end of the stream is still what a read sees.
	if _, err := a.Send(c, []byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("send after the reset: %v, want EPIPE", err)
	}
	if !eof(a, c) {
		t.Error("a read after the reset does not see the end of the stream")
	}
	a.Close(c)
}

func TestTCPSimultaneousClose(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	// Both sides shut down writing before either sees the other's FIN.
	if err := a.Shutdown(c, syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	if err := b.Shutdown(s, syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both ends see the end of the stream", 5*time.Second, poll, func() bool { return eof(a, c) && eof(b, s) })
	// Each FIN crossed the other: CLOSING on both sides, then TIME-WAIT
	// when the ACKs of the FINs arrive (RFC 9293 figure 13).
	waitFor(t, "TIME-WAIT on both sides", 5*time.Second, poll, func() bool {
		return contains(a.DumpSocket(c), "TIME-WAIT") && contains(b.DumpSocket(s), "TIME-WAIT")
	})
	for _, side := range []struct {
		st *stack.Stack
		id stack.SockID
	}{{a, c}, {b, s}} {
		if _, err := side.st.Send(side.id, []byte("x")); !errors.Is(err, syscall.EPIPE) {
			t.Errorf("send after shutdown: %v, want EPIPE", err)
		}
	}
	a.Close(c)
	b.Close(s)
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestTCPTimeWaitEnds(t *testing.T) {
	ma, mb, err := vnic.NewMemPair(vnic.MemConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(m *vnic.Mem, p netip.Prefix) stack.Config {
		return stack.Config{Addr: p, MAC: m.Info().MAC, TimeWait: 50 * time.Millisecond}
	}
	a, _ := stack.New(ma, cfg(ma, addrA), stack.Options{Neighbours: map[netip.Addr]net.HardwareAddr{addrB.Addr(): mb.Info().MAC}})
	b, _ := stack.New(mb, cfg(mb, addrB), stack.Options{Neighbours: map[netip.Addr]net.HardwareAddr{addrA.Addr(): ma.Info().MAC}})
	defer a.Destroy()
	defer b.Destroy()
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	a.Close(c) // active close: a ends in TIME-WAIT
	waitFor(t, "end of stream", 5*time.Second, poll, func() bool { return eof(b, s) })
	b.Close(s)
	waitFor(t, "TIME-WAIT over", 5*time.Second, poll, func() bool {
		// The client's port is free again once TIME-WAIT ends.
		return contains(a.DumpSocket(c), "kind 0")
	})
}

func TestTCPConnectionRefused(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, _ := a.Open(stack.TCP)
	a.Connect(c, netip.AddrPortFrom(addrB.Addr(), 4444)) // nobody listens
	waitFor(t, "refusal", 5*time.Second, poll, func() bool { return a.Events(c)&stack.Error != 0 })
	if err := a.SockError(c); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("SockError = %v, want ECONNREFUSED", err)
	}
	if err := a.SockError(c); err != nil {
		t.Errorf("SockError a second time = %v, want nil", err)
	}
	if b.Counters().RxTCPNoSocket != 1 || b.Counters().TxTCPResets != 1 {
		t.Errorf("b's counters: %s", ptr(b.Counters()))
	}
}

func TestTCPConnectTimesOut(t *testing.T) {
	s, _, _ := memPair(t, vnic.MemConfig{AtoB: vnic.Impairment{Loss: 1}})
	c, _ := s.Open(stack.TCP)
	s.Connect(c, netip.AddrPortFrom(addrB.Addr(), 80))
	// Six SYN retries from 1s doubling: 127s. Too long for a test: check
	// that the retries go out with backoff instead.
	time.Sleep(1100 * time.Millisecond)
	s.Poll()
	if got := s.Counters().TCPRetransmits; got != 1 {
		t.Errorf("after 1.1s: %d SYN retransmissions, want 1", got)
	}
	time.Sleep(1000 * time.Millisecond)
	s.Poll()
	if got := s.Counters().TCPRetransmits; got != 1 {
		t.Errorf("after 2.1s: %d SYN retransmissions, want still 1 (the second waits 2s)", got)
	}
}

func TestTCPAbortiveClose(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	if err := a.SetOption(c, stack.Linger, 0); err != nil {
		t.Fatal(err)
	}
	a.Send(c, []byte("sent before the reset"))
	a.Close(c)
	waitFor(t, "reset", 5*time.Second, poll, func() bool { return b.Events(s)&stack.Error != 0 })
	// What arrived before the reset is read first, then the reset's
	// error, as on Linux.
	buf := make([]byte, 100)
	if n, err := b.Recv(s, buf, false); err != nil || string(buf[:n]) != "sent before the reset" {
		t.Errorf("recv after the peer's abortive close: %q, %v; want what arrived before the reset", buf[:n], err)
	}
	if _, err := b.Recv(s, buf, false); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("recv after the data: %v, want ECONNRESET", err)
	}
	if n, err := b.Recv(s, buf, false); n != 0 || err != nil {
		t.Errorf("recv after the error: %d, %v; want the end of the stream", n, err)
	}
	// Closing with unread data resets too (RFC 2525).
	c2, s2 := connectPair(t, a, b, poll)
	a.Send(c2, []byte("never read"))
	waitFor(t, "data in", 5*time.Second, poll, func() bool { return b.Events(s2)&stack.Readable != 0 })
	b.Close(s2)
	waitFor(t, "reset", 5*time.Second, poll, func() bool { return a.Events(c2)&stack.Error != 0 })
}

// TestTCPSimultaneousOpen connects two sockets to each other at once (RFC
// 9293 figure 8).
func TestTCPSimultaneousOpen(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	ca, _ := a.Open(stack.TCP)
	cb, _ := b.Open(stack.TCP)
	a.Bind(ca, netip.MustParseAddrPort("0.0.0.0:5001"))
	b.Bind(cb, netip.MustParseAddrPort("0.0.0.0:5002"))
	// Both SYNs leave before either side polls.
	a.Connect(ca, netip.AddrPortFrom(addrB.Addr(), 5002))
	b.Connect(cb, netip.AddrPortFrom(addrA.Addr(), 5001))
	waitFor(t, "both connected", 5*time.Second, poll, func() bool {
		return a.Events(ca)&stack.Writable != 0 && b.Events(cb)&stack.Writable != 0
	})
	a.Send(ca, []byte("ping"))
	buf := make([]byte, 10)
	waitFor(t, "data", 5*time.Second, poll, func() bool {
		n, _ := b.Recv(cb, buf, false)
		return n == 4
	})
}

// TestTCPManyConnections opens 1,000 connections at once to netstack and
// moves data on each.
func TestTCPManyConnections(t *testing.T) {
	const n = 1000
	s, peer := withNetstack(t, vnic.MemConfig{FrameCount: 16384, WireSlots: 16384}, stack.Config{Sockets: 2048, RecvBuffer: 16 << 10, SendBuffer: 16 << 10})
	netstackServe(t, peer, 6000, func(c io.ReadWriter) { io.Copy(c, c) })
	ids := make([]stack.SockID, n)
	for i := range ids {
		ids[i], _ = s.Open(stack.TCP)
		if err := s.Connect(ids[i], netip.AddrPortFrom(addrB.Addr(), 6000)); !errors.Is(err, syscall.EINPROGRESS) {
			t.Fatalf("connect %d: %v", i, err)
		}
	}
	waitFor(t, "1000 connections", 60*time.Second, func() { s.Poll() }, func() bool {
		for _, id := range ids {
			if s.Events(id)&stack.Writable == 0 {
				return false
			}
		}
		return true
	})
	for i, id := range ids {
		if _, err := s.Send(id, []byte(fmt.Sprintf("connection %04d", i))); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	for i, id := range ids {
		want := fmt.Sprintf("connection %04d", i)
		var got []byte
		waitFor(t, "echo "+want, 30*time.Second, func() { s.Poll() }, func() bool {
			k, _ := s.Recv(id, buf, false)
			got = append(got, buf[:k]...)
			return len(got) >= len(want)
		})
		if string(got) != want {
			t.Fatalf("connection %d echoed %q", i, got)
		}
	}
	for _, id := range ids {
		s.Close(id)
	}
}

// TestTCPReuseAddr: a server's port with a connection in TIME-WAIT can be
// bound again only with SO_REUSEADDR.
func TestTCPReuseAddr(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	b.Close(listeners[b])
	b.Close(s) // the server closes first: its side ends in TIME-WAIT
	waitFor(t, "end of stream", 5*time.Second, poll, func() bool { return eof(a, c) })
	a.Close(c)
	waitFor(t, "TIME-WAIT", 5*time.Second, poll, func() bool { return contains(b.DumpSocket(s), "TIME-WAIT") })
	l, _ := b.Open(stack.TCP)
	if err := b.Bind(l, netip.MustParseAddrPort("0.0.0.0:80")); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("bind over a TIME-WAIT connection without SO_REUSEADDR: %v, want EADDRINUSE", err)
	}
	b.SetOption(l, stack.ReuseAddr, 1)
	if err := b.Bind(l, netip.MustParseAddrPort("0.0.0.0:80")); err != nil {
		t.Errorf("bind with SO_REUSEADDR: %v", err)
	}
}

// TestTCPReuseAddrRestart: a server restarted while a connection its
// predecessor accepted lives on binds and listens on the port again with
// SO_REUSEADDR (the listener had it, so the connection has it too), as
// on Linux; without it, or beside a listener, the port is taken. The old
// connection still carries data.
func TestTCPReuseAddrRestart(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	open := func(reuse int) stack.SockID {
		l, err := b.Open(stack.TCP)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.SetOption(l, stack.ReuseAddr, reuse); err != nil {
			t.Fatal(err)
		}
		return l
	}
	any80 := netip.AddrPortFrom(netip.Addr{}, 80)
	l := open(1)
	if err := b.Bind(l, any80); err != nil {
		t.Fatal(err)
	}
	if err := b.Listen(l, 0); err != nil {
		t.Fatal(err)
	}
	listeners[b] = l
	c, s := connectPair(t, a, b, poll)
	if err := b.Bind(open(1), any80); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("bind beside a listener, with SO_REUSEADDR: %v, want EADDRINUSE", err)
	}
	b.Close(l) // the old server goes; its connection stays
	if err := b.Bind(open(0), any80); !errors.Is(err, syscall.EADDRINUSE) {
		t.Errorf("bind beside a connection without SO_REUSEADDR: %v, want EADDRINUSE", err)
	}
	l2 := open(1)
	if err := b.Bind(l2, any80); err != nil {
		t.Fatalf("bind beside a connection with SO_REUSEADDR: %v", err)
	}
	if err := b.Listen(l2, 0); err != nil {
		t.Fatalf("listen beside a connection: %v", err)
	}
	if got := transfer(t, a, c, b, s, []byte("still here"), poll, 5*time.Second); string(got) != "still here" {
		t.Errorf("the old connection carried %q after the new listener came", got)
	}
}

// TestTCPHalfClosedKeepalive keeps a half-closed connection (the client
// shut down writing and sits in FIN-WAIT-2, still reading) open past its
// keepalive time: the keepalive timer must probe it, not end it as if it
// were an orphan's FIN-WAIT-2.
func TestTCPHalfClosedKeepalive(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	for _, o := range []struct {
		opt stack.Option
		v   int
	}{{stack.KeepAlive, 1}, {stack.KeepIdle, 1}, {stack.KeepIntvl, 1}, {stack.KeepCount, 2}} {
		if err := a.SetOption(c, o.opt, o.v); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Shutdown(c, syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server to see the end of the stream", 5*time.Second, poll, func() bool { return eof(b, s) })
	// Past the keepalive idle time and more: the peer answers probes.
	end := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(end) {
		poll()
	}
	if _, err := b.Send(s, []byte("still here")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	waitFor(t, "data on the half-closed connection", 5*time.Second, poll, func() bool {
		buf := make([]byte, 64)
		n, _ := a.Recv(c, buf, false)
		got = append(got, buf[:n]...)
		return len(got) >= len("still here")
	})
	if string(got) != "still here" {
		t.Fatalf("client read %q", got)
	}
}

// TestOverflowCountsLiveSockets: Options.Overflow says the socket table is
// full when 7/8 of it hold live connections, and has room again below
// 3/4; TIME-WAIT sockets, which a new connection recycles, never make it
// full: a client that opens and closes connections one after another
// fills the table with TIME-WAIT and stays accelerated.
func TestOverflowCountsLiveSockets(t *testing.T) {
	const table = 32
	var calls []bool
	s, peer := withNetstackOptions(t, vnic.MemConfig{}, stack.Config{Sockets: table},
		stack.Options{Overflow: func(full bool) { calls = append(calls, full) }})
	netstackServe(t, peer, 6000, func(c io.ReadWriter) { io.Copy(io.Discard, c) })
	poll := func() { s.Poll() }
	dial := func() stack.SockID {
		t.Helper()
		id, err := s.Open(stack.TCP)
		if err != nil {
			t.Fatalf("open: %v (%d sockets in use)", err, s.InUse())
		}
		if err := s.Connect(id, netip.AddrPortFrom(addrB.Addr(), 6000)); !errors.Is(err, syscall.EINPROGRESS) {
			t.Fatalf("connect: %v", err)
		}
		waitFor(t, "established", 5*time.Second, poll, func() bool { return s.Events(id)&stack.Writable != 0 })
		return id
	}
	// We close first: each connection ends in TIME-WAIT on our side.
	for i := range 2 * table {
		id := dial()
		s.Close(id)
		// The socket, closed, is the stack's: its row says its state
		// (TCPInfo fails for a closed socket whatever its state, and a
		// FIN-WAIT socket is live, so a wait on it let the table fill
		// with live ones under load). A row gone was recycled from
		// TIME-WAIT.
		waitFor(t, fmt.Sprintf("connection %d in TIME-WAIT", i), 5*time.Second, poll, func() bool {
			for _, r := range s.Sockets() {
				if r.ID == id {
					return r.State == "TIME-WAIT"
				}
			}
			return true
		})
	}
	if c := s.Counters(); c.TCPTimeWaitReuse == 0 || c.SocketsOverflow != 0 || len(calls) != 0 {
		t.Fatalf("after %d connections closed into TIME-WAIT: %d recycled, overflow counted %d, calls %v: want recycling and no overflow",
			2*table, c.TCPTimeWaitReuse, c.SocketsOverflow, calls)
	}
	// Live connections fill it.
	var live []stack.SockID
	for len(calls) == 0 && len(live) < table {
		live = append(live, dial())
	}
	if len(calls) != 1 || !calls[0] || len(live) != table-table/8 {
		t.Fatalf("overflow calls %v after %d live connections: want one call, full, at the %dth", calls, len(live), table-table/8)
	}
	// And it has room again once they go (into TIME-WAIT).
	for _, id := range live {
		s.Close(id)
	}
	waitFor(t, "room again", 5*time.Second, poll, func() bool { return len(calls) > 1 })
	if len(calls) != 2 || calls[1] {
		t.Fatalf("overflow calls %v: want full, then room", calls)
	}
}

// netstackServe serves each connection to the peer's port with serve,
// then closes it, until the test ends.
func netstackServe(t *testing.T, peer *gvisorpeer.Peer, port uint16, serve func(io.ReadWriter)) {
	t.Helper()
	l, err := peer.ListenTCP(port)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
}

// TestConnectOverTimeWait: a socket about to connect (BindConnecting) may
// take a port on which a connection the user closed sits in TIME-WAIT, as
// happens when the kernel, which no longer knows that connection, picks
// the port for the next one's reservation. Connecting to the same peer
// recycles the TIME-WAIT connection; a live connection to the same peer
// keeps its four-tuple (EADDRNOTAVAIL), and a plain bind still finds the
// port in use, as Linux's does.
func TestConnectOverTimeWait(t *testing.T) {
	s, peer := withNetstack(t, vnic.MemConfig{}, stack.Config{})
	netstackServe(t, peer, 6000, func(c io.ReadWriter) { io.Copy(c, c) })
	netstackServe(t, peer, 6001, func(c io.ReadWriter) { io.Copy(c, c) })
	poll := func() { s.Poll() }
	local := netip.AddrPortFrom(addrA.Addr(), 40000)
	dial := func(port uint16) (stack.SockID, error) {
		t.Helper()
		id, err := s.Open(stack.TCP)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.BindConnecting(id, local); err != nil {
			s.Close(id)
			return stack.NullSock, fmt.Errorf("bind: %w", err)
		}
		if err := s.Connect(id, netip.AddrPortFrom(addrB.Addr(), port)); !errors.Is(err, syscall.EINPROGRESS) {
			s.Close(id)
			return stack.NullSock, fmt.Errorf("connect: %w", err)
		}
		waitFor(t, "established", 5*time.Second, poll, func() bool { return s.Events(id)&stack.Writable != 0 })
		return id, nil
	}
	echo := func(id stack.SockID, msg string) { t.Helper(); echoOn(t, s, poll, id, msg) }

	first, err := dial(6000)
	if err != nil {
		t.Fatal(err)
	}
	echo(first, "first")
	s.Close(first) // we close first: TIME-WAIT on our side
	state := func(id stack.SockID) string {
		for _, r := range s.Sockets() {
			if r.ID == id {
				return r.State
			}
		}
		return ""
	}
	waitFor(t, "TIME-WAIT", 5*time.Second, poll, func() bool { return state(first) == "TIME-WAIT" })

	plain, err := s.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(plain, local); !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("plain bind over TIME-WAIT: %v, want EADDRINUSE", err)
	}
	s.Close(plain)

	second, err := dial(6000)
	if err != nil {
		t.Fatalf("connecting from the port of a connection in TIME-WAIT, to the same peer: %v", err)
	}
	if c := s.Counters(); c.TCPTimeWaitReuse != 1 {
		t.Fatalf("TIME-WAIT connections recycled: %d, want 1", c.TCPTimeWaitReuse)
	}
	if st := state(first); st != "" {
		t.Fatalf("the TIME-WAIT connection is still there (%s) beside its successor", st)
	}
	echo(second, "second")

	if _, err := dial(6000); !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Fatalf("connecting on the four-tuple of a live connection: %v, want EADDRNOTAVAIL", err)
	}
	third, err := dial(6001)
	if err != nil {
		t.Fatalf("connecting from a live connection's port to another peer: %v", err)
	}
	echo(third, "third")
	echo(second, "second, still")
}

// echoOn sends msg on connection id, to an echo server, and checks what
// comes back, polling s with poll.
func echoOn(t *testing.T, s *stack.Stack, poll func(), id stack.SockID, msg string) {
	t.Helper()
	if _, err := s.Send(id, []byte(msg)); err != nil {
		t.Fatal(err)
	}
	var got []byte
	waitFor(t, "the echo", 5*time.Second, poll, func() bool {
		buf := make([]byte, 64)
		n, _ := s.Recv(id, buf, false)
		got = append(got, buf[:n]...)
		return len(got) >= len(msg)
	})
	if string(got) != msg {
		t.Fatalf("echo %q, want %q", got, msg)
	}
}

// lastWords connects a to b, has b send "last words" and then its FIN,
// and waits for a in CLOSE-WAIT with the data unread. inject puts a
// segment from b's address on a's wire.
func lastWords(t *testing.T, closeB func(*stack.Stack, stack.SockID) error) (a *stack.Stack, c stack.SockID, poll func(), inject func(pkt.TCPSegment)) {
	t.Helper()
	a, b, na, nb := twoStacksNICs(t, vnic.MemConfig{})
	poll = pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	if _, err := b.Send(s, []byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := closeB(b, s); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "their FIN", 5*time.Second, poll, func() bool { return contains(a.DumpSocket(c), "CLOSE-WAIT") })
	al, _ := a.LocalAddr(c)
	bl, _ := a.RemoteAddr(c)
	src := pkt.Endpoint{MAC: nb.Info().MAC, Addr: bl}
	dst := pkt.Endpoint{MAC: na.Info().MAC, Addr: al}
	return a, c, poll, func(seg pkt.TCPSegment) { drain(nb); injectFrom(t, nb, src, dst, seg) }
}

// readsLastWords checks that the data, then the end of the stream, are
// what a reads.
func readsLastWords(t *testing.T, a *stack.Stack, c stack.SockID) {
	t.Helper()
	buf := make([]byte, 64)
	if n, err := a.Recv(c, buf, false); err != nil || string(buf[:n]) != "last words" {
		t.Errorf("read after the reset: %q, %v; want the data", buf[:n], err)
	}
	if n, err := a.Recv(c, buf, false); n != 0 || err != nil {
		t.Errorf("read after the data: %d, %v; want the end of the stream", n, err)
	}
}

// TestTCPResetAfterClose: a connection ends in order (their FIN, then ours
// acknowledged) while the user still holds the socket and has not read
// the last data. Old segments of the peer can still arrive, and the peer,
// whose connection is gone, answers them and our ACKs with resets. As in
// Linux, whose ended socket leaves the hash table: a reset then finds no
// connection, the data then the end of the stream stay readable, and
// anything else is answered with a reset.
func TestTCPResetAfterClose(t *testing.T) {
	a, c, poll, inject := lastWords(t, (*stack.Stack).Close)
	a.Shutdown(c, syscall.SHUT_WR)
	waitFor(t, "our FIN acknowledged", 5*time.Second, poll, func() bool { return contains(a.DumpSocket(c), "tcp CLOSED") })
	info, _ := a.TCPInfo(c)
	before := a.Counters()
	inject(pkt.TCPSegment{Seq: info.RcvNxt, Flags: header.TCPFlagRst})
	inject(pkt.TCPSegment{Seq: info.RcvNxt - 3, Ack: info.SndNxt, Flags: header.TCPFlagAck | header.TCPFlagPsh, Payload: []byte("old")})
	a.Poll()
	after := a.Counters()
	if n := after.RxTCPResets - before.RxTCPResets; n != 0 {
		t.Errorf("%d resets accepted by an ended connection, want 0", n)
	}
	if n := after.TxTCPResets - before.TxTCPResets; n != 1 {
		t.Errorf("%d resets sent for a segment to an ended connection, want 1", n)
	}
	readsLastWords(t, a, c)
	a.Close(c)
}

// TestTCPResetAfterFin: a reset that ends a half-closed connection (CLOSE-
// WAIT) after the peer's FIN leaves the data, then the end of the stream,
// to be read, as Linux's tcp_recvmsg does; the next write fails with
// EPIPE, as Linux's tcp_reset has it for CLOSE-WAIT.
func TestTCPResetAfterFin(t *testing.T) {
	a, c, _, inject := lastWords(t, func(b *stack.Stack, s stack.SockID) error { return b.Shutdown(s, syscall.SHUT_WR) })
	info, _ := a.TCPInfo(c)
	inject(pkt.TCPSegment{Seq: info.RcvNxt, Flags: header.TCPFlagRst})
	a.Poll()
	if !contains(a.DumpSocket(c), "tcp CLOSED") {
		t.Fatalf("the reset did not end the connection: %s", a.DumpSocket(c))
	}
	readsLastWords(t, a, c)
	if _, err := a.Send(c, []byte("x")); !errors.Is(err, syscall.EPIPE) {
		t.Errorf("write after the reset: %v, want EPIPE", err)
	}
	a.Close(c)
}

// listening80 is two stacks joined, b listening on port 80, and a poll of
// both.
func listening80(t *testing.T) (a, b *stack.Stack, lst stack.SockID, poll func()) {
	a, b = twoStacks(t, vnic.MemConfig{})
	lst, _ = b.Open(stack.TCP)
	if err := b.Bind(lst, netip.AddrPortFrom(netip.Addr{}, 80)); err != nil {
		t.Fatal(err)
	}
	b.Listen(lst, 0)
	return a, b, lst, pollBoth(a, b)
}

// TestTCPSynOverEndedConnection: the server still holds a connection the
// client reset; the client connects again from the same port. As in
// Linux, whose reset socket has left the hash, the listener takes the SYN
// and the new connection works beside the old socket, and closing the
// old socket leaves the new connection be.
func TestTCPSynOverEndedConnection(t *testing.T) {
	a, b, lst, poll := listening80(t)
	dial := func() (c, srv stack.SockID) {
		c, _ = a.Open(stack.TCP)
		a.SetOption(c, stack.ReuseAddr, 1)
		if err := a.Bind(c, netip.AddrPortFrom(netip.Addr{}, 40001)); err != nil {
			t.Fatal(err)
		}
		if err := a.Connect(c, netip.AddrPortFrom(b.Addr(), 80)); !errors.Is(err, syscall.EINPROGRESS) {
			t.Fatalf("connect: %v", err)
		}
		waitFor(t, "connection", 5*time.Second, poll, func() bool { return a.Events(c)&(stack.Writable|stack.Error) != 0 })
		if err := a.SockError(c); err != nil {
			t.Fatalf("connect from port 40001: %v", err)
		}
		waitFor(t, "accept", 5*time.Second, poll, func() bool {
			var err error
			srv, err = b.Accept(lst)
			return err == nil
		})
		return c, srv
	}
	c, old := dial()
	a.SetOption(c, stack.Linger, 0)
	a.Close(c)
	waitFor(t, "reset", 5*time.Second, poll, func() bool { return b.Events(old)&stack.Error != 0 })
	c, srv := dial()
	b.Close(old)
	oneWay := func(from *stack.Stack, fid stack.SockID, to *stack.Stack, tid stack.SockID, msg string) {
		if got := transfer(t, from, fid, to, tid, []byte(msg), poll, 5*time.Second); string(got) != msg {
			t.Fatalf("%q arrived, want %q", got, msg)
		}
	}
	oneWay(a, c, b, srv, "hello")
	oneWay(b, srv, a, c, "there")
	a.Close(c)
	b.Close(srv)
}

// TestTCPResetBeforeAccept: a connection reset while it waits in its
// listener's accept queue stays there, as Linux's does: the accept
// returns it, what arrived before the reset is readable, then the
// reset's ECONNRESET; closing it frees its slot. (BSD's TCP drops it from
// the queue, and so did this stack.) A listener's close still takes such
// a child with it.
func TestTCPResetBeforeAccept(t *testing.T) {
	a, b, lst, poll := listening80(t)
	dialReset := func(msg string) {
		c, _ := a.Open(stack.TCP)
		if err := a.Connect(c, netip.AddrPortFrom(b.Addr(), 80)); !errors.Is(err, syscall.EINPROGRESS) {
			t.Fatalf("connect: %v", err)
		}
		waitFor(t, "connection", 5*time.Second, poll, func() bool { return a.Events(c)&(stack.Writable|stack.Error) != 0 })
		if _, err := a.Send(c, []byte(msg)); err != nil {
			t.Fatalf("send: %v", err)
		}
		waitFor(t, "the data acknowledged", 5*time.Second, poll, func() bool {
			info, err := a.TCPInfo(c)
			return err == nil && info.Unacked == 0 && info.Queued == 0
		})
		a.SetOption(c, stack.Linger, 0)
		a.Close(c)
		for range 3 {
			poll()
		}
	}
	used := b.InUse()
	dialReset("hi")
	srv, err := b.Accept(lst)
	if err != nil {
		t.Fatalf("accept after the reset: %v, want the reset connection", err)
	}
	buf := make([]byte, 8)
	if n, err := b.Recv(srv, buf, false); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("first read: %q, %v; want the data sent before the reset", buf[:n], err)
	}
	if _, err := b.Recv(srv, buf, false); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("second read: %v, want ECONNRESET", err)
	}
	b.Close(srv)
	if got := b.InUse(); got != used {
		t.Errorf("%d sockets in use after the reset connection's close, want %d as before it", got, used)
	}
	// A second one waits in the queue, reset, when the listener closes:
	// both go.
	dialReset("again")
	if got := b.InUse(); got != used+1 {
		t.Errorf("%d sockets in use with a reset connection queued, want %d", got, used+1)
	}
	b.Close(lst)
	poll()
	if got := b.InUse(); got != used-1 {
		t.Errorf("%d sockets in use after the listener's close, want %d", got, used-1)
	}
}

// TestTCPRetireListener: a listener whose port goes to the kernel (its
// socket passed to another process) reads LISTEN-RETIRED, keeps the
// connection its queue holds for its accept, drops a SYN that still
// reaches it (its retransmission finds the kernel's socket once the
// filter is gone; taken, the handshake's ACK could reach the kernel,
// which resets it), and a socket that does not listen cannot be
// retired.
func TestTCPRetireListener(t *testing.T) {
	a, b, lst, poll := listening80(t)
	c, _ := a.Open(stack.TCP)
	if err := a.Connect(c, netip.AddrPortFrom(b.Addr(), 80)); !errors.Is(err, syscall.EINPROGRESS) {
		t.Fatalf("connect: %v", err)
	}
	waitFor(t, "the connection queued", 5*time.Second, poll, func() bool { return b.Events(lst)&stack.Readable != 0 })
	if err := b.RetireListener(lst); err != nil {
		t.Fatalf("retire: %v", err)
	}
	state := ""
	for _, r := range b.Sockets() {
		if r.ID == lst {
			state = r.State
		}
	}
	if state != "LISTEN-RETIRED" {
		t.Errorf("the retired listener reads %q, want LISTEN-RETIRED", state)
	}
	srv, err := b.Accept(lst)
	if err != nil {
		t.Fatalf("accept of the queued connection after the retirement: %v", err)
	}
	c2, _ := a.Open(stack.TCP)
	if err := a.Connect(c2, netip.AddrPortFrom(b.Addr(), 80)); !errors.Is(err, syscall.EINPROGRESS) {
		t.Fatalf("connect: %v", err)
	}
	drops := b.Counters().TCPListenDrops
	waitFor(t, "the SYN dropped", 5*time.Second, poll, func() bool { return b.Counters().TCPListenDrops > drops })
	if ev := a.Events(c2); ev&(stack.Writable|stack.Error) != 0 {
		t.Errorf("a connect to the retired listener was answered (events %v), want its SYN dropped", ev)
	}
	if err := b.RetireListener(srv); !errors.Is(err, stack.ErrInvalid) {
		t.Errorf("retiring a connection: %v, want ErrInvalid", err)
	}
}

// TestTCPFinAckRidesOnFin: the peer's FIN on an open connection is
// acknowledged with the delayed-ACK timer, as Linux's ping-pong mode
// after tcp_fin has it, so that the user's close, which most likely
// follows, sends one segment (our FIN, carrying the ACK) rather than an
// ACK at once and then the FIN. A user that does not close has the ACK
// sent on the timer.
func TestTCPFinAckRidesOnFin(t *testing.T) {
	t.Run("closed", func(t *testing.T) {
		a, b := twoStacks(t, vnic.MemConfig{})
		poll := pollBoth(a, b)
		c, s := connectPair(t, a, b, poll)
		if err := a.Shutdown(c, syscall.SHUT_WR); err != nil {
			t.Fatal(err)
		}
		frames := b.Counters().TxFrames
		waitFor(t, "their FIN", 5*time.Second, func() { b.Poll() }, func() bool { return contains(b.DumpSocket(s), "CLOSE-WAIT") })
		if n := b.Counters().TxFrames - frames; n != 0 {
			t.Errorf("the FIN drew %d frames at once, want 0 (its ACK waits for our close)", n)
		}
		b.Close(s)
		if n := b.Counters().TxFrames - frames; n != 1 {
			t.Errorf("FIN and close sent %d frames, want 1 (our FIN carrying the ACK)", n)
		}
		waitFor(t, "the end of the stream", 5*time.Second, poll, func() bool { return eof(a, c) })
		waitFor(t, "our FIN acknowledged", 5*time.Second, poll, func() bool { return gone(b, s) })
		a.Close(c)
	})
	t.Run("open", func(t *testing.T) {
		a, b := twoStacks(t, vnic.MemConfig{})
		poll := pollBoth(a, b)
		c, s := connectPair(t, a, b, poll)
		before := a.Counters()
		if err := a.Shutdown(c, syscall.SHUT_WR); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "their FIN acknowledged on the timer", 5*time.Second, poll, func() bool { return contains(a.DumpSocket(c), "FIN-WAIT-2") })
		if after := a.Counters(); after.TCPRetransmits != before.TCPRetransmits || after.TCPTLPs != before.TCPTLPs {
			t.Errorf("the FIN was acknowledged only once sent again (%d retransmissions, %d probes)",
				after.TCPRetransmits-before.TCPRetransmits, after.TCPTLPs-before.TCPTLPs)
		}
		if !contains(b.DumpSocket(s), "CLOSE-WAIT") {
			t.Errorf("the server is not in CLOSE-WAIT: %s", b.DumpSocket(s))
		}
		b.Close(s)
		a.Close(c)
	})
}
