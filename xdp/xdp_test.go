package xdp_test

import (
	"errors"
	"testing"

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
