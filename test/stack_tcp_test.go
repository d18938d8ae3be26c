package test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// poller polls a stack from a goroutine until stopped, backing off a little
// when there is nothing to do so that the kernel on the other side gets
// the CPU.
func poller(s *stack.Stack) (stop func()) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		idle := 0
		for {
			select {
			case <-done:
				return
			default:
			}
			if s.Poll() == 0 {
				if idle++; idle > 64 {
					time.Sleep(20 * time.Microsecond)
				}
			} else {
				idle = 0
			}
		}
	}()
	return func() { close(done); <-stopped }
}

func random(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// stackConn is a connected socket of our stack with blocking helpers.
type stackConn struct {
	s  *stack.Stack
	id stack.SockID
}

func (c stackConn) writeAll(data []byte, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for sent := 0; sent < len(data); {
		n, err := c.s.Send(c.id, data[sent:])
		if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
			return fmt.Errorf("send after %d bytes: %w", sent, err)
		}
		sent += n
		if n == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("send: %d of %d bytes in %v", sent, len(data), timeout)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	return nil
}

// readFull reads exactly len(buf) bytes, as writeAll writes them.
func (c stackConn) readFull(buf []byte, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for got := 0; got < len(buf); {
		n, err := c.s.Recv(c.id, buf[got:], false)
		switch {
		case err == nil && n == 0:
			return fmt.Errorf("recv: end of stream after %d of %d bytes", got, len(buf))
		case err != nil && !errors.Is(err, stack.ErrWouldBlock):
			return fmt.Errorf("recv after %d bytes: %w", got, err)
		}
		if got += n; n == 0 {
			if time.Now().After(deadline) {
				return fmt.Errorf("recv: %d of %d bytes in %v", got, len(buf), timeout)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	return nil
}

func (c stackConn) readAll(timeout time.Duration) ([]byte, error) {
	var got []byte
	buf := make([]byte, 256<<10)
	deadline := time.Now().Add(timeout)
	for {
		n, err := c.s.Recv(c.id, buf, false)
		switch {
		case err == nil && n == 0:
			return got, nil
		case err != nil && !errors.Is(err, stack.ErrWouldBlock):
			return got, fmt.Errorf("recv after %d bytes: %w", len(got), err)
		}
		got = append(got, buf[:n]...)
		if n == 0 {
			if time.Now().After(deadline) {
				return got, fmt.Errorf("recv: %d bytes in %v, no end of stream", len(got), timeout)
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

func (c stackConn) waitEvent(ev stack.Events, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for c.s.Events(c.id)&ev == 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
	return true
}

// exchange runs both directions of a connection at once: our side sends
// ours and reads to the end; the kernel's side sends theirs and reads to
// the end. Each side shuts down writing when done.
func exchange(t *testing.T, c stackConn, k net.Conn, ours, theirs []byte) {
	t.Helper()
	var wg sync.WaitGroup
	var kernelGot []byte
	var kernelErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		go func() {
			k.Write(theirs)
			k.(*net.TCPConn).CloseWrite()
		}()
		kernelGot, kernelErr = io.ReadAll(k)
	}()
	var ourErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		if ourErr = c.writeAll(ours, 60*time.Second); ourErr == nil {
			ourErr = c.s.Shutdown(c.id, syscall.SHUT_WR)
		}
	}()
	got, err := c.readAll(60 * time.Second)
	// The kernel's side has no deadline of its own: say where we stand if
	// it waits long.
	slow := time.AfterFunc(30*time.Second, func() {
		cs := c.s.Counters()
		t.Errorf("the kernel's side is still reading after 30s: %s\n%s", &cs, c.s.DumpSocket(c.id))
		k.SetDeadline(time.Now())
	})
	wg.Wait()
	slow.Stop()
	if err != nil || ourErr != nil || kernelErr != nil {
		cs := c.s.Counters()
		t.Fatalf("our read: %v; our write: %v; kernel read: %v\n%s\n%s", err, ourErr, kernelErr, &cs, c.s.DumpSocket(c.id))
	}
	if !bytes.Equal(got, theirs) {
		t.Errorf("kernel -> ours: %d bytes, want %d, equal %v", len(got), len(theirs), bytes.Equal(got, theirs))
	}
	if !bytes.Equal(kernelGot, ours) {
		t.Errorf("ours -> kernel: %d bytes, want %d, equal %v", len(kernelGot), len(ours), bytes.Equal(kernelGot, ours))
	}
}

func bulkSize() int {
	if testing.Short() {
		return 8 << 20
	}
	return 64 << 20
}

// TestStackTCPClientToKernel: our stack in b connects to the kernel's TCP
// in a; 64 MiB each way, byte-exact; our side closes first.
func TestStackTCPClientToKernel(t *testing.T) {
	a, b := Pair(t, LinkOptions{})
	s := ourStack(t, b.Iface0())
	defer poller(s)()
	var ln net.Listener
	if err := a.Do(func() (err error) { ln, err = net.Listen("tcp", a.Iface0().Addr().String()+":5201"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if k, err := ln.Accept(); err == nil {
			accepted <- k
		}
	}()
	id, _ := s.Open(stack.TCP)
	if err := s.Connect(id, netip.AddrPortFrom(a.Iface0().Addr(), 5201)); !errors.Is(err, syscall.EINPROGRESS) {
		t.Fatal(err)
	}
	c := stackConn{s, id}
	if !c.waitEvent(stack.Writable|stack.Error, 5*time.Second) || s.SockError(id) != nil {
		t.Fatalf("connect failed: %s", s.DumpSocket(id))
	}
	k := <-accepted
	defer k.Close()
	bulkExchange(t, c, k, 1)
}

// TestStackTCPServerForKernel: the kernel in a connects to our listener in
// b; 64 MiB each way; the kernel's side closes first.
func TestStackTCPServerForKernel(t *testing.T) {
	s, id, k := kernelClient(t, 5202)
	bulkExchange(t, stackConn{s, id}, k, 3)
}

// kernelClient is our stack in host b, polled until the test ends, and a
// connection to it on port from the kernel's client in host a: our
// accepted socket and the kernel's end.
func kernelClient(t *testing.T, port uint16) (*stack.Stack, stack.SockID, net.Conn) {
	t.Helper()
	a, b := Pair(t, LinkOptions{})
	s := ourStack(t, b.Iface0())
	t.Cleanup(poller(s))
	l, _ := s.Open(stack.TCP)
	if err := s.Bind(l, netip.AddrPortFrom(netip.IPv4Unspecified(), port)); err != nil {
		t.Fatal(err)
	}
	s.Listen(l, 0)
	var k net.Conn
	if err := a.Do(func() (err error) {
		k, err = net.DialTimeout("tcp", netip.AddrPortFrom(b.Iface0().Addr(), port).String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		id, err := s.Accept(l)
		if err == nil {
			return s, id, k
		}
		if time.Now().After(deadline) {
			t.Fatal("nothing to accept")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// bulkExchange moves bulkSize bytes each way, logs the time and counters,
// and closes our side.
func bulkExchange(t *testing.T, c stackConn, k net.Conn, seed uint64) {
	t.Helper()
	n := bulkSize()
	start := time.Now()
	exchange(t, c, k, random(n, seed), random(n, seed+1))
	cs := c.s.Counters()
	t.Logf("%d MiB each way in %v (%s)", n>>20, time.Since(start), &cs)
	c.s.Close(c.id)
}

// TestStackTCPShortConnections makes 1,000 short connections in turn: our
// client to the kernel's server, then the kernel's client to our server,
// each carrying a request and a reply; meanwhile ping and a kernel-to-
// kernel connection on another port keep working.
func TestStackTCPShortConnections(t *testing.T) {
	a, b := Pair(t, LinkOptions{})
	s := ourStack(t, b.Iface0())
	defer poller(s)()
	n := 1000
	if testing.Short() {
		n = 200
	}

	// Kernel echo server in a.
	echo, err := a.KernelEcho(a.Iface0().Addr().String() + ":5300")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	// Other traffic meanwhile, to b's kernel: ping, and a TCP connection
	// (as ssh would be) streaming both ways through b's kernel echo.
	pingDone := make(chan error, 1)
	go func() {
		out, err := a.Run("ping", "-c", "20", "-i", "0.05", "-W", "2", b.Iface0().Addr().String())
		if err == nil && !bytes.Contains([]byte(out), []byte("20 received")) {
			err = fmt.Errorf("ping: %s", out)
		}
		pingDone <- err
	}()
	kernelEcho, err := b.KernelEcho(b.Iface0().Addr().String() + ":2222")
	if err != nil {
		t.Fatal(err)
	}
	defer kernelEcho.Close()
	sshDone := make(chan error, 1)
	go func() {
		sshDone <- a.Do(func() error {
			k, err := net.DialTimeout("tcp", b.Iface0().Addr().String()+":2222", 5*time.Second)
			if err != nil {
				return err
			}
			defer k.Close()
			k.SetDeadline(time.Now().Add(30 * time.Second))
			msg := random(4<<20, 5)
			go k.Write(msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(k, got); err != nil || !bytes.Equal(got, msg) {
				return fmt.Errorf("kernel-to-kernel connection beside ours: %v", err)
			}
			return nil
		})
	}()

	for i := range n {
		id, _ := s.Open(stack.TCP)
		s.Connect(id, netip.AddrPortFrom(a.Iface0().Addr(), 5300))
		c := stackConn{s, id}
		if !c.waitEvent(stack.Writable|stack.Error, 5*time.Second) {
			t.Fatalf("connection %d: not connected: %s", i, s.DumpSocket(id))
		}
		msg := []byte(fmt.Sprintf("request %d", i))
		if err := c.writeAll(msg, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		s.Shutdown(id, syscall.SHUT_WR)
		got, err := c.readAll(5 * time.Second)
		if err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("connection %d: %q, %v", i, got, err)
		}
		s.Close(id)
	}

	l, _ := s.Open(stack.TCP)
	if err := s.Bind(l, netip.MustParseAddrPort("0.0.0.0:5301")); err != nil {
		t.Fatal(err)
	}
	s.Listen(l, 0)
	serverErr := make(chan error, 1)
	defer func() {
		// The server goroutine uses the stack: let it finish (it gives up
		// within seconds) before the stack is destroyed.
		select {
		case <-serverErr:
		case <-time.After(20 * time.Second):
		}
	}()
	go func() { // our echo server
		for i := range n {
			var id stack.SockID
			deadline := time.Now().Add(5 * time.Second)
			for {
				var err error
				if id, err = s.Accept(l); err == nil {
					break
				}
				if time.Now().After(deadline) {
					serverErr <- fmt.Errorf("accept %d: nothing", i)
					return
				}
				time.Sleep(20 * time.Microsecond)
			}
			c := stackConn{s, id}
			got, err := c.readAll(5 * time.Second)
			if err == nil {
				err = c.writeAll(got, 5*time.Second)
			}
			if err != nil {
				serverErr <- fmt.Errorf("server connection %d: %w", i, err)
				return
			}
			s.Close(id)
		}
		serverErr <- nil
	}()
	for i := range n {
		err := a.Do(func() error {
			k, err := net.DialTimeout("tcp", b.Iface0().Addr().String()+":5301", 5*time.Second)
			if err != nil {
				return err
			}
			defer k.Close()
			k.SetDeadline(time.Now().Add(5 * time.Second))
			msg := []byte(fmt.Sprintf("kernel request %d", i))
			k.Write(msg)
			k.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(k)
			if err != nil || !bytes.Equal(got, msg) {
				return fmt.Errorf("got %q, %v", got, err)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("kernel connection %d: %v (%s)", i, err, ptrCounters(s))
		}
	}
	if err := <-serverErr; err != nil {
		serverErr <- nil
		t.Fatal(err)
	}
	serverErr <- nil
	if err := <-pingDone; err != nil {
		t.Error(err)
	}
	if err := <-sshDone; err != nil {
		t.Error(err)
	}
	cs := s.Counters()
	t.Logf("%d + %d connections (%s)", n, n, &cs)
}

func ptrCounters(s *stack.Stack) *stack.Counters {
	c := s.Counters()
	return &c
}

// TestStackTCPProbeLearnsDelayedAck has the kernel's client exchange
// requests and our one-segment replies back to back (so that it delays
// its ACKs: an interactive peer's ACK rides on its next request, Linux's
// "pingpong" mode), then pause after the last reply of each burst. Its
// ACK of that reply waits on its delayed-ACK timer, which starts at 40ms
// and doubles each time it fires in that mode, up to the RTO (200ms). A
// tail loss probe that allows 40ms for it goes out before the ACK, a
// spurious retransmission that the kernel reports with a D-SACK (RFC
// 2883). The stack must learn from the first and allow that peer RFC
// 8985's 200ms from then on: at most one probe in the whole exchange.
func TestStackTCPProbeLearnsDelayedAck(t *testing.T) {
	const bursts, perBurst = 20, 5
	s, id, k := kernelClient(t, 5203)
	s.SetOption(id, stack.NoDelay, 1)
	before := s.Counters()
	req, reply, buf := make([]byte, 64), make([]byte, 512), make([]byte, 512)
	delayed, slowest := 0, time.Duration(0)
	for i := range bursts * perBurst {
		req[0] = byte(i)
		k.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := k.Write(req); err != nil {
			t.Fatalf("round %d: write: %v", i, err)
		}
		if err := (stackConn{s, id}).readFull(buf[:len(req)], 5*time.Second); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if buf[0] != byte(i) {
			t.Fatalf("round %d: request %d", i, buf[0])
		}
		reply[0] = byte(i)
		if err := (stackConn{s, id}).writeAll(reply, 5*time.Second); err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if _, err := io.ReadFull(k, buf); err != nil || buf[0] != byte(i) {
			t.Fatalf("round %d: read: %v", i, err)
		}
		if i%perBurst != perBurst-1 {
			continue
		}
		// The pause: the kernel's ACK of the reply comes on its timer.
		sent := time.Now()
		for acked := false; time.Since(sent) < 300*time.Millisecond; time.Sleep(time.Millisecond) {
			if info, _ := s.TCPInfo(id); !acked && info.Unacked == 0 {
				acked = true
				if took := time.Since(sent); took > 20*time.Millisecond {
					delayed++
					slowest = max(slowest, took)
				}
			}
		}
	}
	after := s.Counters()
	d := after.Sub(before)
	t.Logf("%d bursts, %d last replies acknowledged after 20ms (the slowest after %v): tail loss probes %d (%d found needless), retransmissions %d, D-SACKs %d",
		bursts, delayed, slowest.Round(time.Millisecond), d.TCPTLPs, d.TCPTLPSpurious, d.TCPRetransmits, d.TCPDSacks)
	if delayed < bursts/2 {
		t.Fatalf("only %d of %d bursts' last replies waited for the kernel's delayed ACK: the test proves nothing", delayed, bursts)
	}
	if n := d.TCPTLPs; n > 1 {
		t.Errorf("%d tail loss probes in %d request-response bursts on a clean path: the stack did not learn that the peer delays its ACK", n, bursts)
	}
}
