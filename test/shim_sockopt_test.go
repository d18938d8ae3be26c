package test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/internal/pkt"
)

// wireSeg is one IPv4 TCP segment a sniffer saw: its ports, flags, IP
// TOS and TTL, and payload.
type wireSeg struct {
	src, dst uint16
	flags    uint8
	tos, ttl uint8
	payload  string
}

// sniffIn records the TCP segments host h receives from addr until the
// returned stop is called, through an AF_PACKET socket on h's first
// interface. Frames that do not parse (a bad checksum) are recorded
// with the flags 0xff, so that a test sees them.
func sniffIn(t *testing.T, h *Host, addr netip.Addr) (stop func() []wireSeg) {
	t.Helper()
	var fd int
	ifc := h.Iface0()
	err := h.Do(func() (err error) {
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return err
		}
		if err = unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifc.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	})
	if err != nil {
		t.Fatalf("AF_PACKET socket in %s: %v", h.Name, err)
	}
	var (
		mu   sync.Mutex
		segs []wireSeg
		done = make(chan struct{})
		quit = make(chan struct{})
	)
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		deadline := time.Now().Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			select {
			case <-quit:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue // the timeout: look at quit again
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			f, err := pkt.Parse(buf[:n])
			if err == nil && (f.Proto != 6 || f.Src.Addr() != addr) {
				continue
			}
			s := wireSeg{flags: 0xff}
			if err == nil {
				s = wireSeg{src: f.Src.Port(), dst: f.Dst.Port(), flags: uint8(f.TCPFlags), payload: string(f.Payload)}
			}
			s.tos, s.ttl = buf[ethHeaderLen+1], buf[ethHeaderLen+8]
			mu.Lock()
			segs = append(segs, s)
			mu.Unlock()
		}
	}()
	var once sync.Once
	stop = func() []wireSeg {
		once.Do(func() { close(quit); <-done; unix.Close(fd) })
		mu.Lock()
		defer mu.Unlock()
		return append([]wireSeg(nil), segs...)
	}
	t.Cleanup(func() { stop() })
	return stop
}

const ethHeaderLen = 14

// htons is v in network order, as AF_PACKET's protocol wants it.
func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// askOnce connects from host h to addr, sends ask and reads the
// answer, which must be want, within 5 s.
func askOnce(h *Host, addr netip.AddrPort, ask, want string) error {
	return askConnected(h, addr, ask, want, nil)
}

// askConnected is askOnce, closing connected (unless nil) once its
// connection is made, before it asks.
func askConnected(h *Host, addr netip.AddrPort, ask, want string, connected chan<- struct{}) error {
	return h.Do(func() error {
		c, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
		if err != nil {
			return err
		}
		if connected != nil {
			close(connected)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte(ask)); err != nil {
			return err
		}
		got := make([]byte, len(want))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
			return fmt.Errorf("the connection to %s answered %q, %v; want %q", addr, got, err, want)
		}
		return nil
	})
}

// TestShimIPClass: IP_TOS and IP_TTL that a program sets on its
// connections are carried by their segments as on the kernel (shim/test/
// tos.c, its segments read at the peer): set before connect, from the
// SYN on; set after connect, from the next segment on (IP_TOS given as
// a byte); set on a listener before listen, by its connection from the
// SYN-ACK on. getsockopt reads them back. Before, the stack's segments
// carried TOS 0 and TTL 64 whatever the program set (a trading gateway's
// DSCP marking was lost).
func TestShimIPClass(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "tos")
	a, b, ln := echoHosts(t)
	echoPort := uint16(ln.Addr().(*net.TCPAddr).Port)
	const lport = 7330
	for _, shim := range []bool{false, true} {
		stop := sniffIn(t, b, a.Iface0().Addr())
		name, stdin, next, log := startSide(t, a, shim, prog, b.Iface0().Addr().String(), strconv.Itoa(int(echoPort)), strconv.Itoa(lport))
		var lines []string
		for range 6 {
			lines = append(lines, next("a line"))
		}
		if lines[5] != "listening" {
			t.Fatalf("%s: tos printed %q:\n%s", name, lines, log.String())
		}
		if err := askOnce(b, netip.AddrPortFrom(a.Iface0().Addr(), lport), "hello\n", "served\n"); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, log.String())
		}
		lines = append(lines, next("accepted"), next("done"))
		stdin.Close()
		if shim {
			requireAccelerated(t, log.String(), "connecting")
			requireAccelerated(t, log.String(), "listening")
		}
		want := "first: echo before connect\nset before connect: tos 0xb8 ttl 33\nsecond: echo defaults\nsecond: echo set after connect\n" +
			"set after connect: tos 0x28 ttl 99\nlistening\naccepted: tos 0x48 ttl 77\ndone"
		if got := strings.Join(lines, "\n"); got != want {
			t.Errorf("%s: tos printed\n%s\nwant\n%s", name, got, want)
		}
		time.Sleep(200 * time.Millisecond) // the last FINs and ACKs
		segs := stop()
		for _, p := range ipClassFaults(segs, echoPort, lport) {
			t.Errorf("%s: %s", name, p)
		}
	}
}

