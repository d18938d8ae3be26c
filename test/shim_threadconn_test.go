package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// leftForThreads is the shim's log line of a process that left the stack
// for a thread a connection (wait.c, lone_leave); leftCounts reads its
// counts, handedOverAlone is the line of each connection its thread
// handed over, and acceptedByKernel that of one accepted from the
// listener's kernel socket.
const (
	leftForThreads   = "threads blocked at once, each on one connection of its own (a server of a thread a connection)"
	handedOverAlone  = "handed over to the kernel for a thread a connection"
	acceptedByKernel = "a connection from the listener's kernel socket: the kernel's"
)

var leftCounts = regexp.MustCompile(`listeners whose ports went to their kernel sockets: (\d+); left accelerated: (\d+)`)

// TestShimThreadAConnection: a program with a thread a connection, each
// blocked in a read (or a poll) of its own connection, is slower on the
// stack than on the kernel (each block and wake-up costs more:
// test/bench/threadsrv read 0.37-0.48 of the kernel in make bench). Once
// ONLOAD_BLOCKED_THREADS (8) of its threads are blocked at once, the
// process's connections go to the kernel, in the middle of their traffic
// and with threads blocked on them, and its listeners' ports go to their
// kernel sockets.
//
// shim/test/threadconn.c, a client of 16 threads each echoing 300
// messages of up to 3,000 bytes through a connection of its own, reads
// every echo whole and in order, as on the kernel, and leaves the stack
// (with blocking reads, and with a poll of the one connection before
// each); with 4 threads, or ONLOAD_BLOCKED_THREADS=0, it stays on the
// stack. test/bench/threadsrv under the shim, standalone and on a stack
// from onloadd, 16 clients of 100 requests each: every response
// byte-exact, and the listener's port goes to the kernel, which serves a
// client that comes after.
func TestShimThreadAConnection(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "threadconn")
	a, b, ln := echoHosts(t)
	addr, port := b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	for _, c := range []struct {
		threads string
		env     []string
		extra   []string
		leaves  bool
	}{
		{"16", nil, nil, true},
		{"16", nil, []string{"poll"}, true},
		{"4", nil, nil, false},
		{"16", []string{"ONLOAD_BLOCKED_THREADS=0"}, nil, false},
	} {
		args := append([]string{addr, port, c.threads, "300"}, c.extra...)
		name := fmt.Sprintf("%v %v", args[2:], c.env)
		want := c.threads + " threads: every message echoed\n"
		kernel, _ := runBounded(t, a.Command(prog, args...), 60*time.Second)
		shim, log := runBounded(t, shimCommand(t, a, c.env, prog, args...), 60*time.Second)
		if kernel != want || shim != want {
			t.Fatalf("%s: under the shim it printed:\n%s\non the kernel:\n%s\nshim's log:\n%s", name, shim, kernel, log)
		}
		requireAccelerated(t, log, "connecting")
		left := strings.Contains(log, leftForThreads)
		if left != c.leaves {
			t.Fatalf("%s: the process left the stack: %v, want %v; shim's log:\n%s", name, left, c.leaves, log)
		}
		// Each thread hands its connection over as it next waits on it:
		// at least half of them wait again after the 8th blocks.
		if n := strings.Count(log, handedOverAlone); left && n < 8 {
			t.Fatalf("%s: %d connections handed over, want 8 or more; shim's log:\n%s", name, n, log)
		} else if left {
			t.Logf("%s: %d connections handed over", name, n)
		}
	}

	// A server, standalone and on a stack from onloadd.
	threadsrvLeaves(t, a, b, "8097", nil)
	sock, _, dlog, _ := startOnloaddCommand(t, a)
	threadsrvLeaves(t, a, b, "8098", []string{"ONLOAD_DAEMON=require", "ONLOAD_DAEMON_SOCKET=" + sock,
		"ONLOAD_INTERFACE=" + a.Iface0().Name})
	if t.Failed() {
		t.Logf("onloadd:\n%s", dlog.String())
	}
}

