package bpf_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/test"
	"github.com/xdp-onload/onload/xdp"
)

// xdpMd is struct xdp_md, the context BPF_PROG_RUN hands the program.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

var (
	macA   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xa}
	macB   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0xb}
	ipA    = netip.MustParseAddr("198.18.0.1")
	ipB    = netip.MustParseAddr("198.18.0.2")
	remote = pkt.Endpoint{MAC: macA, Addr: netip.AddrPortFrom(ipA, 40000)}
)

func local(port uint16) pkt.Endpoint {
	return pkt.Endpoint{MAC: macB, Addr: netip.AddrPortFrom(ipB, port)}
}

func udpFrame(t *testing.T, dport uint16, payload string) []byte {
	t.Helper()
	b := make([]byte, 1514)
	n, err := pkt.UDP(b, remote, local(dport), []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

func tcpFrame(t *testing.T, dport uint16, flags header.TCPFlags) []byte {
	t.Helper()
	b := make([]byte, 1514)
	n, err := pkt.TCP(b, remote, local(dport), pkt.TCPSegment{Seq: 1000, Flags: flags, Window: 65535})
	if err != nil {
		t.Fatal(err)
	}
	return b[:n]
}

// rig is a loaded steering program with real AF_XDP sockets in some XSKMAP
// slots, on a 4-queue veth in a private network namespace (no traffic is
// sent: the program runs on crafted frames through BPF_PROG_RUN).
type rig struct {
	t     *testing.T
	s     *bpf.Steering
	host  *test.Host
	iface *test.Iface
}

func newRig(t *testing.T) *rig {
	test.RequireRoot(t)
	a, _ := test.Pair(t, test.LinkOptions{Queues: 4})
	s, err := bpf.Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &rig{t: t, s: s, host: a, iface: a.Iface0()}
}

// socket binds an AF_XDP socket to queue q and registers it for stack id.
func (r *rig) socket(id bpf.StackID, q int) {
	r.t.Helper()
	err := r.host.Do(func() error {
		u, err := xdp.NewUmem(xdp.UmemConfig{FrameCount: 64})
		if err != nil {
			return err
		}
		sk, err := xdp.Open(u, xdp.Config{Interface: r.iface.Name, Queue: q, RxSize: 64, TxSize: 64, FillSize: 64, CompletionSize: 64})
		if err != nil {
			u.Close()
			return err
		}
		r.t.Cleanup(func() { sk.Close(); u.Close() })
		return r.s.SetSocket(id, q, sk.FD())
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// listenAll registers stack 1, with a socket on queue 0, for UDP and TCP
// to port on every address.
func (r *rig) listenAll(port uint16) {
	r.t.Helper()
	r.socket(1, 0)
	for _, p := range []bpf.Proto{bpf.UDP, bpf.TCP} {
		if err := r.s.AddListener(bpf.Listener{Proto: p, Port: port}, 1); err != nil {
			r.t.Fatal(err)
		}
	}
}

// run runs the program once on frame as if it arrived on queue q and
// returns the verdict and the counters that moved.
func (r *rig) run(frame []byte, q int) (uint32, bpf.Counters) {
	r.t.Helper()
	return r.runProg(r.s.Program(), frame, q)
}

func (r *rig) runProg(prog *ebpf.Program, frame []byte, q int) (uint32, bpf.Counters) {
	r.t.Helper()
	before, err := r.s.Counters()
	if err != nil {
		r.t.Fatal(err)
	}
	var ret uint32
	err = r.host.Do(func() (err error) {
		ret, err = prog.Run(&ebpf.RunOptions{
			Data: frame,
			Context: xdpMd{
				DataEnd:        uint32(len(frame)),
				IngressIfindex: uint32(r.iface.Index),
				RxQueueIndex:   uint32(q),
			},
		})
		return err
	})
	if err != nil {
		r.t.Fatalf("run program: %v", err)
	}
	after, err := r.s.Counters()
	if err != nil {
		r.t.Fatal(err)
	}
	return ret, after.Sub(before)
}

const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpRedirect = 4
)

func verdictName(v uint32) string {
	return map[uint32]string{0: "ABORTED", 1: "DROP", 2: "PASS", 3: "TX", 4: "REDIRECT"}[v]
}

// expect checks one run: the verdict and that exactly the named counter
// moved besides rx (and, for redirects, nothing else).
func (r *rig) expect(name string, frame []byte, q int, verdict uint32, counter int) {
	r.t.Helper()
	got, c := r.run(frame, q)
	if got != verdict {
		r.t.Errorf("%s: verdict %s, want %s (counters %s)", name, verdictName(got), verdictName(verdict), c)
	}
	want := bpf.Counters{}
	want[bpf.CounterRX] = 1
	want[counter] = 1
	c[bpf.CounterWakeup], c[bpf.CounterWakeupLost] = 0, 0
	if c != want {
		r.t.Errorf("%s: counters moved %s, want %s", name, c, want)
	}
}

// TestForwardProgram checks the fault injector's program: every frame,
// whatever it is, goes to stack 0's socket for its queue, and to the
// kernel when that queue has none.
func TestForwardProgram(t *testing.T) {
	r := newRig(t)
	r.socket(0, 1)
	arp := make([]byte, 42)
	copy(arp, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	arp[12], arp[13] = 0x08, 0x06
	for _, c := range []struct {
		name    string
		frame   []byte
		q       int
		verdict uint32
	}{
		{"udp on a queue with a socket", udpFrame(t, 9, "x"), 1, xdpRedirect},
		{"broadcast arp on a queue with a socket", arp, 1, xdpRedirect},
		{"tcp on a queue without a socket", tcpFrame(t, 9, header.TCPFlagSyn), 0, xdpPass},
		{"a bare ethernet header", make([]byte, 14), 1, xdpRedirect},
	} {
		got, ctr := r.runProg(r.s.ForwardProgram(), c.frame, c.q)
		if got != c.verdict {
			t.Errorf("%s: verdict %s, want %s", c.name, verdictName(got), verdictName(c.verdict))
		}
		if ctr[bpf.CounterRX] != 1 {
			t.Errorf("%s: rx counter moved by %d, want 1", c.name, ctr[bpf.CounterRX])
		}
	}
}

func TestSteeringVerdicts(t *testing.T) {
	r := newRig(t)
	// One UMEM per (device, queue): each stack gets its own queues.
	const stackUDP, stackTCP, stackFlow, stackNoSock bpf.StackID = 1, 2, 3, 4
	r.socket(stackUDP, 0)
	r.socket(stackFlow, 1)
	r.socket(stackTCP, 2)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.s.AddListener(bpf.Listener{Proto: bpf.UDP, Addr: ipB, Port: 7000}, stackUDP))
	must(r.s.AddListener(bpf.Listener{Proto: bpf.TCP, Port: 7001}, stackTCP)) // wildcard address
	must(r.s.AddListener(bpf.Listener{Proto: bpf.TCP, Addr: ipB, Port: 7002}, stackNoSock))
	// A flow on the listener's port goes to another stack: flows win.
	must(r.s.AddFlow(bpf.Flow{Proto: bpf.TCP, Local: netip.AddrPortFrom(ipB, 7001), Remote: remote.Addr}, stackFlow))

	r.expect("udp to listener", udpFrame(t, 7000, "hello"), 0, xdpRedirect, bpf.CounterRedirectListener)
	// Were the listener chosen, stack 2 has no socket on queue 1: a drop.
	r.expect("tcp syn matching a flow", tcpFrame(t, 7001, header.TCPFlagSyn), 1, xdpRedirect, bpf.CounterRedirectFlow)
	r.expect("udp to unregistered port", udpFrame(t, 7005, "x"), 0, xdpPass, bpf.CounterPassNoMatch)
	r.expect("tcp to unregistered port", tcpFrame(t, 80, header.TCPFlagSyn), 0, xdpPass, bpf.CounterPassNoMatch)
	// Same port but from another remote port: the flow does not match, the
	// wildcard listener does.
	other := tcpFrame(t, 7001, header.TCPFlagSyn)
	binary.BigEndian.PutUint16(other[14+20:], 40001)
	r.expect("tcp to wildcard listener", other, 2, xdpRedirect, bpf.CounterRedirectListener)
	r.expect("tcp to wildcard listener, stack has no socket on queue 1", other, 1, xdpDrop, bpf.CounterDropNoXSK)
	r.expect("udp on queue 2, stack has no socket there", udpFrame(t, 7000, "q2"), 2, xdpDrop, bpf.CounterDropNoXSK)
	r.expect("listener with no socket", tcpFrame(t, 7002, header.TCPFlagSyn), 0, xdpDrop, bpf.CounterDropNoXSK)

	// Padding after the IP datagram (short frames padded to 60 bytes) is
	// fine.
	padded := append(udpFrame(t, 7000, "p"), make([]byte, 20)...)
	r.expect("udp with ethernet padding", padded, 0, xdpRedirect, bpf.CounterRedirectListener)

	// IPv4 options: the ports are found after them.
	r.expect("udp with ip options", withIPOptions(udpFrame(t, 7000, "opts")), 0, xdpRedirect, bpf.CounterRedirectListener)

	// Removing entries takes effect.
	must(r.s.RemoveListener(bpf.Listener{Proto: bpf.UDP, Addr: ipB, Port: 7000}))
	r.expect("udp after listener removed", udpFrame(t, 7000, "gone"), 0, xdpPass, bpf.CounterPassNoMatch)
	must(r.s.RemoveFlow(bpf.Flow{Proto: bpf.TCP, Local: netip.AddrPortFrom(ipB, 7001), Remote: remote.Addr}))
	r.expect("tcp after flow removed", tcpFrame(t, 7001, header.TCPFlagAck), 2, xdpRedirect, bpf.CounterRedirectListener)
	must(r.s.ClearSocket(stackTCP, 2))
	r.expect("tcp after socket cleared", tcpFrame(t, 7001, header.TCPFlagAck), 2, xdpDrop, bpf.CounterDropNoXSK)
	// Removing what is not there is not an error.
	must(r.s.RemoveListener(bpf.Listener{Proto: bpf.UDP, Addr: ipB, Port: 7000}))
}

// TestSteeringKernelFlowsOnListenerPort checks that a listener's entry
// leaves to the kernel the segments of connections the kernel has on
// that port (its kernel half accepted them before the stack listened),
// and takes SYNs and every segment of a connection the kernel does not
// have, or has only in TIME-WAIT (a new connection of the stack's on a
// four-tuple a kernel server closed).
func TestSteeringKernelFlowsOnListenerPort(t *testing.T) {
	r := newRig(t)
	r.socket(1, 0)
	la := r.iface.Addr()
	var ln net.Listener
	var conn net.Conn
	err := r.host.Do(func() (err error) {
		if ln, err = net.Listen("tcp", netip.AddrPortFrom(la, 0).String()); err != nil {
			return err
		}
		conn, err = net.Dial("tcp", ln.Addr().String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	defer conn.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	if err := r.s.AddListener(bpf.Listener{Proto: bpf.TCP, Port: port}, 1); err != nil {
		t.Fatal(err)
	}
	frame := func(from netip.AddrPort, flags header.TCPFlags) []byte {
		b := make([]byte, 1514)
		n, err := pkt.TCP(b, pkt.Endpoint{MAC: macA, Addr: from}, pkt.Endpoint{MAC: macB, Addr: netip.AddrPortFrom(la, port)},
			pkt.TCPSegment{Seq: 1000, Flags: flags, Window: 65535})
		if err != nil {
			t.Fatal(err)
		}
		return b[:n]
	}
	kernel := conn.LocalAddr().(*net.TCPAddr).AddrPort()
	r.expect("ack of the kernel's connection", frame(kernel, header.TCPFlagAck), 0, xdpPass, bpf.CounterPassKernelFlow)
	// The check finds the kernel's connection and leaves the look-up on.
	r.checkKernelFlows(bpf.Listener{Proto: bpf.TCP, Port: port})
	r.expect("ack of the kernel's connection, after the check", frame(kernel, header.TCPFlagAck), 0, xdpPass, bpf.CounterPassKernelFlow)
	r.expect("fin of the kernel's connection", frame(kernel, header.TCPFlagAck|header.TCPFlagFin), 0, xdpPass, bpf.CounterPassKernelFlow)
	other := netip.AddrPortFrom(ipA, 40000)
	r.expect("ack of a connection the kernel does not have", frame(other, header.TCPFlagAck), 0, xdpRedirect, bpf.CounterRedirectListener)
	ended := timeWaitOn(t, r, ln)
	r.expect("ack of a four-tuple the kernel has in TIME-WAIT", frame(ended, header.TCPFlagAck), 0, xdpRedirect, bpf.CounterRedirectListener)
	r.expect("syn", frame(kernel, header.TCPFlagSyn), 0, xdpRedirect, bpf.CounterRedirectListener)

	// A stack whose socket table is full leaves new connections to the
	// kernel: SYNs pass, and the segments of its own connections still
	// come to it.
	ctl, err := r.s.Control(1)
	if err != nil {
		t.Fatal(err)
	}
	if marked, err := r.s.KernelFlowsMarked(); err != nil || marked {
		t.Fatalf("kernel flows marked before any SYN went to the kernel: %v, %v", marked, err)
	}
	ctl.SetFull(true)
	r.expect("syn to a full stack", frame(other, header.TCPFlagSyn), 0, xdpPass, bpf.CounterPassFull)
	if marked, err := r.s.KernelFlowsMarked(); err != nil || !marked {
		t.Errorf("a SYN passed to the kernel did not mark the kernel's flows: %v, %v", marked, err)
	}
	r.expect("ack to a full stack", frame(other, header.TCPFlagAck), 0, xdpRedirect, bpf.CounterRedirectListener)
	r.expect("syn-ack to a full stack", frame(other, header.TCPFlagSyn|header.TCPFlagAck), 0, xdpRedirect, bpf.CounterRedirectListener)
	ctl.SetFull(false)
	r.expect("syn once it has room", frame(other, header.TCPFlagSyn), 0, xdpRedirect, bpf.CounterRedirectListener)
}

// checkKernelFlows runs l's CheckKernelFlows in the rig's host, with no
// grace, and waits for it.
func (r *rig) checkKernelFlows(l bpf.Listener) {
	r.t.Helper()
	var done <-chan error
	r.host.Do(func() error { done = r.s.CheckKernelFlows(l, 0); return nil })
	select {
	case err := <-done:
		if err != nil {
			r.t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		r.t.Fatal("CheckKernelFlows: no answer in 10s")
	}
}

// TestSteeringKernelLookupSkipped checks that a listener entry on whose
// port CheckKernelFlows found no connection of the kernel's sends its
// segments to the stack without looking them up in the kernel's tables;
// that a check begun before the entry was written again leaves the
// look-up on; and that the look-up comes back for every entry once the
// kernel's flows are marked (a handover).
func TestSteeringKernelLookupSkipped(t *testing.T) {
	r := newRig(t)
	r.socket(1, 0)
	la := r.iface.Addr()
	// listen listens on a port of the kernel's, in the rig's host.
	listen := func() net.Listener {
		var ln net.Listener
		if err := r.host.Do(func() (err error) { ln, err = net.Listen("tcp", netip.AddrPortFrom(la, 0).String()); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		return ln
	}
	// kernelConn listens on a port of the kernel's and connects to it.
	kernelConn := func() (port uint16, kernel netip.AddrPort) {
		ln := listen()
		var conn net.Conn
		if err := r.host.Do(func() (err error) { conn, err = net.Dial("tcp", ln.Addr().String()); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return uint16(ln.Addr().(*net.TCPAddr).Port), conn.LocalAddr().(*net.TCPAddr).AddrPort()
	}
	frame := func(from netip.AddrPort, port uint16) []byte {
		b := make([]byte, 1514)
		n, err := pkt.TCP(b, pkt.Endpoint{MAC: macA, Addr: from}, pkt.Endpoint{MAC: macB, Addr: netip.AddrPortFrom(la, port)},
			pkt.TCPSegment{Seq: 1000, Flags: header.TCPFlagAck, Window: 65535})
		if err != nil {
			t.Fatal(err)
		}
		return b[:n]
	}

	// A check that finds no connection of the kernel's clears the entry's
	// look-up: a connection the kernel makes afterwards (which the
	// steering would not let it make: its SYN goes to the stack) is not
	// looked up.
	ln := listen()
	free := bpf.Listener{Proto: bpf.TCP, Addr: la, Port: uint16(ln.Addr().(*net.TCPAddr).Port)}
	if err := r.s.AddListener(free, 1); err != nil {
		t.Fatal(err)
	}
	r.checkKernelFlows(free)
	var late net.Conn
	if err := r.host.Do(func() (err error) { late, err = net.Dial("tcp", ln.Addr().String()); return }); err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	lateFrom := late.LocalAddr().(*net.TCPAddr).AddrPort()
	r.expect("ack on a port checked free", frame(lateFrom, free.Port), 0, xdpRedirect, bpf.CounterRedirectListener)

	// A check that finds the kernel's connection leaves the look-up on.
	port, kernel := kernelConn()
	busy := bpf.Listener{Proto: bpf.TCP, Port: port}
	if err := r.s.AddListener(busy, 1); err != nil {
		t.Fatal(err)
	}
	r.checkKernelFlows(busy)
	r.expect("ack on a port checked busy", frame(kernel, port), 0, xdpPass, bpf.CounterPassKernelFlow)

	// A check begun before its entry was written again leaves the new
	// entry's look-up on, though it finds the port free.
	ln2 := listen()
	again := bpf.Listener{Proto: bpf.TCP, Port: uint16(ln2.Addr().(*net.TCPAddr).Port)}
	if err := r.s.AddListener(again, 1); err != nil {
		t.Fatal(err)
	}
	var stale <-chan error
	r.host.Do(func() error { stale = r.s.CheckKernelFlows(again, 100*time.Millisecond); return nil })
	if err := r.s.AddListener(again, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-stale; err != nil {
		t.Fatal(err)
	}
	var conn2 net.Conn
	if err := r.host.Do(func() (err error) { conn2, err = net.Dial("tcp", ln2.Addr().String()); return }); err != nil {
		t.Fatal(err)
	}
	defer conn2.Close()
	r.expect("ack on a port written again after its check began", frame(conn2.LocalAddr().(*net.TCPAddr).AddrPort(), again.Port), 0, xdpPass, bpf.CounterPassKernelFlow)

	// Marked: every entry looks its segments up again.
	if err := r.s.MarkKernelFlows(); err != nil {
		t.Fatal(err)
	}
	r.expect("ack on a port checked free, once the kernel's flows are marked", frame(lateFrom, free.Port), 0, xdpPass, bpf.CounterPassKernelFlow)
}

// timeWaitOn makes a connection to ln, in the rig's host, that the
// server's side closes first, and returns the client's address once the
// server's socket is in TIME-WAIT.
func timeWaitOn(t *testing.T, r *rig, ln net.Listener) netip.AddrPort {
	t.Helper()
	var c, s net.Conn
	err := r.host.Do(func() (err error) {
		c, err = net.Dial("tcp", ln.Addr().String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 { // past the connections the test made before, unaccepted
		if s, err = ln.Accept(); err != nil {
			t.Fatal(err)
		}
		if s.RemoteAddr().String() == c.LocalAddr().String() {
			break
		}
		t.Cleanup(func(s net.Conn) func() { return func() { s.Close() } }(s))
	}
	s.Close() // the server's FIN first
	c.Close()
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	// /proc/net/tcp: local and remote address:port in hex, then the state
	// (06: TIME-WAIT).
	hexAP := func(ap netip.AddrPort) string {
		a := ap.Addr().As4()
		return fmt.Sprintf("%02X%02X%02X%02X:%04X", a[3], a[2], a[1], a[0], ap.Port())
	}
	want := hexAP(ln.Addr().(*net.TCPAddr).AddrPort()) + " " + hexAP(client) + " 06"
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var tab []byte
		if err := r.host.Do(func() (err error) { tab, err = os.ReadFile("/proc/thread-self/net/tcp"); return }); err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(tab), want) {
			return client
		}
		if time.Now().After(end) {
			t.Fatalf("the server's side of %v is not in TIME-WAIT after 5s:\n%s", client, tab)
		}
	}
}

// withIPOptions inserts 4 bytes of IP options (NOP NOP NOP EOL) and fixes
// the header length, total length and checksum.
func withIPOptions(f []byte) []byte {
	out := append([]byte{}, f[:14+20]...)
	out = append(out, 1, 1, 1, 0)
	out = append(out, f[14+20:]...)
	ip := header.IPv4(out[14:])
	ip[0] = 0x46
	ip.SetTotalLength(ip.TotalLength() + 4)
	ip.SetChecksum(0)
	ip.SetChecksum(^ip.CalculateChecksum())
	return out
}

func TestSteeringLeavesOtherTrafficToTheKernel(t *testing.T) {
	r := newRig(t)
	r.listenAll(7000)
	udp := udpFrame(t, 7000, "payload")
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte{}, udp...)) }

	arp := mod(func(b []byte) []byte { binary.BigEndian.PutUint16(b[12:], 0x0806); return b[:42] })
	ipv6 := mod(func(b []byte) []byte { binary.BigEndian.PutUint16(b[12:], 0x86dd); return b })
	vlan := append(append(append([]byte{}, udp[:12]...), 0x81, 0x00, 0x00, 0x05), udp[12:]...)
	qinq := append(append(append([]byte{}, udp[:12]...), 0x88, 0xa8, 0x00, 0x05), udp[12:]...)
	bcast := mod(func(b []byte) []byte { copy(b, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}); return b })
	mcast := mod(func(b []byte) []byte { copy(b, []byte{0x01, 0x00, 0x5e, 0, 0, 1}); return b })
	icmp := mod(func(b []byte) []byte { b[14+9] = 1; return b })
	sctp := mod(func(b []byte) []byte { b[14+9] = 132; return b })
	mf := mod(func(b []byte) []byte { b[14+6] |= 0x20; return b })
	offset := mod(func(b []byte) []byte { b[14+7] = 8; return b })

	for _, c := range []struct {
		name    string
		frame   []byte
		counter int
	}{
		{"arp", arp, bpf.CounterPassNotIPv4},
		{"ipv6", ipv6, bpf.CounterPassNotIPv4},
		{"802.1q vlan", vlan, bpf.CounterPassVLAN},
		{"802.1ad vlan", qinq, bpf.CounterPassVLAN},
		{"broadcast", bcast, bpf.CounterPassNotUnicast},
		{"multicast", mcast, bpf.CounterPassNotUnicast},
		{"icmp", icmp, bpf.CounterPassOtherProto},
		{"sctp", sctp, bpf.CounterPassOtherProto},
		{"first fragment", mf, bpf.CounterPassFragment},
		{"later fragment", offset, bpf.CounterPassFragment},
	} {
		r.expect(c.name, c.frame, 0, xdpPass, c.counter)
	}
}

func TestSteeringMalformedFrames(t *testing.T) {
	r := newRig(t)
	r.listenAll(7000)
	udp := udpFrame(t, 7000, "payload")
	tcp := tcpFrame(t, 7000, header.TCPFlagSyn)
	mod := func(f []byte, fn func(b []byte) []byte) []byte { return fn(append([]byte{}, f...)) }

	cases := []struct {
		name  string
		frame []byte
	}{
		{"ip header cut", udp[:14+10]},
		{"ip version 5", mod(udp, func(b []byte) []byte { b[14] = 0x55; return b })},
		{"ihl 4", mod(udp, func(b []byte) []byte { b[14] = 0x44; return b })},
		{"ihl beyond frame", mod(udp, func(b []byte) []byte { b[14] = 0x4f; return b[:14+30] })},
		{"total length beyond frame", mod(udp, func(b []byte) []byte { b[14+2] = 0x05; return b })},
		{"total length below ihl", mod(udp, func(b []byte) []byte { b[14+2], b[14+3] = 0, 10; return b })},
		{"udp header cut", udp[:14+20+4]},
		{"udp length beyond datagram", mod(udp, func(b []byte) []byte { b[14+20+4] = 0x10; return b })},
		{"udp length below 8", mod(udp, func(b []byte) []byte { b[14+20+4], b[14+20+5] = 0, 4; return b })},
		{"tcp header cut", mod(tcp, func(b []byte) []byte { b[14+3] = 30; return b[:14+30] })},
		{"tcp data offset 4", mod(tcp, func(b []byte) []byte { b[14+20+12] = 0x40; return b })},
		{"tcp data offset beyond segment", mod(tcp, func(b []byte) []byte { b[14+20+12] = 0xf0; return b })},
	}
	for _, c := range cases {
		r.expect(c.name, c.frame, 0, xdpPass, bpf.CounterPassMalformed)
	}
	// Cuts at every length: never anything but PASS (or a redirect of the
	// whole frame), never an error.
	for n := 14; n < len(tcp); n++ {
		if v, _ := r.run(tcp[:n], 0); v != xdpPass {
			t.Errorf("tcp frame cut to %d bytes: verdict %s, want PASS", n, verdictName(v))
		}
	}
}

func TestSteeringBadEntry(t *testing.T) {
	r := newRig(t)
	// Go refuses out-of-range stack ids...
	if err := r.s.AddListener(bpf.Listener{Proto: bpf.UDP, Port: 7000}, bpf.MaxStacks); err == nil {
		t.Error("AddListener accepted stack id bpf.MaxStacks")
	}
	// ...and the program checks them anyway (maps can be written by anyone
	// holding their fd).
	if err := bpf.PutListenerRaw(r.s, bpf.Listener{Proto: bpf.UDP, Port: 7000}, uint32(bpf.MaxStacks+5)); err != nil {
		t.Fatal(err)
	}
	r.expect("listener naming stack 261", udpFrame(t, 7000, "x"), 0, xdpPass, bpf.CounterPassBadEntry)
}

func TestSteeringArgumentErrors(t *testing.T) {
	r := newRig(t)
	for name, err := range map[string]error{
		"icmp listener":  r.s.AddListener(bpf.Listener{Proto: 1, Port: 1}, 1),
		"ipv6 listener":  r.s.AddListener(bpf.Listener{Proto: bpf.TCP, Addr: netip.MustParseAddr("::1"), Port: 1}, 1),
		"port 0":         r.s.AddListener(bpf.Listener{Proto: bpf.TCP, Port: 0}, 1),
		"flow no addr":   r.s.AddFlow(bpf.Flow{Proto: bpf.TCP}, 1),
		"queue 64":       r.s.SetSocket(1, bpf.MaxQueues, 0),
		"stack 256":      r.s.SetSocket(bpf.MaxStacks, 0, 0),
		"not a socket":   r.s.SetSocket(1, 0, int(os.Stdin.Fd())),
		"control of 256": func() error { _, err := r.s.Control(bpf.MaxStacks); return err }(),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestSteeringWakeEvents(t *testing.T) {
	r := newRig(t)
	r.socket(7, 0)
	if err := r.s.AddListener(bpf.Listener{Proto: bpf.UDP, Port: 7000}, 7); err != nil {
		t.Fatal(err)
	}
	ev, err := r.s.Events()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	ctl, err := r.s.Control(7)
	if err != nil {
		t.Fatal(err)
	}
	frame := udpFrame(t, 7000, "wake")

	// Not armed: no event.
	if _, c := r.run(frame, 0); c[bpf.CounterWakeup] != 0 {
		t.Fatalf("unarmed stack got a wake event: %s", c)
	}
	ctl.Arm()
	if !ctl.Armed() {
		t.Fatal("Arm did not set the flag")
	}
	v, c := r.run(frame, 0)
	if v != xdpRedirect || c[bpf.CounterWakeup] != 1 {
		t.Fatalf("armed stack: verdict %s, counters %s; want REDIRECT and one wakeup", verdictName(v), c)
	}
	if ctl.Armed() {
		t.Error("the program did not clear the armed flag")
	}
	if ctl.Wakeups() != 1 {
		t.Errorf("wakeups = %d, want 1", ctl.Wakeups())
	}
	ev.SetDeadline(time.Now().Add(2 * time.Second))
	e, err := ev.Read()
	if err != nil {
		t.Fatal(err)
	}
	if e != (bpf.WakeEvent{Stack: 7, Queue: 0}) {
		t.Errorf("event = %+v, want stack 7 queue 0", e)
	}
	// Disarmed by the first frame: the next one posts nothing.
	if _, c := r.run(frame, 0); c[bpf.CounterWakeup] != 0 {
		t.Errorf("second frame posted another event: %s", c)
	}
	ev.SetDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := ev.Read(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("second read: %v, want deadline exceeded", err)
	}
	// Other stacks' flags are untouched.
	other, _ := r.s.Control(8)
	other.Arm()
	r.run(frame, 0)
	if !other.Armed() {
		t.Error("a frame for stack 7 disarmed stack 8")
	}
}

// TestCounterNamesMatchProgram checks that the Go counter table has one
// name per counter slot in the program.
func TestCounterNamesMatchProgram(t *testing.T) {
	spec, err := bpf.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Maps["counters"].MaxEntries; got != bpf.NumCounters {
		t.Errorf("program has %d counters, Go names %d", got, bpf.NumCounters)
	}
	if got := spec.Maps["xsks"].MaxEntries; got != bpf.MaxStacks*bpf.MaxQueues {
		t.Errorf("xsks has %d slots, want bpf.MaxStacks*bpf.MaxQueues = %d", got, bpf.MaxStacks*bpf.MaxQueues)
	}
	if got := spec.Maps["control"].MaxEntries; got != bpf.MaxStacks {
		t.Errorf("control has %d entries, want bpf.MaxStacks = %d", got, bpf.MaxStacks)
	}
}

// TestSteeringLanes checks that a flow whose bucket names a lane goes to
// the lane's socket when it arrives on the lane's queue, and to the
// stack's own socket otherwise, and that the program and LaneBucket hash
// alike (a lane set through LaneBucket's bucket is the one the program
// finds).
func TestSteeringLanes(t *testing.T) {
	r := newRig(t)
	r.socket(1, 1) // stack 1's own socket on queue 1
	var lane *xdp.Socket
	err := r.host.Do(func() error {
		u, err := xdp.NewUmem(xdp.UmemConfig{FrameCount: 64})
		if err != nil {
			return err
		}
		p, err := xdp.Open(u, xdp.Config{Interface: r.iface.Name, Queue: 0, RxSize: 64, TxSize: 64, FillSize: 64, CompletionSize: 64})
		if err != nil {
			u.Close()
			return err
		}
		if lane, err = xdp.OpenLane(p, 64); err != nil {
			p.Close()
			u.Close()
			return err
		}
		t.Cleanup(func() { lane.Close(); p.Close(); u.Close() })
		return r.s.SetSocket(1, 0, p.FD())
	})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(r.s.AddListener(bpf.Listener{Proto: bpf.UDP, Port: 7000}, 1))
	must(r.s.SetLaneSocket(1, 3, lane.FD()))
	flow := bpf.Flow{Proto: bpf.UDP, Local: netip.AddrPortFrom(ipB, 7000), Remote: remote.Addr}
	b, err := bpf.LaneBucket(flow)
	must(err)
	other := remote
	for port := uint16(40001); ; port++ { // a flow in another bucket
		other.Addr = netip.AddrPortFrom(ipA, port)
		ob, err := bpf.LaneBucket(bpf.Flow{Proto: bpf.UDP, Local: flow.Local, Remote: other.Addr})
		must(err)
		if ob != b {
			break
		}
	}
	otherFrame := make([]byte, 1514)
	n, err := pkt.UDP(otherFrame, other, local(7000), []byte("other"))
	must(err)
	otherFrame = otherFrame[:n]

	check := func(name string, frame []byte, q int, toLane bool) {
		t.Helper()
		v, c := r.run(frame, q)
		if v != xdpRedirect || c[bpf.CounterRedirectListener] != 1 || (c[bpf.CounterRedirectLane] == 1) != toLane {
			t.Errorf("%s: verdict %s, counters %s; want a redirect, to the lane: %v", name, verdictName(v), c, toLane)
		}
	}
	check("no lane set", udpFrame(t, 7000, "x"), 0, false)
	must(r.s.SetLane(1, flow, 3, 0))
	check("its lane set", udpFrame(t, 7000, "x"), 0, true)
	check("another bucket", otherFrame, 0, false)
	check("on a queue the lane is not on", udpFrame(t, 7000, "x"), 1, false)
	must(r.s.ClearLaneSocket(1, 3))
	check("the lane's socket gone", udpFrame(t, 7000, "x"), 0, false)
	must(r.s.SetLaneSocket(1, 3, lane.FD()))
	check("the lane's socket back", udpFrame(t, 7000, "x"), 0, true)
	must(r.s.SetLane(1, flow, 0, 0))
	check("lane 0: the stack's own socket", udpFrame(t, 7000, "x"), 0, false)

	for name, err := range map[string]error{
		"lane socket 0":  r.s.SetLaneSocket(1, 0, lane.FD()),
		"lane socket 16": r.s.SetLaneSocket(1, bpf.MaxLanes, lane.FD()),
		"lane 16":        r.s.SetLane(1, flow, bpf.MaxLanes, 0),
		"queue 64":       r.s.SetLane(1, flow, 1, bpf.MaxQueues),
		"stack 256":      r.s.SetLane(bpf.MaxStacks, flow, 1, 0),
	} {
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestSteeringClusters checks a cluster's port: each frame goes to the
// member stack of the queue it arrived on (its wake event names that
// stack), to the kernel where the queue has no member, and a flow entry
// still wins over the cluster.
func TestSteeringClusters(t *testing.T) {
	r := newRig(t)
	const port = 8090
	const cl bpf.ClusterID = 7
	r.socket(2, 0)
	r.socket(3, 1)
	if err := r.s.AddClusterListener(bpf.Listener{Proto: bpf.TCP, Port: port}, cl); err != nil {
		t.Fatal(err)
	}
	for q, id := range map[int]bpf.StackID{0: 2, 1: 3, 2: 4} {
		if err := r.s.SetClusterMember(cl, q, id); err != nil {
			t.Fatal(err)
		}
	}
	syn := tcpFrame(t, port, header.TCPFlagSyn)
	for _, c := range []struct {
		q  int
		id bpf.StackID
	}{{0, 2}, {1, 3}} {
		ctl, err := r.s.Control(c.id)
		if err != nil {
			t.Fatal(err)
		}
		ctl.Arm()
		before := ctl.Wakeups()
		r.expect(fmt.Sprintf("syn on queue %d", c.q), syn, c.q, xdpRedirect, bpf.CounterRedirectListener)
		if ctl.Wakeups() != before+1 || ctl.Armed() {
			t.Errorf("syn on queue %d: stack %d's wake-ups %d -> %d, armed %v: the frame did not go to queue %d's member", c.q, c.id, before, ctl.Wakeups(), ctl.Armed(), c.q)
		}
	}
	// Queue 2's member (stack 4) has no socket there: dropped, as for any
	// stack; queue 3 has no member: the kernel's.
	if m, err := r.s.ClusterMembers(cl); err != nil || len(m) != 3 || m[0] != 2 || m[1] != 3 || m[2] != 4 {
		t.Errorf("cluster %d's members read back as %v, %v; want queue 0: 2, 1: 3, 2: 4", cl, m, err)
	}
	r.expect("syn on queue 2, whose member has no socket", syn, 2, xdpDrop, bpf.CounterDropNoXSK)
	if marked, err := r.s.KernelFlowsMarked(); err != nil || marked {
		t.Fatalf("kernel flows marked before any SYN went to the kernel: %v, %v", marked, err)
	}
	r.expect("syn on queue 3, which has no member", syn, 3, xdpPass, bpf.CounterPassNoMember)
	// The kernel has that connection, on a port whose segments the stacks
	// take: the program looks every listener entry's up from now on.
	if marked, err := r.s.KernelFlowsMarked(); err != nil || !marked {
		t.Errorf("a SYN passed to the kernel for want of a member did not mark the kernel's flows: %v, %v", marked, err)
	}
	// A queue held for its member: a SYN is dropped (it comes again), the
	// rest go to the kernel; a member's arrival ends the hold.
	if err := r.s.SetClusterHeld(cl, 1); err != nil {
		t.Fatal(err)
	}
	if m, err := r.s.ClusterMembers(cl); err != nil || m[1] != bpf.HeldMember {
		t.Errorf("queue 1, held, reads back as %v, %v; want bpf.HeldMember", m[1], err)
	}
	r.expect("syn on queue 1, held", syn, 1, xdpDrop, bpf.CounterDropHeld)
	r.expect("an ACK on queue 1, held", tcpFrame(t, port, header.TCPFlagAck), 1, xdpPass, bpf.CounterPassNoMember)
	r.expect("a SYN-ACK on queue 1, held", tcpFrame(t, port, header.TCPFlagSyn|header.TCPFlagAck), 1, xdpPass, bpf.CounterPassNoMember)
	if err := r.s.SetClusterMember(cl, 1, 3); err != nil {
		t.Fatal(err)
	}
	r.expect("syn on queue 1 once its member came", syn, 1, xdpRedirect, bpf.CounterRedirectListener)
	if err := r.s.ClearClusterMember(cl, 1); err != nil {
		t.Fatal(err)
	}
	r.expect("syn on queue 1 once its member left", syn, 1, xdpPass, bpf.CounterPassNoMember)
	f := bpf.Flow{Proto: bpf.TCP, Local: local(port).Addr, Remote: remote.Addr}
	if err := r.s.AddFlow(f, 3); err != nil {
		t.Fatal(err)
	}
	r.expect("a flow of stack 3 on queue 1", tcpFrame(t, port, header.TCPFlagAck), 1, xdpRedirect, bpf.CounterRedirectFlow)

	for _, err := range []error{
		r.s.AddClusterListener(bpf.Listener{Proto: bpf.TCP, Port: port}, bpf.MaxStacks),
		r.s.SetClusterMember(cl, bpf.MaxQueues, 2),
		r.s.SetClusterMember(cl, 0, bpf.MaxStacks),
		r.s.ClearClusterMember(bpf.MaxStacks, 0),
		r.s.SetClusterHeld(cl, bpf.MaxQueues),
	} {
		if err == nil {
			t.Error("an out-of-range cluster, queue or stack was accepted")
		}
	}
}
