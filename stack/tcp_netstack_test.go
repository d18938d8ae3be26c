package stack_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/internal/gvisorpeer"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// withNetstack is our stack (a) against gVisor's netstack (b) over an
// in-memory wire, netstack pumped by its own goroutine.
func withNetstack(t *testing.T, cfg vnic.MemConfig, scfg stack.Config) (*stack.Stack, *gvisorpeer.Peer) {
	t.Helper()
	return withNetstackOptions(t, cfg, scfg, stack.Options{})
}

// withNetstackOptions is withNetstack with the stack's options (its
// neighbours are set).
func withNetstackOptions(t *testing.T, cfg vnic.MemConfig, scfg stack.Config, opt stack.Options) (*stack.Stack, *gvisorpeer.Peer) {
	t.Helper()
	a, b, err := vnic.NewMemPair(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	scfg.Addr, scfg.MAC = addrA, a.Info().MAC
	opt.Neighbours = map[netip.Addr]net.HardwareAddr{addrB.Addr(): b.Info().MAC}
	s, err := stack.New(a, scfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	peer, err := gvisorpeer.New(b, addrB, map[netip.Addr]net.HardwareAddr{addrA.Addr(): a.Info().MAC})
	if err != nil {
		t.Fatal(err)
	}
	peer.Run()
	t.Cleanup(func() {
		peer.Close()
		s.Destroy()
	})
	return s, peer
}

// ourSend writes all of data on our socket, polling.
func ourSend(t *testing.T, s *stack.Stack, id stack.SockID, data []byte, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for sent := 0; sent < len(data); {
		n, err := s.Send(id, data[sent:])
		if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
			t.Fatalf("send after %d bytes: %v", sent, err)
		}
		sent += n
		s.Poll()
		if time.Now().After(deadline) {
			t.Fatalf("send: %d of %d bytes in %v (%s)", sent, len(data), timeout, ptr(s.Counters()))
		}
	}
}

// ourRecv reads n bytes (or to the end of the stream, if n < 0).
func ourRecv(t *testing.T, s *stack.Stack, id stack.SockID, n int, timeout time.Duration) []byte {
	t.Helper()
	var got []byte
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(timeout)
	for n < 0 || len(got) < n {
		k, err := s.Recv(id, buf, false)
		switch {
		case err == nil && k == 0:
			if n >= 0 {
				t.Fatalf("end of stream after %d of %d bytes", len(got), n)
			}
			return got
		case err != nil && !errors.Is(err, stack.ErrWouldBlock):
			t.Fatalf("recv after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:k]...)
		if k == 0 {
			s.Poll()
		}
		if time.Now().After(deadline) {
			t.Fatalf("recv: %d bytes in %v (%s)", len(got), timeout, ptr(s.Counters()))
		}
	}
	return got
}

// TestTCPClientToNetstack: our stack connects to netstack, data both ways,
// our side closes first.
func TestTCPClientToNetstack(t *testing.T) {
	s, peer := withNetstack(t, vnic.MemConfig{}, stack.Config{})
	l, err := peer.ListenTCP(8080)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	id, _ := s.Open(stack.TCP)
	if err := s.Connect(id, netip.AddrPortFrom(addrB.Addr(), 8080)); !errors.Is(err, syscall.EINPROGRESS) {
		t.Fatal(err)
	}
	waitFor(t, "connected", 5*time.Second, func() { s.Poll() }, func() bool { return s.Events(id)&stack.Writable != 0 })
	var gc net.Conn
	select {
	case gc = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("netstack did not accept")
	}
	defer gc.Close()

	data := randomBytes(4<<20, 1)
	go func() { // netstack echoes everything back, and closes at the end
		io.Copy(gc, gc)
		gc.Close()
	}()
	// Write and read from one goroutine: ours is polled.
	got := make([]byte, 0, len(data))
	buf := make([]byte, 64<<10)
	sent := 0
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < len(data) {
		if sent < len(data) {
			n, err := s.Send(id, data[sent:min(len(data), sent+64<<10)])
			if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
				t.Fatal(err)
			}
			sent += n
		}
		s.Poll()
		n, err := s.Recv(id, buf, false)
		if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
		if time.Now().After(deadline) {
			t.Fatalf("echo: sent %d, got back %d of %d (%s)", sent, len(got), len(data), ptr(s.Counters()))
		}
	}
	if !bytes.Equal(got, data) {
		t.Fatal("echoed data differs")
	}
	// We close; netstack sees the end of the stream and closes too. Our
	// side, the active closer, ends in TIME-WAIT with nothing else left.
	s.Close(id)
	waitFor(t, "our side in TIME-WAIT", 5*time.Second, func() { s.Poll(); time.Sleep(100 * time.Microsecond) }, func() bool {
		st := s.TCPStates()
		return len(st) == 1 && st["TIME-WAIT"] == 1
	})
}

// TestTCPServerForNetstack: netstack connects to our listener, sends a
// request, we answer and netstack closes first.
func TestTCPServerForNetstack(t *testing.T) {
	s, peer := withNetstack(t, vnic.MemConfig{}, stack.Config{})
	l, _ := s.Open(stack.TCP)
	if err := s.Bind(l, netip.MustParseAddrPort("0.0.0.0:9000")); err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(l, 16); err != nil {
		t.Fatal(err)
	}
	type result struct {
		reply []byte
		err   error
	}
	res := make(chan result, 1)
	req := randomBytes(300000, 2)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		c, err := peer.DialTCP(ctx, netip.AddrPortFrom(addrA.Addr(), 9000))
		if err != nil {
			res <- result{err: err}
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Write(req); err != nil {
			res <- result{err: err}
			return
		}
		c.CloseWrite()
		reply, err := io.ReadAll(c)
		res <- result{reply, err}
	}()
	var conn stack.SockID
	waitFor(t, "accept", 5*time.Second, func() { s.Poll() }, func() bool {
		var err error
		conn, err = s.Accept(l)
		return err == nil
	})
	got := ourRecv(t, s, conn, -1, 20*time.Second)
	if !bytes.Equal(got, req) {
		t.Fatalf("request: %d bytes, want %d, equal %v", len(got), len(req), bytes.Equal(got, req))
	}
	reply := append([]byte("reply: "), got[:1000]...)
	ourSend(t, s, conn, reply, 10*time.Second)
	s.Close(conn)
	var r result
	waitFor(t, "netstack's reply", 20*time.Second, func() { s.Poll() }, func() bool {
		select {
		case r = <-res:
			return true
		default:
			return false
		}
	})
	if r.err != nil || !bytes.Equal(r.reply, reply) {
		t.Fatalf("netstack: %d bytes, %v", len(r.reply), r.err)
	}
}

// bulk moves n bytes each way between our stack and netstack at once, over
// a wire impaired by imp, and checks every byte.
func bulk(t *testing.T, n int, imp vnic.Impairment, seed uint64, timeout time.Duration) (*stack.Stack, stack.Counters) {
	t.Helper()
	s, peer := withNetstack(t, vnic.MemConfig{Seed: seed, AtoB: imp, BtoA: imp, FrameCount: 8192},
		stack.Config{MinRTO: 5 * time.Millisecond, RecvBuffer: 1 << 20, SendBuffer: 1 << 20})
	l, err := peer.ListenTCP(7000)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fromPeer := randomBytes(n, seed+1)
	toPeer := randomBytes(n, seed+2)
	peerGot := make(chan []byte, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			peerGot <- nil
			return
		}
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			c.Write(fromPeer)
			c.(interface{ CloseWrite() error }).CloseWrite()
		}()
		b, _ := io.ReadAll(c)
		<-wrote // closing before the writer is done would cut its data short
		c.Close()
		peerGot <- b
	}()
	id, _ := s.Open(stack.TCP)
	s.Connect(id, netip.AddrPortFrom(addrB.Addr(), 7000))
	waitFor(t, "connected", 10*time.Second, func() { s.Poll() }, func() bool { return s.Events(id)&stack.Writable != 0 })

	got := make([]byte, 0, n)
	buf := make([]byte, 256<<10)
	sent, eof, closed := 0, false, false
	deadline := time.Now().Add(timeout)
	for !eof || !closed {
		if time.Now().After(deadline) {
			t.Fatalf("bulk: sent %d, received %d of %d in %v (%s)\n%s", sent, len(got), n, timeout, ptr(s.Counters()), s.DumpSocket(id))
		}
		if sent < n {
			k, err := s.Send(id, toPeer[sent:min(n, sent+256<<10)])
			if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
				t.Fatal(err)
			}
			sent += k
		} else if !closed {
			if err := s.Shutdown(id, syscall.SHUT_WR); err != nil {
				t.Fatal(err)
			}
			closed = true
		}
		s.Poll()
		k, err := s.Recv(id, buf, false)
		switch {
		case err == nil && k == 0:
			eof = true
		case err != nil && !errors.Is(err, stack.ErrWouldBlock):
			t.Fatal(err)
		}
		got = append(got, buf[:k]...)
	}
	if !bytes.Equal(got, fromPeer) {
		first := 0
		for first < len(got) && got[first] == fromPeer[first] {
			first++
		}
		t.Fatalf("netstack -> ours: %d bytes, want %d; first difference at %d (%s)\n%s", len(got), n, first, ptr(s.Counters()), s.DumpSocket(id))
	}
	var pg []byte
	for end := time.Now().Add(timeout); pg == nil; {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for netstack to read everything: %s (%s)", s.DumpSocket(id), ptr(s.Counters()))
		}
		s.Poll()
		select {
		case pg = <-peerGot:
		default:
		}
	}
	if !bytes.Equal(pg, toPeer) {
		t.Fatalf("ours -> netstack: %d bytes, want %d; equal %v", len(pg), n, bytes.Equal(pg, toPeer))
	}
	s.Close(id)
	return s, s.Counters()
}

