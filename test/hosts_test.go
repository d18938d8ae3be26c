package test

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/ethtool"
)

func netnsList(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// TestPair checks that two hosts reach each other through the kernel, that
// Do runs code inside a host, and that Close removes them.
func TestPair(t *testing.T) {
	RequireRoot(t)
	n, a, b, err := NewPair(LinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got := a.Iface0().Addr().String(); got != "198.18.0.1" {
		t.Errorf("a's address = %s, want 198.18.0.1", got)
	}
	if got := b.Iface0().Addr().String(); got != "198.18.0.2" {
		t.Errorf("b's address = %s, want 198.18.0.2", got)
	}
	if a.Iface0().Peer != b.Iface0() || a.Iface0().MAC == nil || a.Iface0().Index == 0 {
		t.Errorf("interfaces not filled in: %+v", a.Iface0())
	}
	if _, err := a.Run("ping", "-c", "1", "-W", "2", b.Iface0().Addr().String()); err != nil {
		t.Fatal(err)
	}

	// A kernel TCP server in b, a client in a: sockets made inside Do keep
	// working from other goroutines.
	var ln net.Listener
	if err := b.Do(func() (err error) { ln, err = net.Listen("tcp", "198.18.0.2:0"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Write([]byte("hello from b"))
			c.Close()
		}
	}()
	var reply []byte
	if err := a.Do(func() error {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		n, err := c.Read(buf)
		reply = buf[:n]
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if string(reply) != "hello from b" {
		t.Errorf("reply = %q", reply)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if l := netnsList(t); strings.Contains(l, a.NS) || strings.Contains(l, b.NS) {
		t.Errorf("namespaces left after Close:\n%s", l)
	}
}

// TestParallelNets checks that nets made at the same time do not collide.
func TestParallelNets(t *testing.T) {
	RequireRoot(t)
	for i := range 3 {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			a, b := Pair(t, LinkOptions{Queues: i + 1})
			if _, err := b.Run("ping", "-c", "1", "-W", "2", a.Iface0().Addr().String()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestSweep checks that namespaces of a dead process are removed.
func TestSweep(t *testing.T) {
	RequireRoot(t)
	// Find a pid that is not running.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}

	stale := nsPrefix + strconv.Itoa(cmd.Process.Pid) + "x1-a"
	if err := ip("netns", "add", stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ip("netns", "delete", stale) })
	n, err := NewNet()
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if strings.Contains(netnsList(t), stale) {
		t.Errorf("stale namespace %s not swept", stale)
	}
}

// TestEthtoolOnVeth: the ethtool requests onloadd steers queues with,
// on the test hosts' veth: its driver is named, its n-tuple filters are
// off (veth has none, so onloadd relies on the sender's queue), and a
// rule is refused by the driver with an error that names the interface
// and the rule.
func TestEthtoolOnVeth(t *testing.T) {
	RequireRoot(t)
	a, _ := Pair(t, LinkOptions{Queues: 2})
	name := a.Iface0().Name
	err := a.Do(func() error {
		if d, err := ethtool.Driver(name); err != nil || d != "veth" {
			return fmt.Errorf("driver of %s: %q, %v; want veth", name, d, err)
		}
		if on, err := ethtool.NtupleOn(name); err != nil || on {
			return fmt.Errorf("n-tuple filters of %s: %v, %v; want off", name, on, err)
		}
		_, err := ethtool.InsertRule(name, ethtool.Rule{Port: 8080, Queue: 1})
		if !errors.Is(err, unix.EOPNOTSUPP) || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), "tcp port 8080 to queue 1") {
			return fmt.Errorf("an n-tuple rule on veth: %v, want EOPNOTSUPP naming %s and the rule", err, name)
		}
		if _, err := ethtool.Driver("no-such-if0"); err == nil || !strings.Contains(err.Error(), "no-such-if0") {
			return fmt.Errorf("driver of a missing interface: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