// ipClassFaults checks what tos.c's connections sent: each segment's TOS
// and TTL against what the program had set when it went.
func ipClassFaults(segs []wireSeg, echoPort, lport uint16) []string {
	var faults []string
	conns := map[uint16][]wireSeg{}
	var order []uint16
	for _, s := range segs {
		if s.flags == 0xff {
			faults = append(faults, fmt.Sprintf("a frame that does not parse (tos %#x ttl %d)", s.tos, s.ttl))
			continue
		}
		if s.dst != echoPort && s.src != lport {
			continue
		}
		if _, ok := conns[s.src]; !ok {
			order = append(order, s.src)
		}
		conns[s.src] = append(conns[s.src], s)
	}
	seen := map[string]bool{}
	for _, port := range order {
		c := conns[port]
		var kind string
		for _, s := range c {
			switch {
			case port == lport:
				kind = "the listener's connection"
			case strings.Contains(s.payload, "before connect"):
				kind = "set before connect"
			case strings.Contains(s.payload, "defaults"):
				kind = "set after connect"
			}
		}
		if kind == "" {
			faults = append(faults, fmt.Sprintf("a connection from port %d that wrote none of tos.c's lines", port))
			continue
		}
		seen[kind] = true
		if c[0].flags&uint8(header.TCPFlagSyn) == 0 {
			faults = append(faults, fmt.Sprintf("%s: its first segment seen has flags %#x, not a SYN", kind, c[0].flags))
		}
		tos, ttl := uint8(0xb8), uint8(33)
		if kind == "the listener's connection" {
			tos, ttl = 0x48, 77
		} else if kind == "set after connect" {
			tos, ttl = 0, 64
		}
		for i, s := range c {
			if kind == "set after connect" && strings.Contains(s.payload, "set after connect") {
				tos, ttl = 0x28, 99
			}
			if s.tos != tos || s.ttl != ttl {
				faults = append(faults, fmt.Sprintf("%s: segment %d of %d (flags %#x, %d bytes) has tos %#x ttl %d, want tos %#x ttl %d",
					kind, i+1, len(c), s.flags, len(s.payload), s.tos, s.ttl, tos, ttl))
			}
		}
	}
	for _, k := range []string{"set before connect", "set after connect", "the listener's connection"} {
		if !seen[k] {
			faults = append(faults, k+": no segment seen")
		}
	}
	return faults
}

