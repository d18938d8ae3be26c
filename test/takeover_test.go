package test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// takeoverNIC is the NIC configuration both processes use.
var takeoverNIC = vnic.XDPConfig{FrameCount: 4096, RingSize: 1024, FillDepth: 512}

// TestTakeover stalls the process that owns a stack in the middle of a
// connection and lets a second process (this test binary again) map the
// same image, UMEM and AF_XDP socket and poll: it must receive and
// acknowledge the data the kernel sends meanwhile. When it exits, the
// first process carries on as if it had polled itself: the data is in its
// socket, and the connection works.
func TestTakeover(t *testing.T) {
	a, b := Pair(t, LinkOptions{})
	nicCfg := takeoverNIC
	st, s := ourStackNIC(t, b.Iface0(), SteerConfig{NIC: nicCfg})
	stop := poller(s)

	var ln net.Listener
	if err := a.Do(func() (err error) { ln, err = net.Listen("tcp", a.Iface0().Addr().String()+":5400"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if k, err := ln.Accept(); err == nil {
			accepted <- k
		}
	}()
	id, _ := s.Open(stack.TCP)
	s.Connect(id, netip.AddrPortFrom(a.Iface0().Addr(), 5400))
	c := stackConn{s, id}
	if !c.waitEvent(stack.Writable, 5*time.Second) {
		t.Fatalf("not connected: %s", s.DumpSocket(id))
	}
	k := (<-accepted).(*net.TCPConn)
	defer k.Close()

	// The owner stalls: nobody polls. The kernel sends.
	stop()
	payload := random(100<<10, 99)
	wrote := make(chan error, 1)
	go func() { _, err := k.Write(payload); wrote <- err }()
	time.Sleep(50 * time.Millisecond)
	if unacked(t, k) == 0 {
		t.Fatal("the kernel's data was acknowledged while nobody polled")
	}

	// A second process takes over.
	files := make([]*os.File, 3)
	for i, fd := range []int{st.NIC.Umem().FD(), st.NIC.FD(), s.Image().FD()} {
		d, err := unix.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = os.NewFile(uintptr(d), "fd")
		defer files[i].Close()
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTakeoverHelper$")
	cmd.Env = append(os.Environ(), "TAKEOVER_HELPER=1", "TAKEOVER_IFACE="+b.Iface0().Name)
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	t.Logf("second process: %s", bytes.TrimSpace(out))
	if err != nil {
		t.Fatalf("second process: %v", err)
	}
	if n := unacked(t, k); n != 0 {
		t.Fatalf("after the second process polled, the kernel still has %d unacknowledged segments", n)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}

	// The owner resumes and finds the data in its socket.
	defer poller(s)()
	got := make([]byte, 0, len(payload))
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < len(payload) && time.Now().Before(deadline) {
		n, err := s.Recv(id, buf, false)
		if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("owner read %d bytes after the takeover, want %d", len(got), len(payload))
	}
	// And the connection goes on.
	if err := c.writeAll([]byte("carrying on"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	k.SetReadDeadline(time.Now().Add(5 * time.Second))
	reply := make([]byte, 11)
	if _, err := k.Read(reply); err != nil || string(reply) != "carrying on" {
		t.Fatalf("kernel read %q, %v", reply, err)
	}
}

// unacked is the number of segments the kernel's connection has in flight.
func unacked(t *testing.T, k *net.TCPConn) uint32 {
	raw, err := k.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
	if err != nil {
		t.Fatal(err)
	}
	return info.Unacked
}

// TestTakeoverHelper is the second process of TestTakeover: it maps the
// stack from fds 3 (UMEM), 4 (AF_XDP socket) and 5 (image), polls for a
// while, and exits.
func TestTakeoverHelper(t *testing.T) {
	if os.Getenv("TAKEOVER_HELPER") == "" {
		t.Skip("helper process for TestTakeover")
	}
	err := func() error {
		cfg := takeoverNIC
		cfg.Interface = os.Getenv("TAKEOVER_IFACE")
		nic, err := vnic.AttachXDP(3, 4, cfg)
		if err != nil {
			return err
		}
		img, err := stack.AttachImage(5)
		if err != nil {
			return err
		}
		s := stack.Attach(img, nic, stack.Options{})
		frames := 0
		for end := time.Now().Add(time.Second); time.Now().Before(end); {
			frames += s.Poll()
		}
		c := s.Counters()
		fmt.Printf("pid %s polled %d frames; stack counters now %s\n", strconv.Itoa(os.Getpid()), frames, &c)
		if frames == 0 {
			return errors.New("took no frames")
		}
		return nil
	}()
	if err != nil {
		fmt.Println("takeover:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
