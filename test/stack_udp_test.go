package test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// ourStack puts our stack on iface's host: the steering program, an XDP
// NIC and a stack using the interface's address, which resolves its
// neighbours through the host kernel's table.
func ourStack(t *testing.T, iface *Iface) *stack.Stack {
	t.Helper()
	_, s := ourStackNIC(t, iface, SteerConfig{})
	return s
}

// ourStackNIC is ourStack, also returning the data path under it.
func ourStackNIC(t *testing.T, iface *Iface, cfg SteerConfig) (*Steered, *stack.Stack) {
	t.Helper()
	st, err := Steer(iface, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var kn *stack.KernelNeighbours
	var kcfg stack.Config
	if err := iface.Host.Do(func() (err error) {
		if kcfg, err = stack.KernelConfig(iface.Name); err != nil {
			return err
		}
		kn, err = stack.NewKernelNeighbours(iface.Name)
		return
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kn.Close() })
	if kcfg.Addr != iface.Prefix || kcfg.MTU != 1500 || kcfg.MAC.String() != iface.MAC.String() {
		t.Fatalf("KernelConfig = %+v, want %v %v mtu 1500", kcfg, iface.Prefix, iface.MAC)
	}
	s, err := stack.New(st.NIC, kcfg, stack.Options{
		Filters:  stack.SteeringFilters{Steering: st.Steering, Stack: st.Stack},
		Resolver: kn,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return st, s
}

// TestStackUDPWithKernel exchanges datagrams between our stack in host b
// and the Linux kernel's UDP in host a, while b's kernel keeps answering
// ping.
func TestStackUDPWithKernel(t *testing.T) {
	a, b := Pair(t, LinkOptions{})
	s := ourStack(t, b.Iface0())
	id, err := s.Open(stack.UDP)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Bind(id, netip.AddrPortFrom(netip.Addr{}, 7000)); err != nil {
		t.Fatal(err)
	}
	var kc *net.UDPConn
	if err := a.Do(func() (err error) {
		kc, err = net.DialUDP("udp", nil, &net.UDPAddr{IP: b.Iface0().Addr().AsSlice(), Port: 7000})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer kc.Close()

	buf := make([]byte, 2048)
	for i := range 200 {
		msg := []byte(fmt.Sprintf("kernel datagram %d %s", i, bytes.Repeat([]byte{'k'}, i*7)))
		if _, err := kc.Write(msg); err != nil {
			t.Fatal(err)
		}
		var n int
		var from netip.AddrPort
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.Poll()
			n, from, err = s.RecvFrom(id, buf, false)
			if err == nil {
				break
			}
			if !errors.Is(err, stack.ErrWouldBlock) || time.Now().After(deadline) {
				c := s.Counters()
				t.Fatalf("datagram %d: %v (counters %s)", i, err, &c)
			}
		}
		if !bytes.Equal(buf[:n], msg) || from.Addr() != a.Iface0().Addr() {
			t.Fatalf("datagram %d: %q from %v", i, buf[:n], from)
		}
		reply := append([]byte("our reply to "), msg...)
		if _, err := s.SendTo(id, reply, from); err != nil {
			t.Fatal(err)
		}
		kc.SetReadDeadline(time.Now().Add(5 * time.Second))
		m, err := kc.Read(buf)
		if err != nil {
			t.Fatalf("kernel read %d: %v", i, err)
		}
		if !bytes.Equal(buf[:m], reply) {
			t.Fatalf("kernel got %q", buf[:m])
		}
	}
	if _, err := a.Run("ping", "-c", "2", "-i", "0.1", "-W", "2", b.Iface0().Addr().String()); err != nil {
		t.Error(err)
	}
	// Closing the socket gives the port back to the kernel: b's kernel now
	// answers (with ICMP port unreachable, which a connected UDP socket
	// reports as connection refused).
	s.Close(id)
	kc.Write([]byte("after close"))
	kc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := kc.Read(buf); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after close: %v, want connection refused from b's kernel", err)
	}
}

// TestStackNeighbourResolution sends first, to a host b's kernel has never
// talked to: the datagram waits while the kernel resolves the address, then
// goes. A host that does not exist costs the frames held for it, after the
// resolution times out, and is then refused at once.
func TestStackNeighbourResolution(t *testing.T) {
	a, b := Pair(t, LinkOptions{})
	s := ourStack(t, b.Iface0())
	var kc net.PacketConn
	if err := a.Do(func() (err error) { kc, err = net.ListenPacket("udp", a.Iface0().Addr().String()+":9000"); return }); err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	id, _ := s.Open(stack.UDP)
	if _, err := s.SendTo(id, []byte("first words"), netip.AddrPortFrom(a.Iface0().Addr(), 9000)); err != nil {
		t.Fatalf("send before the neighbour is known: %v", err)
	}
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 100)
		kc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := kc.ReadFrom(buf)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf[:n])
	}()
	var msg string
	deadline := time.Now().Add(5 * time.Second)
poll:
	for time.Now().Before(deadline) {
		s.Poll()
		select {
		case msg = <-got:
			break poll
		default:
			time.Sleep(100 * time.Microsecond)
		}
	}
	if msg != "first words" {
		c := s.Counters()
		t.Fatalf("kernel in a got %q (counters %s)", msg, &c)
	}

	// Nobody at 198.18.0.77.
	ghost := netip.MustParseAddrPort("198.18.0.77:9000")
	for range 3 {
		if _, err := s.SendTo(id, []byte("into the void"), ghost); err != nil {
			t.Fatalf("send to an unresolved host: %v", err)
		}
	}
	before := s.Counters().TxNoNeighbour
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end) && s.Counters().TxNoNeighbour < before+3; {
		s.Poll()
		time.Sleep(time.Millisecond)
	}
	if got := s.Counters().TxNoNeighbour - before; got != 3 {
		t.Errorf("%d held frames dropped after the resolution timed out, want 3", got)
	}
	if _, err := s.SendTo(id, []byte("again"), ghost); !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("send to a host that failed to resolve: %v, want EHOSTUNREACH", err)
	}
}

