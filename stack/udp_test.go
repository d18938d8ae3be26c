package stack_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/gvisorpeer"
	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

var (
	addrA = netip.MustParsePrefix("198.18.0.1/24")
	addrB = netip.MustParsePrefix("198.18.0.2/24")
)

// memPair is our stack on end a of an in-memory wire, the other end b
// left for the test to use.
func memPair(t *testing.T, cfg vnic.MemConfig) (*stack.Stack, *vnic.Mem, *vnic.Mem) {
	t.Helper()
	a, b, err := vnic.NewMemPair(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	s, err := stack.New(a, stack.Config{Addr: addrA, MAC: a.Info().MAC}, stack.Options{
		Neighbours: map[netip.Addr]net.HardwareAddr{addrB.Addr(): b.Info().MAC},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return s, a, b
}

// twoStacks is our stack on both ends.
func twoStacks(t *testing.T, cfg vnic.MemConfig) (*stack.Stack, *stack.Stack) {
	t.Helper()
	sa, sb, _, _ := twoStacksNICs(t, cfg)
	return sa, sb
}

// twoStacksNICs is twoStacks with the ends of the wire, for a test that
// changes its impairments.
func twoStacksNICs(t *testing.T, cfg vnic.MemConfig) (sa, sb *stack.Stack, a, b *vnic.Mem) {
	t.Helper()
	sa, a, b = memPair(t, cfg)
	return sa, peerStack(t, a, b, stack.Config{}, stack.Options{}), a, b
}

// peerStack is our stack on end b of memPair's wire (a the other end), at
// addrB, with the test's own settings beside those.
func peerStack(t *testing.T, a, b *vnic.Mem, cfg stack.Config, opt stack.Options) *stack.Stack {
	t.Helper()
	cfg.Addr, cfg.MAC = addrB, b.Info().MAC
	opt.Neighbours = map[netip.Addr]net.HardwareAddr{addrA.Addr(): a.Info().MAC}
	s, err := stack.New(b, cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return s
}

// recvUDP polls until a datagram arrives on id.
func recvUDP(t *testing.T, s *stack.Stack, id stack.SockID, others ...func()) ([]byte, netip.AddrPort) {
	t.Helper()
	buf := make([]byte, 2048)
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, from, err := s.RecvFrom(id, buf, false)
		if err == nil {
			return buf[:n], from
		}
		if !errors.Is(err, stack.ErrWouldBlock) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no datagram in 5s (counters %s)", ptr(s.Counters()))
		}
		s.Poll()
		for _, f := range others {
			f()
		}
	}
}

func ptr[T any](v T) *T { return &v }

func udpSocket(t *testing.T, s *stack.Stack, port uint16) stack.SockID {
	t.Helper()
	id, err := s.Open(stack.UDP)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(id, netip.AddrPortFrom(netip.Addr{}, port)); err != nil {
		t.Fatal(err)
	}
	return id
}

func TestUDPBetweenOurStacks(t *testing.T) {
	sa, sb := twoStacks(t, vnic.MemConfig{})
	ua, ub := udpSocket(t, sa, 5000), udpSocket(t, sb, 6000)
	bAddr := netip.AddrPortFrom(addrB.Addr(), 6000)
	for _, size := range []int{0, 1, 100, 1472} {
		msg := bytes.Repeat([]byte{byte(size)}, size)
		if n, err := sa.SendTo(ua, msg, bAddr); err != nil || n != size {
			t.Fatalf("send %d bytes: %d, %v", size, n, err)
		}
		got, from := recvUDP(t, sb, ub)
		if !bytes.Equal(got, msg) || from != netip.AddrPortFrom(addrA.Addr(), 5000) {
			t.Fatalf("%d bytes: got %d bytes from %v", size, len(got), from)
		}
		// And back, through a connected socket.
		if err := sb.Connect(ub, from); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.SendTo(ub, msg, netip.AddrPort{}); err != nil {
			t.Fatal(err)
		}
		if got, _ := recvUDP(t, sa, ua); !bytes.Equal(got, msg) {
			t.Fatalf("reply of %d bytes differs", size)
		}
	}
	if _, err := sa.SendTo(ua, make([]byte, 1473), bAddr); !errors.Is(err, syscall.EMSGSIZE) {
		t.Errorf("1473-byte datagram: %v, want EMSGSIZE", err)
	}
}

// TestUDPWithNetstack exchanges datagrams with gVisor's netstack as the
// peer, both ways.
func TestUDPWithNetstack(t *testing.T) {
	s, a, b := memPair(t, vnic.MemConfig{})
	peer, err := gvisorpeer.New(b, addrB, map[netip.Addr]net.HardwareAddr{addrA.Addr(): a.Info().MAC})
	if err != nil {
		t.Fatal(err)
	}
	peer.Run()
	defer peer.Close()
	us := udpSocket(t, s, 5000)
	gc, err := peer.DialUDP(netip.AddrPortFrom(addrB.Addr(), 7000), netip.AddrPortFrom(addrA.Addr(), 5000))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()

	for i := range 50 {
		msg := []byte(fmt.Sprintf("from netstack %d %s", i, bytes.Repeat([]byte("x"), i*25)))
		if _, err := gc.Write(msg); err != nil {
			t.Fatal(err)
		}
		got, from := recvUDP(t, s, us)
		if !bytes.Equal(got, msg) || from != netip.AddrPortFrom(addrB.Addr(), 7000) {
			t.Fatalf("datagram %d: %q from %v", i, got, from)
		}
		reply := append([]byte("echo: "), got...)
		if _, err := s.SendTo(us, reply, from); err != nil {
			t.Fatal(err)
		}
		gc.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 2048)
		n, err := gc.Read(buf)
		if err != nil {
			t.Fatalf("netstack read %d: %v (our counters %s)", i, err, ptr(s.Counters()))
		}
		if !bytes.Equal(buf[:n], reply) {
			t.Fatalf("netstack got %q, want %q", buf[:n], reply)
		}
	}
}

func TestUDPErrors(t *testing.T) {
	s, _, _ := memPair(t, vnic.MemConfig{})
	u := udpSocket(t, s, 5000)
	other, _ := s.Open(stack.UDP)
	for name, c := range map[string]struct {
		err  error
		want syscall.Errno
	}{
		"port in use":         {s.Bind(other, netip.MustParseAddrPort("198.18.0.1:5000")), syscall.EADDRINUSE},
		"foreign address":     {s.Bind(other, netip.MustParseAddrPort("198.18.0.9:1")), syscall.EADDRNOTAVAIL},
		"bound twice":         {s.Bind(u, netip.MustParseAddrPort("0.0.0.0:5001")), syscall.EINVAL},
		"no destination":      {second(s.SendTo(u, []byte("x"), netip.AddrPort{})), syscall.EDESTADDRREQ},
		"unknown neighbour":   {second(s.SendTo(u, []byte("x"), netip.MustParseAddrPort("198.18.0.77:1"))), syscall.EHOSTUNREACH},
		"outside the subnet":  {second(s.SendTo(u, []byte("x"), netip.MustParseAddrPort("10.0.0.1:1"))), syscall.EHOSTUNREACH},
		"nothing to read":     {third(s.RecvFrom(u, make([]byte, 10), false)), syscall.EAGAIN},
		"proto 99":            {second(s.Open(stack.Proto(99))), syscall.EOPNOTSUPP},
		"port 0 destination":  {second(s.SendTo(u, []byte("x"), netip.MustParseAddrPort("198.18.0.2:0"))), syscall.EINVAL},
		"connect to 0.0.0.0":  {s.Connect(u, netip.MustParseAddrPort("0.0.0.0:1")), syscall.EINVAL},
		"recv on closed":      {third(s.RecvFrom(closed(t, s), make([]byte, 10), false)), syscall.EBADF},
		"forged socket id":    {third(s.RecvFrom(stack.SockID(12345), make([]byte, 10), false)), syscall.EBADF},
		"null socket id":      {s.Close(stack.NullSock), syscall.EBADF},
		"send on closed":      {second(s.SendTo(closed(t, s), []byte("x"), netip.MustParseAddrPort("198.18.0.2:1"))), syscall.EBADF},
		"bind on closed":      {s.Bind(closed(t, s), netip.AddrPort{}), syscall.EBADF},
		"connect on closed":   {s.Connect(closed(t, s), netip.MustParseAddrPort("198.18.0.2:1")), syscall.EBADF},
		"local addr (closed)": {second(s.LocalAddr(closed(t, s))), syscall.EBADF},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", name, c.err, c.want)
		}
	}
	// Closing frees the port.
	s.Close(u)
	if err := s.Bind(other, netip.MustParseAddrPort("198.18.0.1:5000")); err != nil {
		t.Errorf("bind after the port's socket closed: %v", err)
	}
}

