package test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/nettest"
	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/sockets"
)

// ourSockets opens an accelerated stack (standalone mode) on host's
// interface, closed when the test ends.
func ourSockets(t *testing.T, h *Host, p sockets.Profile) *sockets.Stack {
	t.Helper()
	cfg, err := sockets.DefaultConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	return ourSocketsConfig(t, h, cfg)
}

// ourSocketsConfig is ourSockets with a configuration.
func ourSocketsConfig(t *testing.T, h *Host, cfg sockets.Config) *sockets.Stack {
	t.Helper()
	cfg.Interface = h.Iface0().Name
	var s *sockets.Stack
	if err := h.Do(func() (err error) { s, err = sockets.Open(cfg); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// onloaddSockets starts onloadd in host h and opens a stack of the
// balanced profile from it there (onloadd repairs its handovers); sock
// is onloadd's control socket.
func onloaddSockets(t *testing.T, h *Host) (s *sockets.Stack, sock string) {
	t.Helper()
	dir, _ := daemonDir(t)
	sock, _ = startDaemon(t, h, dir)
	cfg, err := sockets.DefaultConfig(sockets.Balanced)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Daemon, cfg.DaemonSocket = "require", sock
	return ourSocketsConfig(t, h, cfg), sock
}

// kernelPipe connects our stack on host b with the kernel of host a: our
// side dials when weDial, else the kernel does. c1 is ours.
func kernelPipe(a, b *Host, s *sockets.Stack, weDial bool) (c1, c2 net.Conn, stop func(), err error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	if weDial {
		var ln net.Listener
		if err := a.Do(func() (err error) { ln, err = net.Listen("tcp", a.Iface0().Addr().String()+":0"); return }); err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		go func() { c, err := ln.Accept(); ch <- res{c, err} }()
		d := sockets.Dialer{Stack: s}
		err = b.Do(func() (err error) { c1, err = d.Dial("tcp", ln.Addr().String()); return })
	} else {
		ln, err := ourListener(b, s)
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		// In b's namespace: on a stack from onloadd, an accepted
		// connection gets a kernel socket of its own there.
		go func() {
			var c net.Conn
			err := b.Do(func() (err error) { c, err = ln.Accept(); return })
			ch <- res{c, err}
		}()
		var kc net.Conn
		if err := a.Do(func() (err error) { kc, err = net.Dial("tcp", ln.Addr().String()); return }); err != nil {
			return nil, nil, nil, err
		}
		r := <-ch
		if r.err != nil {
			kc.Close()
			return nil, nil, nil, r.err
		}
		if _, ok := r.c.(*sockets.TCPConn); !ok {
			kc.Close()
			r.c.Close()
			return nil, nil, nil, errNotOurs
		}
		return r.c, kc, func() { r.c.Close(); kc.Close() }, nil
	}
	if err != nil {
		return nil, nil, nil, err
	}
	r := <-ch
	if r.err != nil {
		c1.Close()
		return nil, nil, nil, r.err
	}
	if _, ok := c1.(*sockets.TCPConn); !ok {
		c1.Close()
		r.c.Close()
		return nil, nil, nil, errNotOurs
	}
	return c1, r.c, func() { c1.Close(); r.c.Close() }, nil
}

// ourListener listens on stack s, in host b, on its address and a port
// the stack picks.
func ourListener(b *Host, s *sockets.Stack) (net.Listener, error) {
	lc := sockets.ListenConfig{Stack: s}
	var ln net.Listener
	err := b.Do(func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", b.Iface0().Addr().String()+":0")
		return
	})
	return ln, err
}

var errNotOurs = errorString("the connection is not accelerated: it fell back to the kernel")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestNettestKernel runs x/net's net.Conn conformance suite on our TCP
// against the Linux kernel's, over veth, with our side dialling and
// accepting.
func TestNettestKernel(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	s := ourSockets(t, b, sockets.Balanced)
	for _, weDial := range []bool{true, false} {
		name := "we-accept"
		if weDial {
			name = "we-dial"
		}
		t.Run(name, func(t *testing.T) {
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return kernelPipe(a, b, s, weDial) })
		})
	}
}

// TestOpenQueues: a standalone stack serves an interface that receives on
// one queue, counted as the driver uses them now, and refuses one that
// uses more, saying what to do.
func TestOpenQueues(t *testing.T) {
	RequireRoot(t)
	a, _ := Pair(t, LinkOptions{Queues: 2})
	cfg, err := sockets.DefaultConfig(sockets.Balanced)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Interface = a.Iface0().Name
	open := func() error {
		s, err := sockets.Open(cfg)
		if err == nil {
			s.Close()
		}
		return err
	}
	err = a.Do(open)
	if err == nil || !strings.Contains(err.Error(), "has 2 receive queues") || !strings.Contains(err.Error(), "ethtool -L") {
		t.Fatalf("open on two queues: %v", err)
	}
	if out, err := a.Run("ethtool", "-L", a.Iface0().Name, "rx", "1", "tx", "1"); err != nil {
		Missing(t, "cannot set veth channels here (ethtool -L): %v %s", err, out)
	}
	if err := a.Do(open); err != nil {
		t.Fatalf("open after ethtool -L to one queue: %v", err)
	}
}