// threadsrvLeaves runs test/bench/threadsrv under the shim (env) in host
// a on port, with 16 clients from host b of 100 requests each and then
// one more each: every response byte-exact, the process leaves the stack
// (its listener's port and every connection to the kernel: handed over by
// its thread, or accepted from the kernel's socket once the port went
// there), and one more client after is served.
func threadsrvLeaves(t *testing.T, a, b *Host, port string, env []string) {
	t.Helper()
	srvBin, err := filepath.Abs("../bin/threadsrv")
	if err != nil {
		t.Fatal(err)
	}
	srv := shimCommand(t, a, env, srvBin, port)
	var log SyncBuffer
	srv.Stdout, srv.Stderr = &log, &log
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer stopGroup(srv)
	// Until its listener is the stack's (up to 5 s): a client that came
	// before would be the kernel's from its start.
	for i := 0; i < 50 && !strings.Contains(log.String(), "listening, accelerated"); i++ {
		time.Sleep(100 * time.Millisecond)
	}
	requireAccelerated(t, log.String(), "listening")
	target := net.JoinHostPort(a.Iface0().Addr().String(), port)
	const clients, requests = 16, 100
	conns := make([]net.Conn, 0, clients+1)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(n int) error {
		return b.Do(func() error {
			for i := 0; i < n; i++ {
				c, err := net.DialTimeout("tcp", target, 5*time.Second)
				if err != nil {
					return err
				}
				conns = append(conns, c)
			}
			return nil
		})
	}
	if err := dial(clients); err != nil {
		t.Fatalf("%v: dial threadsrv: %v\nserver:\n%s", env, err, log.String())
	}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := threadsrvRequests(c, requests); err != nil {
				errs <- fmt.Errorf("client %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%v: %v\nserver:\n%s", env, err, log.String())
	}
	// One more request on each connection: a thread blocked since before
	// the process left the stack wakes for it, and hands its connection
	// over as it waits again.
	for i, c := range conns {
		if err := threadsrvRequests(c, 1); err != nil {
			t.Fatalf("%v: client %d, its last request: %v\nserver:\n%s", env, i, err, log.String())
		}
	}
	// Each connection is the kernel's then: handed over by its thread, or
	// accepted from the listener's kernel socket (one that came after the
	// port went there).
	onKernel := func() int {
		l := log.String()
		return strings.Count(l, handedOverAlone) + strings.Count(l, acceptedByKernel)
	}
	for i := 0; i < 50 && onKernel() < clients; i++ { // up to 5 s
		time.Sleep(100 * time.Millisecond)
	}
	// One more client, after: the listener's kernel socket serves it.
	if err := dial(1); err != nil {
		t.Fatalf("%v: dial threadsrv after: %v\nserver:\n%s", env, err, log.String())
	}
	if err := threadsrvRequests(conns[clients], 10); err != nil {
		t.Fatalf("%v: the client after: %v\nserver:\n%s", env, err, log.String())
	}
	l := log.String()
	m := leftCounts.FindStringSubmatch(l)
	n := strings.Count(l, handedOverAlone)
	if !strings.Contains(l, leftForThreads) || m == nil || m[1] != "1" || m[2] != "0" || onKernel() != clients+1 {
		t.Fatalf("%v: threadsrv did not leave the stack, its listener's port and all %d connections to the kernel (%d handed over, %d accepted from the kernel's socket); its log:\n%s",
			env, clients+1, n, onKernel()-n, l)
	}
	t.Logf("threadsrv %v: %d connections handed over, %d accepted from the listener's kernel socket", env, n, onKernel()-n)
}

// threadsrvRequests sends n requests on c, one at a time, and checks each
// response whole: test/bench/threadsrv's 200 with a body of 1,024 'x'.
func threadsrvRequests(c net.Conn, n int) error {
	body := bytes.Repeat([]byte("x"), 1024)
	want := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n%s", len(body), body)
	r := bufio.NewReader(c)
	got := make([]byte, len(want))
	for i := 0; i < n; i++ {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if _, err := io.ReadFull(r, got); err != nil {
			return fmt.Errorf("response %d: %w", i, err)
		}
		if string(got) != want {
			return fmt.Errorf("response %d differs: %q", i, got)
		}
	}
	return nil
}
