package test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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

// takeoverBytes is how much the second process must carry each way.
const takeoverBytes = 1 << 20

// TestTakeover stops the process that owns a stack in the middle of a
// connection (its poller stops; nothing of it touches the stack again
// until the second process is done) and lets a second process (this test
// binary again) map the same image, UMEM and AF_XDP socket and carry the
// connection: it reads a mebibyte the kernel sends and sends a mebibyte
// back, both byte-exact, through the owner's socket. When it exits, the
// owner carries on as if it had done that itself: the connection works
// both ways.
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
	k.SetDeadline(time.Now().Add(30 * time.Second))

	// The owner stops: nobody polls. The kernel sends, and expects as
	// much back.
	stop()
	toUs, fromUs := random(takeoverBytes, 99), random(takeoverBytes, 98)
	wrote := make(chan error, 1)
	go func() { _, err := k.Write(toUs); wrote <- err }()
	read := make(chan error, 1)
	go func() {
		got := make([]byte, len(fromUs))
		_, err := io.ReadFull(k, got)
		if err == nil && !bytes.Equal(got, fromUs) {
			err = fmt.Errorf("the kernel read %d bytes that differ from what the second process sent, from byte %d", len(got), firstDiff(got, fromUs))
		}
		read <- err
	}()
	time.Sleep(50 * time.Millisecond)
	if tcpInfo(t, k).Unacked == 0 {
		t.Fatal("the kernel's data was acknowledged while nobody polled")
	}

	// A second process takes over and carries the connection.
	files := make([]*os.File, 3)
	for i, fd := range []int{st.NIC.Umem().FD(), st.NIC.FD(), s.Image().FD()} {
		d, err := unix.Dup(fd)
		if err != nil {
			t.Fatal(err)
		}
		files[i] = os.NewFile(uintptr(d), "fd")
		defer files[i].Close()
	}
	// In host b's namespace, as a process on that host would be: the
	// interface's name means the same there.
	cmd := exec.Command("ip", "netns", "exec", b.NS, os.Args[0], "-test.run=^TestTakeoverHelper$")
	cmd.Env = append(os.Environ(), "TAKEOVER_HELPER=1", "TAKEOVER_IFACE="+b.Iface0().Name,
		"TAKEOVER_SOCK="+strconv.FormatUint(uint64(id), 10))
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	t.Logf("second process: %s", bytes.TrimSpace(out))
	if err != nil {
		t.Fatalf("second process: %v", err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the kernel's write: %v", err)
	}
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the kernel did not get the second process's mebibyte")
	}
	if n := tcpInfo(t, k).Unacked; n != 0 {
		t.Fatalf("after the second process, the kernel still has %d unacknowledged segments", n)
	}

	// The owner resumes, and the connection goes on both ways.
	defer poller(s)()
	if err := c.writeAll([]byte("carrying on"), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 11)
	if _, err := io.ReadFull(k, reply); err != nil || string(reply) != "carrying on" {
		t.Fatalf("kernel read %q, %v", reply, err)
	}
	if _, err := k.Write([]byte("and back")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 0, 8)
	buf := make([]byte, 64)
	for deadline := time.Now().Add(5 * time.Second); len(got) < 8 && time.Now().Before(deadline); {
		n, err := s.Recv(id, buf, false)
		if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "and back" {
		t.Fatalf("owner read %q after the takeover, want %q (%s)", got, "and back", s.DumpSocket(id))
	}
}

// TestTakeoverHelper is the second process of TestTakeover: it maps the
// stack from fds 3 (UMEM), 4 (AF_XDP socket) and 5 (image) and carries
// the owner's connection (TAKEOVER_SOCK): it reads takeoverBytes and
// checks them, and sends takeoverBytes, polling the stack itself.
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
		n, err := strconv.ParseUint(os.Getenv("TAKEOVER_SOCK"), 10, 32)
		if err != nil {
			return fmt.Errorf("TAKEOVER_SOCK: %w", err)
		}
		id := stack.SockID(n)
		s := stack.Attach(img, nic, stack.Options{})
		want, toSend := random(takeoverBytes, 99), random(takeoverBytes, 98)
		got := make([]byte, 0, len(want))
		buf := make([]byte, 64<<10)
		sent := 0
		for end := time.Now().Add(20 * time.Second); len(got) < len(want) || sent < len(toSend); {
			if time.Now().After(end) {
				ks, _ := nic.Socket().Stats()
				return fmt.Errorf("read %d and sent %d of %d bytes each way in 20s: %s\nnic %+v\nxsk %+v tx pending %d completion pending %d", len(got), sent, takeoverBytes, s.DumpSocket(id), nic.Stats(), ks, nic.Socket().TX.Pending(), nic.Socket().Completion.Pending())
			}
			if sent < len(toSend) {
				k, err := s.Send(id, toSend[sent:])
				if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
					return fmt.Errorf("send after %d bytes: %w", sent, err)
				}
				sent += k
			}
			k, err := s.Recv(id, buf, false) // polls when nothing is queued
			if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
				return fmt.Errorf("recv after %d bytes: %w", len(got), err)
			}
			if k == 0 && err == nil {
				return fmt.Errorf("end of stream after %d bytes", len(got))
			}
			got = append(got, buf[:k]...)
			s.Poll()
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("read %d bytes that differ from the kernel's from byte %d", len(got), firstDiff(got, want))
		}
		// Until the kernel has acknowledged what we sent, it may need
		// retransmitting: poll until the socket's send queue is empty.
		for end := time.Now().Add(5 * time.Second); ; s.Poll() {
			if info, err := s.TCPInfo(id); err == nil && info.Queued == 0 {
				break
			}
			if time.Now().After(end) {
				return fmt.Errorf("the kernel did not acknowledge all of it: %s", s.DumpSocket(id))
			}
		}
		// Our ACK of the kernel's last segment may be a delayed one: a
		// read on a connection that answers leaves it for the answer.
		// Poll past the delayed-ACK time (40 ms), as a process whose
		// stack's timers run would.
		for end := time.Now().Add(100 * time.Millisecond); time.Now().Before(end); {
			s.Poll()
		}
		c := s.Counters()
		fmt.Printf("pid %d read %d bytes and sent %d through the owner's connection; stack counters now %s\n", os.Getpid(), len(got), sent, &c)
		return nil
	}()
	if err != nil {
		fmt.Println("takeover:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
