package xdp_test

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/test"
	"github.com/xdp-onload/onload/xdp"
)

func TestUmemConfigErrors(t *testing.T) {
	for name, cfg := range map[string]xdp.UmemConfig{
		"frame size 1000":   {FrameSize: 1000},
		"frame size 3000":   {FrameSize: 3000},
		"frame size 1 MiB":  {FrameSize: 1 << 20},
		"negative count":    {FrameCount: -1},
		"too many frames":   {FrameCount: 1<<20 + 1},
		"headroom too big":  {Headroom: 2000},
		"negative metadata": {MetaSize: -1},
	} {
		if u, err := xdp.NewUmem(cfg); err == nil {
			u.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestUmemShared checks that a second mapping of the memfd, as another
// process given the fd would make, sees the same frames and metadata.
func TestUmemShared(t *testing.T) {
	u, err := xdp.NewUmem(xdp.UmemConfig{FrameCount: 16, MetaSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	copy(u.Frames()[2048*3:], "frame three")
	copy(u.Meta(), "meta")
	dup, err := unix.Dup(u.FD())
	if err != nil {
		t.Fatal(err)
	}
	v, err := xdp.OpenUmem(dup, u.Config())
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if string(v.Frames()[2048*3:2048*3+11]) != "frame three" || string(v.Meta()[:4]) != "meta" {
		t.Error("second mapping does not see the first one's bytes")
	}
	copy(v.Frames(), "written by the second")
	if string(u.Frames()[:21]) != "written by the second" {
		t.Error("first mapping does not see the second one's writes")
	}
	bigger := u.Config()
	bigger.FrameCount = 32
	if _, err := xdp.OpenUmem(dup, bigger); err == nil {
		t.Error("OpenUmem accepted a configuration larger than the memfd")
	}
}

func passProgram(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.XDP,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 2), // XDP_PASS
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestAttach(t *testing.T) {
	test.RequireRoot(t)
	a, _ := test.Pair(t, test.LinkOptions{})
	prog := passProgram(t)
	err := a.Do(func() error {
		att, err := xdp.Attach(prog, "eth0", xdp.AttachAuto)
		if err != nil {
			return err
		}
		if att.Mode != xdp.AttachNative || att.NativeErr != nil {
			t.Errorf("veth: mode %v (%v), want native", att.Mode, att.NativeErr)
		}
		// A second program on the same interface: a clear sentence.
		_, err = xdp.Attach(prog, "eth0", xdp.AttachAuto)
		if !errors.Is(err, xdp.ErrProgramAttached) {
			t.Errorf("second attach: %v, want ErrProgramAttached", err)
		}
		if err := att.Close(); err != nil {
			return err
		}
		// Detached: the interface is free again, in generic mode too.
		g, err := xdp.Attach(prog, "eth0", xdp.AttachGeneric)
		if err != nil {
			return err
		}
		if g.Mode != xdp.AttachGeneric {
			t.Errorf("mode %v, want generic", g.Mode)
		}
		if err := g.Close(); err != nil {
			return err
		}
		_, err = xdp.Attach(prog, "nosuch0", xdp.AttachAuto)
		if !errors.Is(err, xdp.ErrNoInterface) {
			t.Errorf("missing interface: %v, want ErrNoInterface", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSocketBasics checks what a socket says about itself and its
// lifecycle errors.
func TestSocketBasics(t *testing.T) {
	test.RequireRoot(t)
	a, _ := test.Pair(t, test.LinkOptions{})
	err := a.Do(func() error {
		u, err := xdp.NewUmem(xdp.UmemConfig{FrameCount: 64})
		if err != nil {
			return err
		}
		defer u.Close()
		s, err := xdp.Open(u, xdp.Config{Interface: "eth0", RxSize: 64, TxSize: 64, FillSize: 64, CompletionSize: 64})
		if err != nil {
			return err
		}
		if s.ZeroCopy() {
			t.Error("veth reported zero-copy")
		}
		if s.Interface().Name != "eth0" || s.Queue() != 0 || s.FD() <= 0 {
			t.Errorf("socket describes itself as %+v queue %d fd %d", s.Interface(), s.Queue(), s.FD())
		}
		if _, err := s.Stats(); err != nil {
			t.Errorf("stats: %v", err)
		}
		if err := u.Close(); err == nil {
			t.Error("umem closed while a socket uses it")
		}
		if err := s.Close(); err != nil {
			return err
		}
		if err := s.Close(); err != nil {
			t.Errorf("second close: %v", err)
		}
		_, err = xdp.Open(u, xdp.Config{Interface: "eth0", RxSize: 100})
		if err == nil {
			t.Error("ring size 100 accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// redirectProgram redirects every frame to slot 0 of an XSKMAP holding fd
// (XDP_PASS if the slot is empty).
func redirectProgram(t *testing.T, fd int) *ebpf.Program {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if err := m.Put(uint32(0), uint32(fd)); err != nil {
		t.Fatalf("put the socket in the xskmap: %v", err)
	}
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.XDP,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Imm(asm.R2, 0),
			asm.Mov.Imm(asm.R3, 2), // XDP_PASS if the slot is empty
			asm.FnRedirectMap.Call(),
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// TestLane checks that a lane receives the frames redirected to it into
// frames of its primary's fill ring, and that the primary's own RX ring
// sees none of them.
func TestLane(t *testing.T) {
	test.RequireRoot(t)
	a, b := test.Pair(t, test.LinkOptions{})
	err := a.Do(func() error {
		u, err := xdp.NewUmem(xdp.UmemConfig{FrameCount: 64})
		if err != nil {
			return err
		}
		defer u.Close()
		p, err := xdp.Open(u, xdp.Config{Interface: "eth0", RxSize: 64, TxSize: 64, FillSize: 64, CompletionSize: 64})
		if err != nil {
			return err
		}
		defer p.Close()
		if _, err := xdp.OpenLane(p, 100); err == nil {
			t.Error("a lane with a ring of 100 entries was opened")
		}
		l, err := xdp.OpenLane(p, 64)
		if err != nil {
			return err
		}
		defer l.Close()
		if !l.Lane() || p.Lane() || l.Queue() != p.Queue() || l.FD() == p.FD() {
			t.Errorf("lane %v queue %d fd %d beside primary %v queue %d fd %d", l.Lane(), l.Queue(), l.FD(), p.Lane(), p.Queue(), p.FD())
		}
		att, err := xdp.Attach(redirectProgram(t, l.FD()), "eth0", xdp.AttachNative)
		if err != nil {
			return err
		}
		defer att.Close()
		given := map[uint64]bool{}
		idx, got := p.Fill.Reserve(32)
		for i := range got {
			addr := uint64(i+8) * 2048
			p.Fill.Set(idx+i, addr)
			given[addr] = true
		}
		p.Fill.Submit()
		// Any frame b sends (its ARP request for a's address first)
		// reaches the lane.
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			b.Do(func() error {
				c, err := net.Dial("udp4", net.JoinHostPort(a.Iface0().Addr().String(), "9"))
				if err == nil {
					c.Write([]byte("lane"))
					c.Close()
				}
				return nil
			})
			if l.RX.Pending() > 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		idx, n := l.RX.Peek(64)
		if n == 0 {
			t.Fatal("no frame reached the lane in 3 s")
		}
		for i := range n {
			if d := l.RX.Get(idx + i); !given[d.Addr&^2047] || d.Len == 0 {
				t.Errorf("the lane received %d bytes at %#x, not a frame of the primary's fill ring", d.Len, d.Addr)
			}
		}
		l.RX.Release()
		if p.RX.Pending() != 0 {
			t.Errorf("the primary's RX ring has %d frames; all went to the lane", p.RX.Pending())
		}
		l.Resync()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
