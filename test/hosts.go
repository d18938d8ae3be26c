// Package test builds test hosts: network namespaces joined by veth pairs,
// with addresses from 198.18.0.0/15 (RFC 2544's benchmarking range). Every
// host is torn down when its Net is closed, and Pair/NewNet with a
// testing.TB close it in t.Cleanup, so a failing test leaves nothing
// behind. Names carry the creating process's pid, so parallel tests and
// parallel test binaries never collide, and hosts left by a process that
// was killed are swept the next time a Net is made.
//
// Creating hosts needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2.
package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// RequireRoot skips the test, with one line saying why, unless it runs as
// root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "needs root (network namespaces, XDP and AF_XDP); run `make test` as root")
	}
}

// RequireTool skips the test when a program it runs is not installed.
func RequireTool(tb testing.TB, name string) {
	tb.Helper()
	if _, err := exec.LookPath(name); err != nil {
		Missing(tb, "%s is not installed (make deps installs it)", name)
	}
}

// Missing skips a test the machine cannot run (no root, a tool or a
// kernel feature missing), saying what is missing. Where everything is
// required (ONLOAD_REQUIRE_ALL=1: CI, which installs it all), it fails
// the test instead: a test skipped there proves nothing and would pass
// unseen.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("ONLOAD_REQUIRE_ALL") == "1" {
		tb.Fatalf("cannot run here, and ONLOAD_REQUIRE_ALL=1 requires every test to: %s", msg)
	}
	tb.Skip("skipped: " + msg)
}

// Net is a set of test hosts and the links between them.
type Net struct {
	prefix string
	mu     sync.Mutex
	hosts  []*Host
	links  int
	closed bool
}

// Host is a network namespace.
type Host struct {
	// Name is the short name given to AddHost.
	Name string
	// NS is the namespace's name, for `ip netns exec`.
	NS     string
	Ifaces []*Iface
	net    *Net
}

// Iface is one end of a veth link, inside a host.
type Iface struct {
	Host   *Host
	Name   string
	Index  int
	MAC    net.HardwareAddr
	Prefix netip.Prefix // address and subnet
	Peer   *Iface
}

// Addr is the interface's IPv4 address.
func (i *Iface) Addr() netip.Addr { return i.Prefix.Addr() }

// LinkOptions shape a veth link.
type LinkOptions struct {
	Queues int // receive and transmit queues on each end (default 1)
	MTU    int // default 1500
}

const nsPrefix = "olt"

var netSeq atomic.Uint32

// NewNet returns an empty set of hosts. Close it when done.
func NewNet() (*Net, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("test hosts need root: run as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("test hosts need the ip command: apt-get install iproute2")
	}
	sweep()
	return &Net{prefix: fmt.Sprintf("%s%dx%d", nsPrefix, os.Getpid(), netSeq.Add(1))}, nil
}

// NewTestNet is NewNet for a test: it skips the test when not root, fails
// it on error, and closes the Net in t.Cleanup.
func NewTestNet(tb testing.TB) *Net {
	tb.Helper()
	RequireRoot(tb)
	n, err := NewNet()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := n.Close(); err != nil {
			tb.Errorf("tear down test hosts: %v", err)
		}
	})
	return n
}

// Pair makes two hosts, "a" and "b", joined by one veth link: a's eth0 is
// 198.18.0.1/24, b's is 198.18.0.2/24. They are torn down when the test
// ends.
func Pair(tb testing.TB, o LinkOptions) (a, b *Host) {
	tb.Helper()
	n := NewTestNet(tb)
	var err error
	if a, err = n.AddHost("a"); err != nil {
		tb.Fatal(err)
	}
	if b, err = n.AddHost("b"); err != nil {
		tb.Fatal(err)
	}
	if _, _, err = n.Connect(a, b, o); err != nil {
		tb.Fatal(err)
	}
	return a, b
}

// NewPair is Pair outside of a test (benchmarks, the demo). Close the
// returned Net when done.
func NewPair(o LinkOptions) (n *Net, a, b *Host, err error) {
	if n, err = NewNet(); err != nil {
		return nil, nil, nil, err
	}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	if a, err = n.AddHost("a"); err != nil {
		return
	}
	if b, err = n.AddHost("b"); err != nil {
		return
	}
	_, _, err = n.Connect(a, b, o)
	return
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// AddHost makes a network namespace with its loopback up.
func (n *Net) AddHost(name string) (*Host, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, errors.New("add host: net is closed")
	}
	h := &Host{Name: name, NS: n.prefix + "-" + name, net: n}
	if err := ip("netns", "add", h.NS); err != nil {
		return nil, fmt.Errorf("add host %s: %w", name, err)
	}
	n.hosts = append(n.hosts, h)
	if err := ip("-n", h.NS, "link", "set", "lo", "up"); err != nil {
		return nil, fmt.Errorf("add host %s: %w", name, err)
	}
	return h, nil
}