// TestShimBindToDevice: a socket bound to another interface than the
// stack's (SO_BINDTODEVICE) is the kernel's, as the program asked: a
// connect bound to lo and a listener bound to lo behave as on the
// kernel (shim/test/bindtodev.c; the peer's connection to that listener
// is refused), and a socket bound to the stack's own interface is
// accelerated. Before, the shim accelerated both, and the connect bound
// to lo reached the peer through the stack's interface.
func TestShimBindToDevice(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "bindtodev")
	a, b, ln := echoHosts(t)
	const lport = 7340
	run := func(shim bool) (string, string) {
		name, stdin, next, log := startSide(t, a, shim, prog, b.Iface0().Addr().String(),
			strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), strconv.Itoa(lport), "lo", a.Iface0().Name)
		defer stdin.Close()
		lines := []string{next("the connect bound to lo"), next("the echo"), next("listening")}
		var dial string
		err := b.Do(func() error {
			c, err := net.DialTimeout("tcp", netip.AddrPortFrom(a.Iface0().Addr(), lport).String(), time.Second)
			switch {
			case err == nil:
				c.Close()
				dial = "the peer's connection to the listener bound to lo: connected"
			case errors.Is(err, syscall.ECONNREFUSED):
				dial = "the peer's connection to the listener bound to lo: refused"
			default:
				dial = "the peer's connection to the listener bound to lo: " + err.Error()
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(stdin, "go\n")
		lines = append(lines, dial, next("whether a connection came"))
		return strings.Join(lines, "\n"), name + "'s log:\n" + log.String()
	}
	kernel, _ := run(false)
	want := "bound elsewhere: connect Operation now in progress; in 300 ms nothing, no error\nbound to ours: echo a line\nlistening\n" +
		"the peer's connection to the listener bound to lo: refused\na connection came: no"
	if kernel != want {
		t.Fatalf("on the kernel:\n%s\nwant\n%s", kernel, want)
	}
	shim, log := run(true)
	if shim != kernel {
		t.Errorf("under the shim:\n%s\non the kernel:\n%s\n%s", shim, kernel, log)
	}
	requireAccelerated(t, log, "connecting")
	if !strings.Contains(log, "(SO_BINDTODEVICE), not the stack's: the kernel's") {
		t.Errorf("the shim's log does not say why the sockets bound to lo are the kernel's:\n%s", log)
	}
}

// TestShimIOURing: a program with an io_uring instance that drives
// sockets made through the C library through it (shim/test/uring.c: a
// send and a receive on a connection, an accept, receive and send on a
// listener the program also polled) works as on the kernel: its sockets
// stay in the kernel, and the log says why. Before, the ring's
// operations reached the accelerated sockets' kernel halves: the send
// failed with EPIPE and the accept waited for ever.
func TestShimIOURing(t *testing.T) {
	const want = "send through the ring: 5\nrecv through the ring: 5\nlistening\naccept through the ring: an fd\nrecv through the ring: 4\nsend through the ring: 4"
	log := uringRun(t, "", want)
	if !strings.Contains(log, "is an io_uring instance, whose operations the interposer cannot see") {
		t.Errorf("the shim's log does not say why the sockets are the kernel's:\n%s", log)
	}
}

// TestShimIOURingLate: the same program making its ring only after its
// connection has echoed and its listener has been polled, both
// accelerated by then, and then connecting again: each works through the
// ring as on the kernel. The ring's call (io_uring_queue_init) hands the
// connection over to the kernel and gives the listener's port to its
// kernel socket, and the connection made after stays the kernel's.
// Before, the ring's send on the accelerated connection failed with
// EPIPE, and its accept waited for ever.
func TestShimIOURingLate(t *testing.T) {
	const want = "send: 5\nrecv: 5\npolled\nring made\nsend through the ring: 5\nrecv through the ring: 5\n" +
		"accepted the queued connection\nrecv through the ring: 5\nsend through the ring: 5\nlistening\n" +
		"accept through the ring: an fd\nrecv through the ring: 4\nsend through the ring: 4\n" +
		"connected after the ring\nsend through the ring: 5\nrecv through the ring: 5"
	// The ring made through liburing, and with the system call through
	// the C library's syscall(2), as a program that makes its own system
	// calls does (Rust's io-uring crate).
	for _, mode := range []string{"late", "late-raw"} {
		t.Run(mode, func(t *testing.T) {
			log := uringRun(t, mode, want)
			requireAccelerated(t, log, "connecting")
			requireAccelerated(t, log, "listening")
			if !strings.Contains(log, "(connections handed over: 1; listeners whose ports went to their kernel sockets: 1; left accelerated: 0)") {
				t.Errorf("the shim's log does not say that the ring sent the sockets to the kernel:\n%s", log)
			}
		})
	}
}

// uringRun runs shim/test/uring.c (mode: "", or "late" or "late-raw",
// its ring made after its first sockets) on the kernel and under the
// shim, against an echo server and a client in the other host, and
// requires the lines want of both. It returns the shim's log.
func uringRun(t *testing.T, mode, want string) string {
	t.Helper()
	late := mode != ""
	if _, err := os.Stat("/usr/include/liburing.h"); err != nil {
		t.Skip("liburing's header is not installed (apt-get install liburing-dev): cannot build the io_uring program")
	}
	shimOnloadd(t)
	prog := buildC(t, "uring", "-luring")
	a, b, ln := echoHosts(t)
	const lport = 7350
	run := func(shim bool) (string, string) {
		args := []string{b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), strconv.Itoa(lport)}
		if mode != "" {
			args = append(args, mode)
		}
		name, stdin, next, log := startSide(t, a, shim, prog, args...)
		defer stdin.Close()
		var lines []string
		if late {
			lines = append(lines, next("the send"), next("the recv"), next("polled"))
			// A connection queued on the listener as the ring is made.
			connected, queued := make(chan struct{}), make(chan error, 1)
			go func() {
				queued <- askConnected(b, netip.AddrPortFrom(a.Iface0().Addr(), lport), "early", "early", connected)
			}()
			select {
			case <-connected:
			case err := <-queued:
				t.Fatalf("%s: %v\n%s", name, err, log.String())
			}
			if _, err := io.WriteString(stdin, "go\n"); err != nil {
				t.Fatal(err)
			}
			lines = append(lines, next("the ring"), next("the send through the ring"), next("the recv through the ring"),
				next("the accept of the queued connection"), next("its recv"), next("its send"))
			if err := <-queued; err != nil {
				t.Fatalf("%s: %v\n%s", name, err, log.String())
			}
		} else {
			lines = append(lines, next("the send through the ring"), next("the recv through the ring"))
		}
		lines = append(lines, next("listening"))
		if lines[len(lines)-1] != "listening" {
			t.Fatalf("%s: uring printed %q:\n%s", name, lines, log.String())
		}
		if err := askOnce(b, netip.AddrPortFrom(a.Iface0().Addr(), lport), "ring", "ring"); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, log.String())
		}
		lines = append(lines, next("the accept"), next("the recv"), next("the send"))
		if late {
			lines = append(lines, next("the second connect"), next("its send"), next("its recv"))
		}
		return strings.Join(lines, "\n"), name + "'s log:\n" + log.String()
	}
	kernel, _ := run(false)
	if kernel != want {
		t.Fatalf("on the kernel:\n%s\nwant\n%s", kernel, want)
	}
	shim, log := run(true)
	if shim != kernel {
		t.Errorf("under the shim:\n%s\non the kernel:\n%s\n%s", shim, kernel, log)
	}
	return log
}

