package test

import (
	"net"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// TestQueueSteerSpread: Spread puts a client's connections on the queues
// as evenly as an RSS hash would, for ports that come 2 apart as a
// connect's do (64 of them, all with one high byte: a bit of that byte
// chose the queue before, and put them all on one). Each queue of the
// receiving end must take from a quarter to three quarters of the
// frames, counted by the veth's per-queue XDP counters (an XDP_PASS
// program there makes it count).
func TestQueueSteerSpread(t *testing.T) {
	RequireTool(t, "ethtool")
	a, b := Pair(t, LinkOptions{Queues: 2})
	qs, err := NewQueueSteer(a, a.Iface0().Name)
	if err != nil {
		Missing(t, "cannot steer host a's queues here (TCX egress): %v", err)
	}
	t.Cleanup(func() { qs.Close() })
	const port = 8095
	if err := qs.Spread(port, 2); err != nil {
		t.Fatal(err)
	}
	pass, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}}) // XDP_PASS
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	err = b.Do(func() error {
		l, err := link.AttachXDP(link.XDPOptions{Program: pass, Interface: b.Iface0().Index})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	})
	if err != nil {
		Missing(t, "cannot attach XDP to host b's veth: %v", err)
	}
	ln, err := b.KernelEcho(b.Iface0().Addr().String() + ":" + strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	before := queueFrames(t, b)
	for i := range 64 {
		c, err := dialFromPort(a, 40192+2*i, ln.Addr().String(), 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte("x"))
		buf := make([]byte, 1)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = c.Read(buf)
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	after := queueFrames(t, b)
	q0, q1 := after[0]-before[0], after[1]-before[1]
	if q0+q1 < 3*64 || q0*4 < q0+q1 || q1*4 < q0+q1 {
		t.Errorf("frames of 64 connections by receive queue: %d and %d; want each from a quarter to three quarters", q0, q1)
	}
	t.Logf("frames of 64 connections by receive queue: %d and %d", q0, q1)
}

// dialFromPort connects from host h's address and port (SO_REUSEADDR: a
// port a test chose, which Spread puts on a queue it knows) to addr.
func dialFromPort(h *Host, port int, addr string, timeout time.Duration) (c net.Conn, err error) {
	err = h.Do(func() error {
		d := net.Dialer{Timeout: timeout, LocalAddr: &net.TCPAddr{IP: h.Iface0().Addr().AsSlice(), Port: port},
			Control: func(_, _ string, rc syscall.RawConn) error {
				return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
			}}
		c, err = d.Dial("tcp", addr)
		return err
	})
	return c, err
}

var xdpQueueStat = regexp.MustCompile(`rx_queue_([01])_xdp_packets: (\d+)`)

// queueFrames reads host h's veth counters of frames its XDP program saw
// on queues 0 and 1.
func queueFrames(t *testing.T, h *Host) [2]int {
	t.Helper()
	out, err := h.Run("ethtool", "-S", h.Iface0().Name)
	if err != nil {
		t.Fatal(err)
	}
	var n [2]int
	m := xdpQueueStat.FindAllStringSubmatch(out, -1)
	if len(m) != 2 {
		Missing(t, "no per-queue XDP counters in ethtool -S %s: %q", h.Iface0().Name, out)
	}
	for _, s := range m {
		q, _ := strconv.Atoi(s[1])
		n[q], _ = strconv.Atoi(s[2])
	}
	return n
}
