package sockets_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/vnic"
)

// The public API's behaviours, each against the net package's: our stack
// at both ends of an in-memory wire (the kernel as peer is in ../test).

func TestUDPReadFromWriteTo(t *testing.T) {
	a, b := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	lb := sockets.ListenConfig{Stack: b}
	pb, err := lb.ListenPacket(context.Background(), "udp", addrB.Addr().String()+":7000")
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Close()
	la := sockets.ListenConfig{Stack: a}
	pa, err := la.ListenPacket(context.Background(), "udp", addrA.Addr().String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer pa.Close()
	if _, ok := pa.(*sockets.UDPConn); !ok {
		t.Fatalf("ListenPacket on the stack's address gave %T, not *sockets.UDPConn", pa)
	}
	to := &net.UDPAddr{IP: addrB.Addr().AsSlice(), Port: 7000}
	for i, msg := range [][]byte{[]byte("one"), bytes.Repeat([]byte("x"), 1400), {}} {
		if n, err := pa.WriteTo(msg, to); err != nil || n != len(msg) {
			t.Fatalf("datagram %d: WriteTo: %d, %v", i, n, err)
		}
		pb.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2048)
		n, from, err := pb.ReadFrom(buf)
		if err != nil || !bytes.Equal(buf[:n], msg) {
			t.Fatalf("datagram %d: ReadFrom: %q, %v", i, buf[:n], err)
		}
		if from.String() != pa.LocalAddr().String() {
			t.Errorf("datagram %d came from %v, want %v", i, from, pa.LocalAddr())
		}
		// And the answer back to whoever sent it.
		if _, err := pb.WriteTo(buf[:n], from); err != nil {
			t.Fatal(err)
		}
		pa.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, _, err := pa.ReadFrom(buf); err != nil || !bytes.Equal(buf[:n], msg) {
			t.Fatalf("datagram %d back: %q, %v", i, buf[:n], err)
		}
	}
	// A short buffer truncates the datagram, as net does.
	pa.WriteTo([]byte("truncated"), to)
	pb.SetReadDeadline(time.Now().Add(5 * time.Second))
	small := make([]byte, 4)
	if n, _, err := pb.ReadFrom(small); n != 4 || string(small) != "trun" {
		t.Errorf("ReadFrom into 4 bytes: %d %q %v", n, small[:n], err)
	}
	// A deadline in the past fails at once with os.ErrDeadlineExceeded.
	pb.SetReadDeadline(time.Now().Add(-time.Second))
	if _, _, err := pb.ReadFrom(small); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("ReadFrom past its deadline: %v, want os.ErrDeadlineExceeded", err)
	}
}

// TestFallbackToNet: what the stack does not carry goes to the kernel
// with the same arguments, and works.
func TestFallbackToNet(t *testing.T) {
	a, _ := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	d := sockets.Dialer{Stack: a}
	lc := sockets.ListenConfig{Stack: a}
	sock := filepath.Join(t.TempDir(), "s")
	for _, c := range []struct{ name, network, address string }{
		{"loopback", "tcp", "127.0.0.1:0"},
		{"the stack's own address from the kernel side (loopback)", "tcp4", "127.0.0.2:0"},
		{"IPv6", "tcp6", "[::1]:0"},
		{"Unix", "unix", sock},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := lc.Listen(context.Background(), c.network, c.address)
			if err != nil {
				if c.network == "tcp6" {
					t.Skipf("no IPv6 loopback here: %v", err)
				}
				t.Fatal(err)
			}
			defer ln.Close()
			if _, ours := ln.(*sockets.TCPListener); ours {
				t.Fatalf("%s %s was accelerated", c.network, c.address)
			}
			go func() {
				if k, err := ln.Accept(); err == nil {
					io.Copy(k, k)
					k.Close()
				}
			}()
			conn, err := d.Dial(ln.Addr().Network(), ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, ours := conn.(*sockets.TCPConn); ours {
				t.Fatalf("dial %s %s was accelerated", ln.Addr().Network(), ln.Addr())
			}
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			conn.Write([]byte("through the kernel"))
			buf := make([]byte, 18)
			if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "through the kernel" {
				t.Fatalf("echo: %q, %v", buf, err)
			}
		})
	}
}

func TestConnRefused(t *testing.T) {
	a, _ := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	d := sockets.Dialer{Stack: a, Timeout: 5 * time.Second}
	_, err := d.Dial("tcp", addrB.Addr().String()+":9") // nobody listens
	var op *net.OpError
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("dial to a closed port: %v (%T), want a dial *net.OpError wrapping ECONNREFUSED", err, err)
	}
}

