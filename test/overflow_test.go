package test

import (
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdp-onload/onload/sockets"
)

// TestSocketTableOverflow: a listener whose stack has fewer sockets than
// the clients that connect serves every one of them. Once the table is
// nearly full of live connections, the steering program gives new ones
// to the listener's kernel half (stack.Options.Overflow,
// bpf.Control.SetFull), and Accept returns them as kernel connections;
// once connections close, new ones come back to the stack. Without the
// overflow, the clients past the table's end were reset or never
// answered.
func TestSocketTableOverflow(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	cfg, err := sockets.DefaultConfig(sockets.Balanced)
	if err != nil {
		t.Fatal(err)
	}
	const table, clients = 32, 80
	cfg.Sockets = table
	s := ourSocketsConfig(t, b, cfg)
	ln, err := ourListener(b, s)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, ok := ln.(*sockets.TCPListener); !ok {
		t.Fatalf("the listener is %T, not accelerated", ln)
	}
	var ours, kernel atomic.Int32
	var served sync.WaitGroup
	go func() {
		for {
			var c net.Conn
			if err := b.Do(func() (err error) { c, err = ln.Accept(); return }); err != nil {
				return
			}
			if _, ok := c.(*sockets.TCPConn); ok {
				ours.Add(1)
			} else {
				kernel.Add(1)
			}
			served.Add(1)
			go func() {
				defer served.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()

	// Every client connects and is answered while all the others stay
	// connected.
	round := func(n int) []net.Conn {
		t.Helper()
		conns := make([]net.Conn, 0, n)
		for i := range n {
			var c net.Conn
			err := a.Do(func() (err error) {
				c, err = net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
				return
			})
			if err != nil {
				t.Fatalf("client %d of %d: %v", i+1, n, err)
			}
			conns = append(conns, c)
			msg := fmt.Sprintf("client %d\n", i)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, msg); err != nil {
				t.Fatalf("client %d: write: %v", i+1, err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
				t.Fatalf("client %d: read %q, %v: want the echo %q", i+1, got, err, msg)
			}
		}
		// Each still works once they all are connected.
		for i, c := range conns {
			msg := fmt.Sprintf("again %d\n", i)
			io.WriteString(c, msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || string(got) != msg {
				t.Fatalf("client %d, with all %d connected: read %q, %v: want %q", i+1, n, got, err, msg)
			}
		}
		return conns
	}
	conns := round(clients)
	if ours.Load() == 0 || kernel.Load() == 0 || int(ours.Load()) >= table {
		t.Errorf("%d connections on the stack, %d on the kernel: want some on each, fewer than the table's %d on the stack",
			ours.Load(), kernel.Load(), table)
	}
	t.Logf("%d clients: %d on the stack (table of %d), %d on the kernel", clients, ours.Load(), table, kernel.Load())
	c := s.Engine().Counters()
	if c.SocketsOverflow == 0 {
		t.Errorf("SocketsOverflow is 0: the table never counted as full")
	}

	// With the connections gone, new ones are accelerated again.
	for _, c := range conns {
		c.Close()
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.Engine().Overflow() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.Engine().Overflow() {
		t.Fatalf("the stack still counts as full 10 s after every client closed (%d sockets in use)", s.Engine().InUse())
	}
	before := ours.Load()
	for _, c := range round(4) {
		c.Close()
	}
	if got := ours.Load() - before; got != 4 {
		t.Errorf("after the table emptied, %d of 4 new connections were accelerated", got)
	}
}