// TestDefaultStackLifetime: the process's default stack is made by the
// first accelerated call (the interface gets the steering program) and
// closed once its last socket is (the program goes, the queue is free),
// and made again by the next call.
func TestDefaultStackLifetime(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	var ln net.Listener
	if err := a.Do(func() (err error) { ln, err = net.Listen("tcp", a.Iface0().Addr().String()+":0"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			k, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(k, k); k.Close() }()
		}
	}()
	t.Setenv("ONLOAD_INTERFACE", b.Iface0().Name)
	xdpOn := func() bool {
		out, err := b.Run("ip", "link", "show", "dev", b.Iface0().Name)
		if err != nil {
			t.Fatalf("ip link show: %v %s", err, out)
		}
		return strings.Contains(string(out), " xdp")
	}
	for round := range 2 {
		if xdpOn() {
			t.Fatalf("round %d: an XDP program is on %s before any socket", round, b.Iface0().Name)
		}
		var c net.Conn
		if err := b.Do(func() (err error) { c, err = sockets.Dial("tcp", ln.Addr().String()); return }); err != nil {
			t.Fatal(err)
		}
		if _, ok := c.(*sockets.TCPConn); !ok {
			c.Close()
			t.Fatalf("round %d: the dial fell back to the kernel (%T)", round, c)
		}
		if !xdpOn() {
			t.Fatalf("round %d: the default stack is up but no XDP program is on %s", round, b.Iface0().Name)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("ping"))
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
			t.Fatalf("round %d: echo %q, %v", round, buf, err)
		}
		c.Close()
		deadline := time.Now().Add(5 * time.Second)
		for xdpOn() {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the default stack still holds %s 5s after its last socket closed", round, b.Iface0().Name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestDialPortInTimeWait: a connection we closed first stays in TIME-WAIT
// in the stack, but its kernel reservation went with it, so the kernel
// may pick its port for the next dial's reservation: with one ephemeral
// port in the host, it must. The next dial to the same server takes the
// four-tuple over from TIME-WAIT (it once failed with EADDRINUSE, seen
// under the shim in CI).
func TestDialPortInTimeWait(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	narrowEphemeralPorts(t, b, 40000, 40000)
	s := ourSockets(t, b, sockets.Balanced)
	ln, err := a.KernelEcho(a.Iface0().Addr().String() + ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	d := sockets.Dialer{Stack: s}
	timeWait := func() int { return socketsIn(s, "TIME-WAIT", 40000) }
	for i := range 3 {
		var c net.Conn
		if err := b.Do(func() (err error) { c, err = d.Dial("tcp", ln.Addr().String()); return }); err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		if _, ok := c.(*sockets.TCPConn); !ok {
			c.Close()
			t.Fatalf("dial %d: %v", i, errNotOurs)
		}
		if port := c.LocalAddr().(*net.TCPAddr).Port; port != 40000 {
			c.Close()
			t.Fatalf("dial %d: from port %d, want the host's only ephemeral port, 40000", i, port)
		}
		msg := fmt.Sprintf("hello %d", i)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, len(msg))
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatalf("dial %d: write: %v", i, err)
		}
		if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
			t.Fatalf("dial %d: echo %q, %v", i, got, err)
		}
		c.Close()
		deadline := time.Now().Add(5 * time.Second)
		for timeWait() != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("dial %d: the closed connection is not in TIME-WAIT in the stack:\n%s", i, s.Dump())
			}
			time.Sleep(time.Millisecond)
		}
	}
	if n := s.Engine().Counters().TCPTimeWaitReuse; n != 2 {
		t.Fatalf("TIME-WAIT connections taken over: %d, want 2", n)
	}
}

// narrowEphemeralPorts gives host h the ephemeral ports lo to hi only, or
// skips the test.
func narrowEphemeralPorts(t *testing.T, h *Host, lo, hi int) {
	t.Helper()
	if out, err := h.Run("sysctl", "-qw", fmt.Sprintf("net.ipv4.ip_local_port_range=%d %d", lo, hi)); err != nil {
		Missing(t, "cannot narrow the host's ephemeral ports (sysctl): %v %s", err, out)
	}
}

// socketsIn counts s's sockets in TCP state state, on local port port
// (0: any).
func socketsIn(s *sockets.Stack, state string, port uint16) int {
	n := 0
	for _, r := range s.Engine().Sockets() {
		if r.State == state && (port == 0 || r.Local.Port() == port) {
			n++
		}
	}
	return n
}

