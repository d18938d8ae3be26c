package vnic_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/test"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/vnic/vnictest"
	"github.com/xdp-onload/onload/xdp"
)

const port = 7000

// xdpPair puts an XDP NIC in each of two test hosts joined by veth, each
// receiving UDP to its address on port 7000.
func xdpPair(t *testing.T, frames int) vnictest.Pair {
	p, _, _ := xdpPairSteered(t, frames)
	return p
}

// xdpPairSteered is xdpPair with each host's data path, and the hosts.
func xdpPairSteered(t *testing.T, frames int) (vnictest.Pair, [2]*test.Steered, [2]*test.Host) {
	return xdpPairWith(t, vnic.XDPConfig{FrameCount: frames, RingSize: 256, FillDepth: 256})
}

// xdpPairWith is xdpPairSteered with each NIC opened as cfg says.
func xdpPairWith(t *testing.T, cfg vnic.XDPConfig) (vnictest.Pair, [2]*test.Steered, [2]*test.Host) {
	a, b := test.Pair(t, test.LinkOptions{})
	var steered [2]*test.Steered
	var ends [2]pkt.Endpoint
	var nics [2]vnic.NIC
	for i, h := range []*test.Host{a, b} {
		ifc := h.Iface0()
		s, err := test.Steer(ifc, test.SteerConfig{
			Listeners: []bpf.Listener{{Proto: bpf.UDP, Addr: ifc.Addr(), Port: port}},
			NIC:       cfg,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		steered[i] = s
		nics[i] = s.NIC
		ends[i] = pkt.Endpoint{MAC: ifc.MAC, Addr: netip.AddrPortFrom(ifc.Addr(), port)}
	}
	return vnictest.Pair{A: nics[0], B: nics[1], AEnd: ends[0], BEnd: ends[1]}, steered, [2]*test.Host{a, b}
}

func TestXDPContract(t *testing.T) {
	test.RequireRoot(t)
	vnictest.Run(t, func(t *testing.T) vnictest.Pair { return xdpPair(t, 1024) })
}

func TestXDPInfo(t *testing.T) {
	test.RequireRoot(t)
	p := xdpPair(t, 64)
	info := p.A.Info()
	if info.Mode != "xdp copy" || info.MTU != 1500 || info.Name != "eth0 queue 0" {
		t.Errorf("info = %v, want eth0 queue 0 in xdp copy mode with mtu 1500 (veth has no zero-copy)", info)
	}
}

// TestXDPQueueBusy checks the error a user gets when a queue is taken.
func TestXDPQueueBusy(t *testing.T) {
	test.RequireRoot(t)
	a, _ := test.Pair(t, test.LinkOptions{Queues: 2})
	err := a.Do(func() error {
		first, err := vnic.OpenXDP(vnic.XDPConfig{Interface: "eth0", FrameCount: 64, RingSize: 64})
		if err != nil {
			return err
		}
		defer first.Close()
		second, err := vnic.OpenXDP(vnic.XDPConfig{Interface: "eth0", FrameCount: 64, RingSize: 64})
		if err == nil {
			second.Close()
			t.Fatal("a second UMEM bound the same queue")
		}
		if !errors.Is(err, xdp.ErrQueueBusy) {
			t.Errorf("error %v does not match ErrQueueBusy", err)
		}
		if want := "interface eth0 queue 0 is already used by another AF_XDP socket; run onloadd to share it"; err.Error() != want {
			t.Errorf("error = %q\nwant %q", err, want)
		}
		// Another queue of the same device is free.
		other, err := vnic.OpenXDP(vnic.XDPConfig{Interface: "eth0", Queue: 1, FrameCount: 64, RingSize: 64})
		if err != nil {
			return err
		}
		other.Close()
		// A queue that does not exist, and an interface that does not.
		_, err = vnic.OpenXDP(vnic.XDPConfig{Interface: "eth0", Queue: 5, FrameCount: 64, RingSize: 64})
		if !errors.Is(err, xdp.ErrNoQueue) {
			t.Errorf("queue 5 of 2: %v, want ErrNoQueue", err)
		}
		_, err = vnic.OpenXDP(vnic.XDPConfig{Interface: "nosuch0", FrameCount: 64, RingSize: 64})
		if !errors.Is(err, xdp.ErrNoInterface) {
			t.Errorf("missing interface: %v, want ErrNoInterface", err)
		}
		// Closing frees the queue for the next owner.
		first.Close()
		again, err := vnic.OpenXDP(vnic.XDPConfig{Interface: "eth0", FrameCount: 64, RingSize: 64})
		if err != nil {
			return err
		}
		return again.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A configuration out of bounds is refused before anything is created,
// whether the NIC is opened or attached, with the field and its bounds.
func TestXDPConfigBounds(t *testing.T) {
	for _, tc := range []struct {
		cfg  vnic.XDPConfig
		want string
	}{
		{vnic.XDPConfig{Interface: "lo", FrameCount: 1}, "frame count 1: must be from 2 to"},
		{vnic.XDPConfig{Interface: "lo", FrameCount: vnic.MaxFrames + 1}, fmt.Sprintf("frame count %d: must be from 2 to %d", vnic.MaxFrames+1, vnic.MaxFrames)},
		{vnic.XDPConfig{Interface: "lo", FillDepth: -1}, "fill depth -1: must be at least 1"},
	} {
		if _, err := vnic.OpenXDP(tc.cfg); err == nil || !strings.Contains(err.Error(), "open xdp nic: "+tc.want) {
			t.Errorf("OpenXDP(%+v): %v, want an error saying %q", tc.cfg, err, tc.want)
		}
		if _, err := vnic.AttachXDP(-1, -1, tc.cfg); err == nil || !strings.Contains(err.Error(), "attach xdp nic: "+tc.want) {
			t.Errorf("AttachXDP(%+v): %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
}

// transmitLate transmits one UDP frame carrying payload from A to B with
// late kicks on: the frame waits on A's TX ring for its kick.
func transmitLate(t *testing.T, p vnictest.Pair, payload string) *vnic.XDP {
	t.Helper()
	x := p.A.(*vnic.XDP)
	x.SetLateKicks(true)
	sendUDP(t, x, p.AEnd, p.BEnd, payload)
	return x
}

// sendUDP transmits one UDP frame carrying payload from src to dst on
// from, taking back sent frames first if its pool has none free.
func sendUDP(t *testing.T, from vnic.NIC, src, dst pkt.Endpoint, payload string) {
	t.Helper()
	pl := from.Pool()
	h := pl.Alloc()
	if h == vnic.Null {
		from.Receive(nil) // takes back sent frames
		if h = pl.Alloc(); h == vnic.Null {
			t.Fatal("transmit: the pool has no free frame")
		}
	}
	n, err := pkt.UDP(pl.Buf(h), src, dst, []byte(payload))
	if err != nil {
		t.Fatal(err)
	}
	if err := pl.SetLen(h, n); err != nil {
		t.Fatal(err)
	}
	if sent, err := from.Transmit([]vnic.Handle{h}); sent != 1 || err != nil {
		t.Fatalf("transmit = %d, %v", sent, err)
	}
}

// awaitPayload waits up to 2 s for B to receive a frame carrying payload
// (after what).
func awaitPayload(t *testing.T, b vnic.NIC, payload, what string) {
	t.Helper()
	hs := make([]vnic.Handle, 8)
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(time.Millisecond) {
		if got := b.Receive(hs); got > 0 {
			if string(b.Pool().Data(hs[0])[42:]) != payload {
				t.Errorf("the peer received %q", b.Pool().Data(hs[0])[42:])
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer received nothing within 2s of %s", what)
		}
	}
}

// TestXDPLateKicks checks the doorbell a stack rings after its lock
// (vnic.LateKicker): with late kicks on, a transmit and a Receive leave
// the kick due rather than give it (the frame stays on the TX ring, the
// peer sees nothing), TakeKick takes it once, and KickUnlocked sends the
// frame.
func TestXDPLateKicks(t *testing.T) {
	test.RequireRoot(t)
	p := xdpPair(t, 64)
	x := transmitLate(t, p, "late kick")
	var none [0]vnic.Handle
	x.Receive(none[:]) // a poll must not kick either
	kicks := x.Stats().TxKicks
	hs := make([]vnic.Handle, 8)
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
		if got := p.B.Receive(hs); got > 0 {
			t.Fatalf("the peer received %d frames before the kick: the transmit kicked", got)
		}
		time.Sleep(time.Millisecond)
	}
	if pend := x.Socket().TX.Pending(); pend != 1 || !x.KickOwed() || x.Idle() {
		t.Fatalf("before the kick: %d frames on the TX ring, kick owed %v, idle %v; want 1, true, false", pend, x.KickOwed(), x.Idle())
	}
	if !x.TakeKick() {
		t.Fatal("TakeKick: no kick due after a transmit")
	}
	if x.TakeKick() {
		t.Fatal("TakeKick took the same kick twice")
	}
	if err := x.KickUnlocked(); err != nil {
		t.Fatal(err)
	}
	if got := x.Stats().TxKicks; got != kicks+1 {
		t.Errorf("TxKicks = %d, want %d", got, kicks+1)
	}
	awaitPayload(t, p.B, "late kick", "the kick")
}

// TestXDPDrain: a frame left on the TX ring without its kick (the kick
// taken by a thread that then did not give it, as one that left it to
// another's kick loop) goes out when Drain returns, and Drain says the
// ring is empty.
func TestXDPDrain(t *testing.T) {
	test.RequireRoot(t)
	p := xdpPair(t, 64)
	x := transmitLate(t, p, "drained")
	if !x.TakeKick() {
		t.Fatal("TakeKick: no kick due after a transmit")
	}
	if !x.Drain(time.Second) {
		t.Fatalf("Drain: %d frames left on the TX ring", x.Socket().TX.Pending())
	}
	if pend := x.Socket().TX.Pending(); pend != 0 {
		t.Fatalf("after Drain, %d frames on the TX ring", pend)
	}
	awaitPayload(t, p.B, "drained", "the drain")
}

// TestXDPLanes checks that Receive takes the frames the steering program
// sent to a lane (AddLane), that the lane's frames count as received and
// in the fill ring's accounting, and that a NIC has at most 15 lanes.
func TestXDPLanes(t *testing.T) {
	test.RequireRoot(t)
	p, steered, hosts := xdpPairSteered(t, 256)
	b := p.B.(*vnic.XDP)
	var lane, fd int
	err := hosts[1].Do(func() (err error) {
		lane, fd, err = b.AddLane()
		if err != nil {
			return err
		}
		if err := steered[1].Steering.SetLaneSocket(steered[1].Stack, lane, fd); err != nil {
			return err
		}
		return steered[1].Steering.SetLane(steered[1].Stack, bpf.Flow{Proto: bpf.UDP, Local: p.BEnd.Addr, Remote: p.AEnd.Addr}, lane, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	if lane != 1 || fd <= 0 || fd == b.FD() {
		t.Fatalf("AddLane = lane %d fd %d (the NIC's fd %d)", lane, fd, b.FD())
	}
	before, _ := steered[1].Steering.Counters()
	pa := p.A.Pool()
	hs := make([]vnic.Handle, 8)
	for i := range 4 {
		h := pa.Alloc()
		n, err := pkt.UDP(pa.Buf(h), p.AEnd, p.BEnd, []byte(fmt.Sprintf("lane %d", i)))
		if err != nil {
			t.Fatal(err)
		}
		pa.SetLen(h, n)
		if sent, err := p.A.Transmit([]vnic.Handle{h}); sent != 1 || err != nil {
			t.Fatalf("transmit = %d, %v", sent, err)
		}
	}
	got := 0
	for end := time.Now().Add(2 * time.Second); got < 4 && time.Now().Before(end); {
		if b.RxPending() == 0 && got == 0 {
			time.Sleep(time.Millisecond)
		}
		n := p.B.Receive(hs)
		for _, h := range hs[:n] {
			if want := fmt.Sprintf("lane %d", got); string(p.B.Pool().Data(h)[42:]) != want {
				t.Errorf("frame %d: %q, want %q", got, p.B.Pool().Data(h)[42:], want)
			}
			p.B.Pool().Free(h)
			got++
		}
	}
	after, _ := steered[1].Steering.Counters()
	if got != 4 || after.Sub(before)[bpf.CounterRedirectLane] != 4 {
		t.Fatalf("received %d of 4 frames, %d through the lane", got, after.Sub(before)[bpf.CounterRedirectLane])
	}
	if st := b.Stats(); st.RxFrames < 4 {
		t.Errorf("RxFrames = %d, want at least 4", st.RxFrames)
	}
	if !b.Idle() {
		t.Error("not idle with every frame received")
	}
	err = hosts[1].Do(func() error {
		for i := 2; i < 16; i++ {
			if _, _, err := b.AddLane(); err != nil {
				return fmt.Errorf("lane %d: %w", i, err)
			}
		}
		if _, _, err := b.AddLane(); err == nil {
			t.Error("a 16th lane was opened")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestXDPRxLane checks a NIC that receives through its lane
// (XDPConfig.RxLane): the steering program's frames come to RxFD, not the
// socket, and Receive takes them; a poll of RxFD leaves a frame waiting
// on the TX ring where it is (a poll of the socket, in copy mode, sends
// it: what the lane is for); and a second mapping of the NIC
// (AttachXDP, AttachRxLane, as a process of onloadd's stack has) receives
// through the same lane.
func TestXDPRxLane(t *testing.T) {
	test.RequireRoot(t)
	p, _, _ := xdpPairWith(t, vnic.XDPConfig{FrameCount: 256, RingSize: 256, FillDepth: 128, RxLane: true})
	a, b := p.A.(*vnic.XDP), p.B.(*vnic.XDP)
	if a.RxFD() == a.FD() || a.RxFD() <= 0 {
		t.Fatalf("RxFD %d, FD %d: want a lane of its own", a.RxFD(), a.FD())
	}
	// B to A: through A's lane, which turns readable.
	sendUDP(t, b, p.BEnd, p.AEnd, "to the lane")
	pfd := []unix.PollFd{{Fd: int32(a.RxFD()), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, 2000); n != 1 || err != nil {
		t.Fatalf("poll of RxFD = %d, %v: not readable with a frame sent to it", n, err)
	}
	if a.Socket().RX.Pending() != 0 {
		t.Error("the frame came to the socket's own RX ring, not the lane's")
	}
	awaitPayload(t, a, "to the lane", "a frame to A")

	// A to B, left on A's TX ring: a poll of the lane does not send it.
	transmitLate(t, p, "polled")
	pfd = []unix.PollFd{{Fd: int32(a.RxFD()), Events: unix.POLLIN | unix.POLLOUT}}
	unix.Poll(pfd, 0)
	hs := make([]vnic.Handle, 8)
	for end := time.Now().Add(200 * time.Millisecond); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if n := b.Receive(hs); n > 0 {
			t.Fatalf("B received %q after a poll of A's lane: the poll drove A's transmit", b.Pool().Data(hs[0])[42:])
		}
	}
	// The socket's own poll does (copy mode; a zero-copy driver's
	// wake-up would too): the frame was there to send.
	pfd[0].Fd = int32(a.FD())
	unix.Poll(pfd, 0)
	awaitPayload(t, b, "polled", "a poll of A's socket")

	// A second mapping, as onloadd's process has: its own descriptors,
	// the same rings.
	dup := func(fd int) int {
		t.Helper()
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	a2, err := vnic.AttachXDP(dup(a.Umem().FD()), dup(a.FD()), vnic.XDPConfig{Interface: "eth0", FrameCount: 256, RingSize: 256, FillDepth: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	if err := a2.AttachRxLane(dup(a.RxFD())); err != nil {
		t.Fatal(err)
	}
	if err := a2.AttachRxLane(dup(a.RxFD())); err == nil {
		t.Error("a second receive lane was attached")
	}
	sendUDP(t, b, p.BEnd, p.AEnd, "to the attached lane")
	awaitPayload(t, a2, "to the attached lane", "a frame to A's second mapping")
}

// TestXDPLaneStats checks that LaneStats reads the kernel's counters of
// the receive lane's socket, where the frames sent to a stack that does
// not take them are dropped: the socket's own counters see none of it
// (the stack dump printed those alone until 2026-12-07).
func TestXDPLaneStats(t *testing.T) {
	test.RequireRoot(t)
	p, _, _ := xdpPairWith(t, vnic.XDPConfig{FrameCount: 256, RingSize: 256, FillDepth: 64, RxLane: true})
	a, b := p.A.(*vnic.XDP), p.B.(*vnic.XDP)
	if st := a.LaneStats(); len(st) != 1 || st[0].RxDropped != 0 {
		t.Fatalf("LaneStats before = %+v; want the receive lane's, nothing dropped", st)
	}
	// More frames than A's fill ring has room for, none taken.
	const n = 160
	for range n {
		sendUDP(t, b, p.BEnd, p.AEnd, "x")
	}
	var lane uint64
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if st := a.LaneStats(); len(st) == 1 {
			if lane = st[0].RxDropped + st[0].RxRingFull; lane > 0 {
				break
			}
		}
	}
	own, err := a.Socket().Stats()
	if err != nil {
		t.Fatal(err)
	}
	if lane == 0 || own.RxDropped+own.RxRingFull != 0 {
		t.Fatalf("after %d frames to a fill ring of 64: the lane's socket dropped %d, the socket's own %d; want the lane's", n, lane, own.RxDropped+own.RxRingFull)
	}
	if s := a.Stats(); s.RxDropped < lane {
		t.Errorf("Stats().RxDropped = %d; want the lane's %d folded in", s.RxDropped, lane)
	}
}