func TestAddrInUse(t *testing.T) {
	_, b := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	lc := sockets.ListenConfig{Stack: b}
	ln, err := lc.Listen(context.Background(), "tcp", addrB.Addr().String()+":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = lc.Listen(context.Background(), "tcp", addrB.Addr().String()+":8080")
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("second listen on the port: %v, want EADDRINUSE", err)
	}
	if !strings.Contains(err.Error(), "bind: address already in use") {
		t.Errorf("second listen on the port: %q, want the failing call named as net names it (bind)", err)
	}
	// Closed, the port is free again.
	ln.Close()
	ln2, err := lc.Listen(context.Background(), "tcp", addrB.Addr().String()+":8080")
	if err != nil {
		t.Fatalf("listen after the first listener closed: %v", err)
	}
	ln2.Close()
}

// TestLingerZeroResets: SetLinger(0) makes Close reset the connection,
// and the peer's next read fails with ECONNRESET instead of io.EOF.
func TestLingerZeroResets(t *testing.T) {
	a, b := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	c1, c2 := connPair(t, a, b)
	before := a.Engine().Counters().TxTCPResets
	if err := c1.(*sockets.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	c1.Close()
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c2.Read(make([]byte, 10))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("peer's read after a linger-0 close: %v, want ECONNRESET", err)
	}
	if a.Engine().Counters().TxTCPResets == before {
		t.Error("no reset counted")
	}
}

// TestKeepAlive: an idle connection with keepalive on probes its peer
// (who answers), and one whose peer has gone silent is closed with
// ETIMEDOUT after the probes.
func TestKeepAlive(t *testing.T) {
	a, b, _, nb := memStacksNICs(t)
	c1, _ := connPair(t, a, b)
	tc := c1.(*sockets.TCPConn)
	if err := tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: 50 * time.Millisecond, Interval: 50 * time.Millisecond, Count: 3}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	info, _ := tc.Info()
	if info.State != "ESTABLISHED" {
		t.Fatalf("an answered keepalive ended the connection: %s", info.State)
	}
	// The peer goes silent: everything from b is lost.
	if err := nb.Impair(vnic.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := tc.Read(make([]byte, 10))
	if !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("read on a connection whose peer stopped answering keepalives: %v, want ETIMEDOUT", err)
	}
}

// TestDialContextCancel: cancelling the context of a dial that cannot
// complete (every SYN lost) ends it at once with the context's error.
func TestDialContextCancel(t *testing.T) {
	a, b, na, _ := memStacksNICs(t)
	lc := sockets.ListenConfig{Stack: b}
	ln, err := lc.Listen(context.Background(), "tcp", addrB.Addr().String()+":80")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := na.Impair(vnic.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	d := sockets.Dialer{Stack: a}
	_, err = d.DialContext(ctx, "tcp", ln.Addr().String())
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("the dial returned %v after its context was cancelled", el-100*time.Millisecond)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled dial: %v, want context.Canceled", err)
	}
	// A deadline the same way, with os.ErrDeadlineExceeded's meaning.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	_, err = d.DialContext(ctx2, "tcp", ln.Addr().String())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial past its context's deadline: %v, want context.DeadlineExceeded", err)
	}
}

// TestLoopbackInStack: a connection from the stack to a listener of its
// own is carried by the stack (both ends accelerated), not by the kernel.
func TestLoopbackInStack(t *testing.T) {
	a, _ := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	lc := sockets.ListenConfig{Stack: a}
	ln, err := lc.Listen(context.Background(), "tcp", addrA.Addr().String()+":8081")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
		io.Copy(c, c)
		c.Close()
	}()
	d := sockets.Dialer{Stack: a, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addrA.Addr().String()+":8081")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ours := c.(*sockets.TCPConn); !ours {
		t.Fatalf("dial to the stack's own listener: %T, want *sockets.TCPConn", c)
	}
	if s := <-accepted; s == nil {
		t.Fatal("accept failed")
	} else if _, ours := s.(*sockets.TCPConn); !ours {
		t.Fatalf("the listener accepted %T, want *sockets.TCPConn", s)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := bytes.Repeat([]byte("within the stack "), 10000)
	go c.Write(msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("echo of %d bytes: equal %v, %v", len(msg), bytes.Equal(got, msg), err)
	}
}