func TestTCPBulkWithNetstack(t *testing.T) {
	n := 64 << 20
	if testing.Short() {
		n = 8 << 20
	}
	start := time.Now()
	_, c := bulk(t, n, vnic.Impairment{}, 10, 120*time.Second)
	t.Logf("%d MiB each way in %v (%s)", n>>20, time.Since(start), &c)
}

func TestTCPBulkWithLoss(t *testing.T) {
	n := 64 << 20
	if testing.Short() {
		n = 4 << 20
	}
	start := time.Now()
	_, c := bulk(t, n, vnic.Impairment{Loss: 0.02}, 11, 120*time.Second)
	t.Logf("%d MiB each way with 2%% loss in %v (%s)", n>>20, time.Since(start), &c)
	if c.TCPRetransmits == 0 {
		t.Error("no retransmissions with 2% loss")
	}
}

func TestTCPBulkWithReordering(t *testing.T) {
	n := 64 << 20
	if testing.Short() {
		n = 4 << 20
	}
	start := time.Now()
	_, c := bulk(t, n, vnic.Impairment{Reorder: 0.05, ReorderDelay: 200 * time.Microsecond, Duplicate: 0.01}, 12, 300*time.Second)
	t.Logf("%d MiB each way with 5%% reordering and 1%% duplication in %v (%s)", n>>20, time.Since(start), &c)
	if c.RxTCPOutOfOrder == 0 {
		t.Error("nothing arrived out of order")
	}
}