// TestKernelConfig reads an interface's address, MTU and default gateway
// from the kernel, and the namespace's net.ipv4.tcp_notsent_lowat.
func TestKernelConfig(t *testing.T) {
	a, b := Pair(t, LinkOptions{MTU: 1400})
	if _, err := b.Run("ip", "route", "add", "default", "via", a.Iface0().Addr().String()); err != nil {
		t.Fatal(err)
	}
	var cfg stack.Config
	if err := b.Do(func() (err error) { cfg, err = stack.KernelConfig("eth0"); return }); err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != b.Iface0().Prefix || cfg.MTU != 1400 || cfg.Gateway != a.Iface0().Addr() {
		t.Errorf("KernelConfig = addr %v mtu %d gateway %v; want %v 1400 %v", cfg.Addr, cfg.MTU, cfg.Gateway, b.Iface0().Prefix, a.Iface0().Addr())
	}
	if cfg.NotSentLowat != 0 {
		t.Errorf("KernelConfig's NotSentLowat %d under the sysctl's default (no limit), want 0", cfg.NotSentLowat)
	}
	for _, c := range []struct{ sysctl, want uint32 }{{16384, 16384}, {0, 1}} {
		if _, err := b.Run("sysctl", "-qw", fmt.Sprintf("net.ipv4.tcp_notsent_lowat=%d", c.sysctl)); err != nil {
			t.Fatal(err)
		}
		if err := b.Do(func() (err error) { cfg, err = stack.KernelConfig("eth0"); return }); err != nil {
			t.Fatal(err)
		}
		if cfg.NotSentLowat != c.want {
			t.Errorf("KernelConfig's NotSentLowat %d under net.ipv4.tcp_notsent_lowat %d, want %d", cfg.NotSentLowat, c.sysctl, c.want)
		}
	}
	err := b.Do(func() error { _, err := stack.KernelConfig("lo"); return err })
	if err != nil {
		t.Errorf("lo has 127.0.0.1: %v", err)
	}
	if err := b.Do(func() error { _, err := stack.KernelConfig("nosuch0"); return err }); err == nil {
		t.Error("a missing interface gave no error")
	}
}