// TestDialPortInFinWait: a connection we closed whose peer has not closed
// stays in FIN-WAIT-2 in the stack, but its kernel reservation went with
// it, so the kernel may pick its port for the next dial's reservation,
// and a connection from that port to the same server cannot be made (it
// failed with EADDRNOTAVAIL: redis-benchmark -k 0 under the shim, after a
// few hundred connections). With ten ephemeral ports in the host and a
// server that keeps every connection open, nine dials must each find a
// port none of the closed ones has; the kernel's pick alone collides in
// all but 4 runs in 1000.
func TestDialPortInFinWait(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	const lo, ports = 40000, 10
	narrowEphemeralPorts(t, b, lo, lo+ports-1)
	s := ourSockets(t, b, sockets.Balanced)
	var ln net.Listener
	if err := a.Do(func() (err error) { ln, err = net.Listen("tcp", a.Iface0().Addr().String()+":0"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	held := make(chan net.Conn, ports)
	go func() { // the server keeps each connection open, unread
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	defer func() {
		for len(held) > 0 {
			(<-held).Close()
		}
	}()
	d := sockets.Dialer{Stack: s}
	finWait := func() int { return socketsIn(s, "FIN-WAIT-2", 0) }
	used := map[int]bool{}
	for i := range ports - 1 {
		var c net.Conn
		if err := b.Do(func() (err error) { c, err = d.Dial("tcp", ln.Addr().String()); return }); err != nil {
			t.Fatalf("dial %d, with %d closed connections in FIN-WAIT-2 on ports %v: %v", i, finWait(), used, err)
		}
		if _, ok := c.(*sockets.TCPConn); !ok {
			c.Close()
			t.Fatalf("dial %d: %v", i, errNotOurs)
		}
		port := c.LocalAddr().(*net.TCPAddr).Port
		if port < lo || port >= lo+ports || used[port] {
			c.Close()
			t.Fatalf("dial %d: from port %d, want one of the host's %d-%d that no closed connection has (%v)", i, port, lo, lo+ports-1, used)
		}
		used[port] = true
		c.Close()
		deadline := time.Now().Add(5 * time.Second)
		for finWait() != i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("dial %d: %d closed connections in FIN-WAIT-2 in the stack, want %d:\n%s", i, finWait(), i+1, s.Dump())
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// TestUDPKernelHalfWakes: a reader blocked on an accelerated UDP socket
// wakes for every datagram that arrives through the socket's kernel half
// (a sender on the same host, through loopback), one datagram at a time,
// so that nothing but that datagram can wake it. A wake that came
// between the reader's check of the kernel's queue and its sleep was
// lost, and the reader slept until the stack's next datagram.
func TestUDPKernelHalfWakes(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	s := ourSockets(t, b, sockets.Balanced)
	var pc net.PacketConn
	if err := b.Do(func() (err error) {
		pc, err = (&sockets.ListenConfig{Stack: s}).ListenPacket(context.Background(), "udp", b.Iface0().Addr().String()+":0")
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if _, ok := pc.(*sockets.UDPConn); !ok {
		t.Fatalf("the socket is %T, not accelerated", pc)
	}
	got := make(chan string, 1)
	go func() {
		defer close(got)
		buf := make([]byte, 512)
		for {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got <- string(buf[:n])
		}
	}()
	send := func(h *Host, msg string) {
		t.Helper()
		var c net.Conn
		if err := h.Do(func() (err error) { c, err = net.Dial("udp", pc.LocalAddr().String()); return }); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, msg); err != nil {
			t.Fatal(err)
		}
		select {
		case m := <-got:
			if m != msg {
				t.Fatalf("read %q, want %q", m, msg)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%q not read within 2 s", msg)
		}
	}
	// The stack's half, from the other host; then the kernel's, from this
	// one.
	send(a, "through the stack")
	for i := range 300 {
		send(b, fmt.Sprintf("through the kernel %d", i))
	}
}

// TestSocketsFDsCloseOnExec: every descriptor a stack of the Go library
// opens is close-on-exec, so a program that execs another gives it none
// of them. The netlink library's subscriptions (the stack's watch of the
// kernel's links, neighbours and routes) and the wake events' ring
// buffer were not.
func TestSocketsFDsCloseOnExec(t *testing.T) {
	RequireRoot(t)
	a, _ := Pair(t, LinkOptions{})
	open := func() map[string]bool {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, e := range ents {
			m[e.Name()] = true
		}
		return m
	}
	before := open()
	ourSockets(t, a, sockets.Balanced)
	for fd := range open() {
		if before[fd] {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + fd)
		if err != nil {
			continue // closed meanwhile (ReadDir's own)
		}
		var flags int64
		for _, l := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(l, "flags:"); ok {
				flags, _ = strconv.ParseInt(strings.TrimSpace(v), 8, 64)
			}
		}
		if flags&unix.O_CLOEXEC == 0 {
			target, _ := os.Readlink("/proc/self/fd/" + fd)
			t.Errorf("fd %s (%s) is not close-on-exec (flags %o)", fd, target, flags)
		}
	}
}