// TestTCPResetsWithNetstack: connection refused by netstack, netstack's
// abortive close (SO_LINGER 0) seen by us, and ours seen by netstack.
func TestTCPResetsWithNetstack(t *testing.T) {
	s, peer := withNetstack(t, vnic.MemConfig{}, stack.Config{})
	poll := func() { s.Poll() }

	// Nobody listens on 4444: netstack answers the SYN with a reset.
	c, _ := s.Open(stack.TCP)
	s.Connect(c, netip.AddrPortFrom(addrB.Addr(), 4444))
	waitFor(t, "refusal", 5*time.Second, poll, func() bool { return s.Events(c)&stack.Error != 0 })
	if err := s.SockError(c); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connect to a closed netstack port: %v, want ECONNREFUSED", err)
	}
	s.Close(c)

	l, err := peer.ListenTCP(4445)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 2)
	go func() {
		for {
			gc, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- gc
		}
	}()
	connect := func() (stack.SockID, net.Conn) {
		id, _ := s.Open(stack.TCP)
		s.Connect(id, netip.AddrPortFrom(addrB.Addr(), 4445))
		waitFor(t, "connected", 5*time.Second, poll, func() bool { return s.Events(id)&stack.Writable != 0 })
		select {
		case gc := <-accepted:
			return id, gc
		case <-time.After(5 * time.Second):
			t.Fatal("netstack did not accept")
		}
		return 0, nil
	}

	// Netstack resets (it closes with our data unread, RFC 2525): we see
	// ECONNRESET.
	id, gc := connect()
	s.Send(id, []byte("never read"))
	time.Sleep(20 * time.Millisecond) // let netstack take it in
	for range 100 {
		s.Poll()
	}
	gc.Close()
	waitFor(t, "their reset", 5*time.Second, poll, func() bool { return s.Events(id)&stack.Error != 0 })
	if _, err := s.Recv(id, make([]byte, 10), false); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("recv after netstack's reset: %v, want ECONNRESET", err)
	}
	s.Close(id)

	// We reset: netstack sees a reset.
	id, gc = connect()
	s.SetOption(id, stack.Linger, 0)
	s.Close(id)
	for range 100 {
		s.Poll()
	}
	gc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := gc.Read(make([]byte, 10)); err == nil || !contains(err.Error(), "reset") {
		t.Errorf("netstack read after our abortive close: %v, want connection reset", err)
	}
	gc.Close()
}