// Connect joins a and b with a veth pair. Link k (counting from 0) gets the
// subnet 198.18.k.0/24 (198.19.(k-256).0/24 past 255), a taking .1 and b .2.
// Each side's interface is named eth<i>, i counting that host's links.
// Transmit checksum offload is off on both ends, so frames carry complete
// checksums as they would on a wire.
func (n *Net) Connect(a, b *Host, o LinkOptions) (*Iface, *Iface, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	subnet, err := n.subnetLocked()
	if err != nil {
		return nil, nil, err
	}
	return n.linkLocked(a, b, o, hostPrefix(subnet, 1), hostPrefix(subnet, 2))
}

// subnetLocked takes the next link number's /24.
func (n *Net) subnetLocked() ([4]byte, error) {
	k := n.links
	if k >= 512 {
		return [4]byte{}, errors.New("connect: at most 512 links per net")
	}
	n.links++
	return [4]byte{198, 18 + byte(k/256), byte(k % 256), 0}, nil
}

func hostPrefix(subnet [4]byte, host byte) netip.Prefix {
	subnet[3] = host
	return netip.PrefixFrom(netip.AddrFrom4(subnet), 24)
}

// linkLocked makes the veth pair between a and b and gives each end its
// prefix (none if the prefix is not valid).
func (n *Net) linkLocked(a, b *Host, o LinkOptions, pa, pb netip.Prefix) (*Iface, *Iface, error) {
	if a == b {
		return nil, nil, errors.New("connect: a host cannot be linked to itself")
	}
	if n.closed {
		return nil, nil, errors.New("connect: net is closed")
	}
	if o.Queues == 0 {
		o.Queues = 1
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	ia := &Iface{Host: a, Name: fmt.Sprintf("eth%d", len(a.Ifaces)), Prefix: pa}
	ib := &Iface{Host: b, Name: fmt.Sprintf("eth%d", len(b.Ifaces)), Prefix: pb}
	q := strconv.Itoa(o.Queues)
	if err := ip("link", "add", ia.Name, "netns", a.NS, "numtxqueues", q, "numrxqueues", q, "type", "veth",
		"peer", ib.Name, "netns", b.NS, "numtxqueues", q, "numrxqueues", q); err != nil {
		return nil, nil, fmt.Errorf("connect %s and %s: %w", a.Name, b.Name, err)
	}
	for _, side := range []*Iface{ia, ib} {
		ns := side.Host.NS
		cmds := [][]string{{"-n", ns, "link", "set", side.Name, "mtu", strconv.Itoa(o.MTU)}}
		if side.Prefix.IsValid() {
			cmds = append(cmds, []string{"-n", ns, "addr", "add", side.Prefix.String(), "dev", side.Name})
		}
		cmds = append(cmds, []string{"-n", ns, "link", "set", side.Name, "up"})
		for _, args := range cmds {
			if err := ip(args...); err != nil {
				return nil, nil, fmt.Errorf("connect %s and %s: %w", a.Name, b.Name, err)
			}
		}
		if err := side.Host.Do(func() error { return disableTxChecksum(side.Name) }); err != nil {
			return nil, nil, fmt.Errorf("connect %s and %s: %w", a.Name, b.Name, err)
		}
		if err := side.readLink(); err != nil {
			return nil, nil, fmt.Errorf("connect %s and %s: %w", a.Name, b.Name, err)
		}
	}
	ia.Peer, ib.Peer = ib, ia
	a.Ifaces = append(a.Ifaces, ia)
	b.Ifaces = append(b.Ifaces, ib)
	return ia, ib, nil
}

func (i *Iface) readLink() error {
	out, err := exec.Command("ip", "-n", i.Host.NS, "-j", "link", "show", "dev", i.Name).Output()
	if err != nil {
		return fmt.Errorf("read link %s in %s: %w", i.Name, i.Host.Name, err)
	}
	var links []struct {
		Ifindex int    `json:"ifindex"`
		Address string `json:"address"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return fmt.Errorf("read link %s in %s: unexpected output %q", i.Name, i.Host.Name, out)
	}
	mac, err := net.ParseMAC(links[0].Address)
	if err != nil {
		return fmt.Errorf("read link %s in %s: %w", i.Name, i.Host.Name, err)
	}
	i.Index, i.MAC = links[0].Ifindex, mac
	return nil
}

// Close deletes every host (and with them their links). It is safe to call
// more than once.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	var errs []error
	for _, h := range n.hosts {
		if err := ip("netns", "delete", h.NS); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// sweep deletes namespaces left by test processes that no longer exist.
func sweep() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, nsPrefix)
		if !ok {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "x")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == unix.ESRCH {
			_ = ip("netns", "delete", name)
		}
	}
}

// Do runs fn on an OS thread that has entered the host's network
// namespace. Sockets, AF_XDP sockets and XDP attachments made by fn belong
// to the host and keep working after fn returns, from any goroutine.
// Goroutines that fn starts do not run in the host.
func (h *Host) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is never unlocked: when this goroutine ends the
		// runtime throws the thread away rather than reuse it in the
		// wrong namespace.
		runtime.LockOSThread()
		fd, err := unix.Open("/var/run/netns/"+h.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("enter host %s: %w", h.Name, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			errc <- fmt.Errorf("enter host %s: %w", h.Name, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// Command returns a command that runs inside the host.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// Run runs a command inside the host and returns its combined output; the
// error includes the output.
func (h *Host) Run(name string, args ...string) (string, error) {
	return h.RunFor(5*time.Minute, name, args...)
}

// RunFor is Run with a bound: the command is killed after d.
func (h *Host) RunFor(d time.Duration, name string, args ...string) (string, error) {
	cmd := h.Command(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("%s in host %s: %w", name, h.Name, err)
	}
	timer := time.AfterFunc(d, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	if !timer.Stop() {
		err = fmt.Errorf("not done in %v, killed (%v)", d, err)
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s %s in host %s: %v: %s", name, strings.Join(args, " "), h.Name, err, bytes.TrimSpace(out.Bytes()))
	}
	return out.String(), nil
}

// Iface0 is the host's first interface.
func (h *Host) Iface0() *Iface {
	if len(h.Ifaces) == 0 {
		return nil
	}
	return h.Ifaces[0]
}

// KernelEcho starts a TCP echo server of the host's kernel on addr
// ("ip:port"); it stops when the listener is closed.
func (h *Host) KernelEcho(addr string) (net.Listener, error) {
	var ln net.Listener
	if err := h.Do(func() (err error) { ln, err = net.Listen("tcp", addr); return }); err != nil {
		return nil, fmt.Errorf("echo server in host %s: %w", h.Name, err)
	}
	go acceptEach(ln, func(c net.Conn) { io.Copy(c, c) })
	return ln, nil
}

// acceptEach serves each connection ln accepts with serve, on a goroutine
// of its own, and closes it after, until ln is closed.
func acceptEach(ln net.Listener, serve func(c net.Conn)) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			serve(c)
		}()
	}
}

// TCPCounters reads the host's TCP counters (the Tcp and TcpExt lines of
// /proc/net/snmp and /proc/net/netstat, as nstat shows them: "TCPLossProbes",
// "RetransSegs"), for a test to say which of the kernel's mechanisms
// acted.
func (h *Host) TCPCounters() (map[string]int64, error) {
	m := map[string]int64{}
	err := h.Do(func() error {
		for _, f := range []string{"/proc/thread-self/net/snmp", "/proc/thread-self/net/netstat"} {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			lines := strings.Split(string(b), "\n")
			for i := 0; i+1 < len(lines); i += 2 {
				names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
				if len(names) != len(values) || len(names) == 0 || (names[0] != "Tcp:" && names[0] != "TcpExt:") {
					continue
				}
				for j := 1; j < len(names); j++ {
					if v, err := strconv.ParseInt(values[j], 10, 64); err == nil {
						m[names[j]] = v
					}
				}
			}
		}
		return nil
	})
	return m, err
}

// CounterDelta says which counters moved from before to after: "name +n"
// for each, sorted by name.
func CounterDelta(before, after map[string]int64) string {
	var moved []string
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			moved = append(moved, fmt.Sprintf("%s %+d", k, d))
		}
	}
	sort.Strings(moved)
	return strings.Join(moved, ", ")
}