// TestShimCongestion: TCP_CONGESTION (shim/test/congestion.c). The stack
// has CUBIC and NewReno: a connection set to either, before its connect
// or on it, runs it and reads it back, as on the kernel; a name that does
// not exist is refused as there. A connection set before its connect to
// an algorithm the kernel has and the stack has not (bbr) is the
// kernel's, as the program asked; set so on an accelerated connection
// the set succeeds (the kernel's socket took it) and the connection
// keeps, and reports, the stack's. One that set nothing reports the
// stack's default (cubic), not the namespace's. Before, the option went
// to the kernel socket alone: every connection ran the stack's default,
// and getsockopt reported the kernel socket's.
func TestShimCongestion(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "congestion")
	a, b, ln := echoHosts(t)
	// An algorithm the kernel has (loading its module, as root may) and
	// the stack has not; the namespace's default.
	other, def := "-", ""
	if err := a.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if def, err = unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION); err != nil {
			return err
		}
		for _, name := range []string{"bbr", "htcp", "vegas", "westwood"} {
			if unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, name) == nil {
				other = name
				break
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if other == "-" {
		t.Log("the kernel has no congestion control but cubic and reno here (no bbr, htcp, vegas or westwood module): a connection set to another is not tried")
	}
	run := func(shim bool) ([]string, string) {
		name, stdin, next, log := startSide(t, a, shim, prog, b.Iface0().Addr().String(),
			strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), other)
		defer stdin.Close()
		lines := []string{next("reno"), next("reno's echo"), next("cubic"), next("cubic's echo"), next("unknown")}
		if other != "-" {
			lines = append(lines, next(other), next(other+"'s echo"), next(other+" on the connection"), next("the echo after it"))
		}
		return append(lines, next("set nothing")), name + "'s log:\n" + log.String()
	}
	// want is what the program prints where OTHER set on a connection
	// reads back onTheConnection and one that set nothing setNothing.
	want := func(onTheConnection, setNothing string) string {
		w := []string{"reno before the connect: reno", "reno: echo a line", "cubic on the connection: cubic", "cubic: echo a line",
			"an algorithm that does not exist: No such file or directory"}
		if other != "-" {
			w = append(w, other+" before the connect: "+other, other+": echo a line",
				other+" on the connection: taken, now "+onTheConnection, "after it: echo a line")
		}
		return strings.Join(append(w, "set nothing: "+setNothing), "\n")
	}
	kernel, _ := run(false)
	if got, w := strings.Join(kernel, "\n"), want(other, def); got != w {
		t.Fatalf("on the kernel:\n%s\nwant\n%s", got, w)
	}
	shim, log := run(true)
	if got, w := strings.Join(shim, "\n"), want("cubic", "cubic"); got != w {
		t.Errorf("under the shim:\n%s\nwant\n%s\n%s", got, w, log)
	}
	requireAccelerated(t, log, "connecting")
	if other != "-" && !strings.Contains(log, "TCP_CONGESTION "+other+", which the stack has not (cubic, reno): the kernel's") {
		t.Errorf("the shim's log does not say why the connection set to %s is the kernel's:\n%s", other, log)
	}
}