func second[T any](_ T, err error) error { return err }

func third[T, U any](_ T, _ U, err error) error { return err }

func closed(t *testing.T, s *stack.Stack) stack.SockID {
	id, err := s.Open(stack.UDP)
	if err != nil {
		t.Fatal(err)
	}
	s.Close(id)
	return id
}

func TestSocketTableFull(t *testing.T) {
	a, _, err := vnic.NewMemPair(vnic.MemConfig{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := stack.New(a, stack.Config{Addr: addrA, MAC: a.Info().MAC, Sockets: 3}, stack.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	var ids []stack.SockID
	for range 3 {
		id, err := s.Open(stack.UDP)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := s.Open(stack.UDP); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("fourth socket of three: %v, want EMFILE", err)
	}
	if s.Counters().SocketsExhausted != 1 {
		t.Error("exhaustion not counted")
	}
	s.Close(ids[1])
	id, err := s.Open(stack.UDP)
	if err != nil {
		t.Fatal(err)
	}
	if id == ids[1] {
		t.Error("a reused slot gave the same SockID: a stale ID would reach the new socket")
	}
	if _, err := s.LocalAddr(ids[1]); !errors.Is(err, syscall.EBADF) {
		t.Errorf("stale ID after its slot was reused: %v, want EBADF", err)
	}
}

func TestEphemeralPorts(t *testing.T) {
	s, _, _ := memPair(t, vnic.MemConfig{})
	seen := map[uint16]bool{}
	for range 100 {
		id, _ := s.Open(stack.UDP)
		if err := s.Bind(id, netip.AddrPort{}); err != nil {
			t.Fatal(err)
		}
		la, _ := s.LocalAddr(id)
		if la.Port() < 32768 || la.Port() > 60999 || seen[la.Port()] {
			t.Fatalf("ephemeral port %d: outside the range or handed out twice", la.Port())
		}
		seen[la.Port()] = true
	}
}

// TestHostileFrames feeds frames with lying headers to a stack with a live
// UDP socket: each is counted and dropped, nothing reaches the socket, and
// a good datagram afterwards still does.
func TestHostileFrames(t *testing.T) {
	s, a, b := memPair(t, vnic.MemConfig{})
	u := udpSocket(t, s, 5000)
	src := pkt.Endpoint{MAC: b.Info().MAC, Addr: netip.AddrPortFrom(addrB.Addr(), 9)}
	dst := pkt.Endpoint{MAC: a.Info().MAC, Addr: netip.AddrPortFrom(addrA.Addr(), 5000)}
	good := make([]byte, 100)
	n, _ := pkt.UDP(good, src, dst, []byte("payload!"))
	good = good[:n]
	mod := func(f func([]byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	fixIP := func(b []byte) []byte {
		b[24], b[25] = 0, 0
		var sum uint32
		for i := 14; i < 34; i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		for sum > 0xffff {
			sum = sum>>16 + sum&0xffff
		}
		binary.BigEndian.PutUint16(b[24:], ^uint16(sum))
		return b
	}
	cases := map[string]struct {
		frame   []byte
		counter func(stack.Counters) uint64
	}{
		"runt":                {good[:20], func(c stack.Counters) uint64 { return c.RxNotIPv4 }},
		"arp":                 {mod(func(b []byte) []byte { b[12], b[13] = 8, 6; return b }), func(c stack.Counters) uint64 { return c.RxNotIPv4 }},
		"bad ip checksum":     {mod(func(b []byte) []byte { b[24] ^= 1; return b }), func(c stack.Counters) uint64 { return c.RxBadIPChecksum }},
		"ip version 6":        {mod(func(b []byte) []byte { b[14] = 0x65; return fixIP(b) }), func(c stack.Counters) uint64 { return c.RxBadIPHeader }},
		"ihl 15 past the end": {mod(func(b []byte) []byte { b[14] = 0x4f; return fixIP(b[:40]) }), func(c stack.Counters) uint64 { return c.RxBadIPHeader }},
		"total length lies":   {mod(func(b []byte) []byte { b[16], b[17] = 0x10, 0; return fixIP(b) }), func(c stack.Counters) uint64 { return c.RxBadIPHeader }},
		"fragment":            {mod(func(b []byte) []byte { b[20] = 0x20; return fixIP(b) }), func(c stack.Counters) uint64 { return c.RxFragments }},
		"not our address":     {mod(func(b []byte) []byte { b[33] = 99; return fixIP(b) }), func(c stack.Counters) uint64 { return c.RxNotForUs }},
		"icmp":                {mod(func(b []byte) []byte { b[23] = 1; return fixIP(b) }), func(c stack.Counters) uint64 { return c.RxOtherProto }},
		"bad udp checksum":    {mod(func(b []byte) []byte { b[len(b)-1] ^= 0xff; return b }), func(c stack.Counters) uint64 { return c.RxUDPBadChecksum }},
		"udp length lies":     {mod(func(b []byte) []byte { b[38], b[39] = 0x10, 0; return b }), func(c stack.Counters) uint64 { return c.RxUDPBadChecksum }},
		"udp length < 8":      {mod(func(b []byte) []byte { b[38], b[39] = 0, 4; return b }), func(c stack.Counters) uint64 { return c.RxUDPBadChecksum }},
		"no such port":        {mod(func(b []byte) []byte { b[36], b[37] = 0, 1; b[40], b[41] = 0, 0; return b }), func(c stack.Counters) uint64 { return c.RxUDPNoSocket }},
	}
	send := func(frame []byte) {
		h := b.Pool().Alloc()
		copy(b.Pool().Buf(h), frame)
		b.Pool().SetLen(h, len(frame))
		if n, err := b.Transmit([]vnic.Handle{h}); n != 1 {
			t.Fatal(err)
		}
		s.Poll()
	}
	for name, c := range cases {
		before := c.counter(s.Counters())
		send(c.frame)
		if got := c.counter(s.Counters()); got != before+1 {
			t.Errorf("%s: counter %d -> %d, want one more (counters %s)", name, before, got, ptr(s.Counters()))
		}
		if _, _, err := s.RecvFrom(u, make([]byte, 100), true); !errors.Is(err, stack.ErrWouldBlock) {
			t.Errorf("%s: something reached the socket", name)
		}
	}
	send(good)
	if got, _ := recvUDP(t, s, u); string(got) != "payload!" {
		t.Errorf("good datagram after the bad ones: %q", got)
	}
	if free, total := a.Pool().Available(), a.Pool().Count(); free != total {
		t.Errorf("%d of %d frames free after every frame was consumed: frames leaked", free, total)
	}
}

// TestUDPZeroAllocs checks that sending a datagram and receiving one
// allocate nothing.
func TestUDPZeroAllocs(t *testing.T) {
	sa, sb := twoStacks(t, vnic.MemConfig{})
	ua, ub := udpSocket(t, sa, 5000), udpSocket(t, sb, 6000)
	to := netip.AddrPortFrom(addrB.Addr(), 6000)
	msg, buf := make([]byte, 64), make([]byte, 2048)
	if n := testing.AllocsPerRun(1000, func() {
		sa.SendTo(ua, msg, to)
		sb.Poll()
		sb.RecvFrom(ub, buf, false)
	}); n != 0 {
		t.Errorf("%v allocations per datagram", n)
	}
}

// TestImageAttach checks that a second view of the image, as another
// process would map it, sees the first one's sockets and queued data.
func TestImageAttach(t *testing.T) {
	sa, sb := twoStacks(t, vnic.MemConfig{})
	ua, ub := udpSocket(t, sa, 5000), udpSocket(t, sb, 6000)
	sa.SendTo(ua, []byte("queued before the second view"), netip.AddrPortFrom(addrB.Addr(), 6000))
	sb.Poll()
	fd, err := syscall.Dup(sb.Image().FD())
	if err != nil {
		t.Fatal(err)
	}
	img, err := stack.AttachImage(fd)
	if err != nil {
		t.Fatal(err)
	}
	if img.Size() != sb.Image().Size() {
		t.Errorf("second view is %d bytes, the first %d", img.Size(), sb.Image().Size())
	}
	img.Close()
	if _, err := stack.AttachImage(mustMemfd(t)); err == nil {
		t.Error("AttachImage accepted an empty memfd")
	}
	if got, _ := recvUDP(t, sb, ub); string(got) != "queued before the second view" {
		t.Errorf("got %q", got)
	}
}

func mustMemfd(t *testing.T) int {
	fd, err := unix.MemfdCreate("empty", 0)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}