// TestStackExit closes, as a process's exit does (Stack.Exit, which the
// LD_PRELOAD shim calls at exit and Finish on the default stack), a
// stack of the process's own while one connection still has data the
// peer has not acknowledged (its ACKs are lost) and another is open:
// Exit must wait for the first's data and FIN, return once the peer has
// them, and close the second, whose peer then reads the end. With the
// ACKs lost for longer than its bound, it gives up and says how many
// were left.
func TestStackExit(t *testing.T) {
	a, b, _, nb := memStacksNICs(t)
	c1, c2 := connPair(t, a, b)
	_, c4 := connPair(t, a, b) // a's end is left open: Exit closes it
	if err := nb.Impair(vnic.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("last words "), 6000)
	if n, err := c1.Write(data); n != len(data) || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	if err := c1.Close(); err != nil {
		t.Fatal(err)
	}
	if n := a.Engine().Undelivered(); n != 1 {
		t.Fatalf("%d connections undelivered after the close with the ACKs lost; want 1", n)
	}
	done := make(chan int, 1)
	go func() { done <- a.Exit(5 * time.Second) }()
	select {
	case n := <-done:
		t.Fatalf("Exit returned %d while the peer's ACKs were lost", n)
	case <-time.After(100 * time.Millisecond):
	}
	if err := nb.Impair(vnic.Impairment{}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-done:
		if n != 0 {
			t.Fatalf("Exit returned %d connections unfinished; want 0", n)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("Exit did not return after the peer acknowledged")
	}
	if n := a.Engine().Undelivered(); n != 0 {
		t.Fatalf("%d connections undelivered after Exit", n)
	}
	c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(c2); !bytes.Equal(got, data) || err != nil {
		t.Fatalf("the peer read %d bytes (%v); want the %d written, then the end", len(got), err, len(data))
	}
	c4.SetReadDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(c4); len(got) != 0 || err != nil {
		t.Fatalf("the peer of the connection left open read %d bytes, %v; want the end (Exit closes it)", len(got), err)
	}

	// A peer that never acknowledges: Exit gives up at its bound.
	c5, _ := connPair(t, a, b)
	if err := nb.Impair(vnic.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	if n, err := c5.Write(data); n != len(data) || err != nil {
		t.Fatalf("write: %d %v", n, err)
	}
	start := time.Now()
	if n := a.Exit(100 * time.Millisecond); n != 1 {
		t.Fatalf("Exit with the peer silent returned %d; want 1 connection unfinished", n)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Exit with a bound of 100ms returned after %v", d)
	}
	nb.Impair(vnic.Impairment{})
}

// TestReadAckRidesOnAnswer: a server that reads a request and answers at
// once sends one frame, its answer carrying the ACK its read owed
// (TCPConn.Read holds it: stack.RecvCorked), where it sent a pure ACK
// of the request first: a Go server of a connection a request sent four
// frames where three do. The first request of each of 16 new
// connections (a later one's ACK waits for the answer anyway): a poll
// of the stack between the read and the answer (its Sleeper's, on a
// loaded machine) sends the ACK first, as it should, so a quarter is
// asked for; with the ACK sent at the read, none. A read left
// unanswered still has its ACK sent, by the reader's next wait (or the
// Sleeper), long before the peer's retransmission timer.
func TestReadAckRidesOnAnswer(t *testing.T) {
	a, b := memStacks(t, vnic.MemConfig{}, sockets.Config{})
	buf := make([]byte, 64)
	const conns = 16
	carried := 0
	var c1, c2 net.Conn
	for range conns {
		c1, c2 = connPair(t, a, b)
		c1.SetDeadline(time.Now().Add(5 * time.Second))
		c2.SetDeadline(time.Now().Add(5 * time.Second))
		before := b.Engine().Counters().TxFrames
		if _, err := c1.Write([]byte("GET /")); err != nil {
			t.Fatal(err)
		}
		if n, err := c2.Read(buf); n != 5 || err != nil {
			t.Fatalf("the server's read: %d, %v; want the request's 5 bytes", n, err)
		}
		if _, err := c2.Write([]byte("200 OK")); err != nil {
			t.Fatal(err)
		}
		if n, err := io.ReadFull(c1, buf[:6]); n != 6 || err != nil {
			t.Fatalf("the client's read: %d, %v", n, err)
		}
		if b.Engine().Counters().TxFrames-before == 1 {
			carried++
		}
	}
	t.Logf("%d of %d answers carried the ACK of their request", carried, conns)
	if carried < conns/4 {
		t.Errorf("%d of %d answers carried the ACK of their request (the rest sent a pure ACK first), want at least %d", carried, conns, conns/4)
	}

	// Unanswered: the server reads, then waits for more.
	if _, err := c1.Write([]byte("more")); err != nil {
		t.Fatal(err)
	}
	if n, err := c2.Read(buf); n != 4 || err != nil {
		t.Fatalf("the server's read: %d, %v", n, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c2.Read(buf)
		done <- err
	}()
	acked := false
	for end := time.Now().Add(time.Second); !acked && time.Now().Before(end); time.Sleep(time.Millisecond) {
		info, _ := c1.(*sockets.TCPConn).Info()
		acked = info.Unacked == 0
	}
	if !acked {
		t.Error("a read left unanswered: its ACK not sent within a second")
	}
	c1.Write([]byte("end"))
	if err := <-done; err != nil {
		t.Errorf("the server's second read: %v", err)
	}
}
