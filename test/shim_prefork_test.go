package test

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xdp-onload/onload/control"
)

// TestShimPreforkLateWorker runs shim/test/prefork.c as a cluster (a stack
// for each worker from onloadd, on a queue each of a two-queue veth): a
// pre-fork server whose second worker has its stack but listens on the
// socket it inherited only later, as a worker slow to start. Connections
// that come on the late worker's queue meanwhile are held for it (onloadd
// holds a member's queue until it listens, a second at most: their SYNs
// are dropped and sent again): each is the late worker's stack's, where
// it was the kernel's for its life. A worker that listens after the hold
// has ended gets no connection of the kernel's either way: those that
// came on its queue after the hold are the kernel's, served. A worker
// that has come to onloadd and has no stack yet as the port is made is
// held for too (its stack, made later, has the first free queue).
func TestShimPreforkLateWorker(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "prefork")
	a, b := Pair(t, LinkOptions{Queues: 2})
	qs, err := NewQueueSteer(b, b.Iface0().Name)
	if err != nil {
		Missing(t, "cannot spread host b's connections over the queues here (TCX egress): %v", err)
	}
	t.Cleanup(func() { qs.Close() })
	dir, _ := daemonDir(t)
	sock, _ := startDaemon(t, a, dir)
	for _, tc := range []struct {
		name   string
		port   int
		delay  time.Duration // the late worker's, after its stack is made (or its hello)
		inHold bool          // it listens within the hold
		early  bool          // it has said hello to onloadd, and has no stack yet, as worker 0 listens
	}{
		{"within the hold", 7610, 400 * time.Millisecond, true, false},
		{"after the hold", 7620, 2500 * time.Millisecond, false, false},
		{"hello, no stack yet", 7630, 400 * time.Millisecond, true, true},
	} {
		if err := qs.Spread(uint16(tc.port), 2); err != nil {
			t.Fatal(err)
		}
		env := []string{"ONLOAD_DAEMON=require", "ONLOAD_DAEMON_SOCKET=" + sock, "ONLOAD_INTERFACE=" + a.Iface0().Name,
			"ONLOAD_STACK_NAME=pf" + tc.name[:1], "ONLOAD_CLUSTER=1"}
		args := []string{fmt.Sprint(tc.port), fmt.Sprint(tc.delay.Milliseconds())}
		said := "stack 1"
		if tc.early {
			args, said = append(args, "early"), "hello 1"
		}
		cmd := shimCommand(t, a, env, prog, args...)
		stdin, stdout, log := startPiped(t, cmd)
		next := lineReader(t, stdout, "prefork", log, 10*time.Second)
		seen := map[string]bool{}
		for len(seen) < 3 {
			l := next("listening, worker 0 ready and worker 1's " + said)
			seen[l] = true
			if l != "listening" && l != "ready 0" && l != said {
				t.Fatalf("%s: prefork said %q:\n%s", tc.name, l, log.String())
			}
		}
		start := time.Now()
		// Worker 1's stack is the one that listens on PORT+1 (whichever
		// asked first has queue 0), or the queue worker 0's is not.
		d := dumpDaemon(t, sock)
		late := -1
		for _, st := range d.Stacks {
			f := strings.Join(st.Filters, " ")
			if !tc.early && strings.Contains(f, fmt.Sprintf(":%d", tc.port+1)) || tc.early && strings.Contains(f, fmt.Sprintf(":%d", tc.port)) {
				late = st.Queue
			}
		}
		if tc.early && late >= 0 {
			late = 1 - late
		}
		if late < 0 {
			t.Fatalf("%s: no stack listens on worker 1's own port %d: %+v", tc.name, tc.port+1, d.Stacks)
		}
		if cl, want := strings.Join(d.Interfaces[0].Clusters, "; "), fmt.Sprintf("queue %d held", late); !strings.Contains(cl, want) {
			t.Errorf("%s: the cluster's ports read %q; want %s, for worker 1", tc.name, cl, want)
		}
		// Four connections on each queue, made at once: worker 1 does not
		// listen yet.
		var ports []int
		for p, n := 41000, [2]int{}; n[0] < 4 || n[1] < 4; p += 2 {
			if q := SpreadQueue(uint16(p), 2); n[q] < 4 {
				n[q]++
				ports = append(ports, p)
			}
		}
		addr := netip.AddrPortFrom(a.Iface0().Addr(), uint16(tc.port)).String()
		var wg sync.WaitGroup
		answers := make([]string, len(ports))
		took := make([]time.Duration, len(ports))
		errs := make([]error, len(ports))
		for i, p := range ports {
			wg.Go(func() {
				answers[i], errs[i] = askPrefork(b, addr, p, i)
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		for i, p := range ports {
			q, want := SpreadQueue(uint16(p), 2), byte('0')
			if q == late && tc.inHold {
				want = '1'
			}
			switch {
			case errs[i] != nil:
				t.Errorf("%s: connection %d (queue %d): %v", tc.name, i, q, errs[i])
			case answers[i][0] != want:
				t.Errorf("%s: connection %d on queue %d (worker 1's: %d) answered by worker %c; want worker %c", tc.name, i, q, late, answers[i][0], want)
			case q != late && took[i] > 500*time.Millisecond:
				t.Errorf("%s: connection %d on worker 0's queue took %v", tc.name, i, took[i])
			}
		}
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("%s: prefork: %v\n%s", tc.name, err, log.String())
		}
		out := log.String()
		requireAccelerated(t, out, "listening")
		// The next case's workers need the queues: its stacks go once
		// their connections have.
		for deadline := time.Now().Add(5 * time.Second); len(dumpDaemon(t, sock).Stacks) > 0 && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond)
		}
		kernels := strings.Count(out, "a connection from the listener's kernel socket")
		t.Logf("%s: connections by queue answered in %v; %d the kernel's", tc.name, took, kernels)
		if tc.inHold && kernels != 0 {
			t.Errorf("%s: %d connections were the kernel's; want none, each held for its worker:\n%s", tc.name, kernels, out)
		}
		if !tc.inHold && kernels != 4 {
			t.Errorf("%s: %d connections were the kernel's; want worker 1's queue's 4, which came after the hold:\n%s", tc.name, kernels, out)
		}
	}
}

// askPrefork connects from host h's port to prefork at addr with request
// i: the answer (the worker's number, then the request).
func askPrefork(h *Host, addr string, port, i int) (string, error) {
	c, err := dialFromPort(h, port, addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req := fmt.Sprintf("req%05d", i)
	if _, err := c.Write([]byte(req)); err != nil {
		return "", err
	}
	buf := make([]byte, 9)
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		if err != nil {
			return "", fmt.Errorf("after %q: %w", buf[:n], err)
		}
		n += m
	}
	if string(buf[1:]) != req {
		return "", fmt.Errorf("answer %q to %q", buf, req)
	}
	return string(buf), nil
}

// TestShimPreforkOneStack runs shim/test/prefork.c through onloadd run
// without -n, on a one-queue veth: the master's two workers share one
// stack from onloadd, the command's own (control.RunStackName), each of
// them accelerated, and every connection is answered. Until 2026-12-07
// each worker asked for a stack of its own: the first took the queue and
// with it every connection, the second stayed on the kernel with none
// (apache's event MPM, its one accelerated process overloaded, then
// closed kept-alive connections: thousands of wrk's read errors).
func TestShimPreforkOneStack(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "prefork")
	a, b := Pair(t, LinkOptions{})
	dir, _ := daemonDir(t)
	sock, _ := startDaemon(t, a, dir)
	const port = 7640
	env := []string{"ONLOAD_DAEMON=require", "ONLOAD_DAEMON_SOCKET=" + sock, "ONLOAD_INTERFACE=" + a.Iface0().Name}
	cmd := shimCommand(t, a, env, prog, fmt.Sprint(port), "0")
	stdin, stdout, log := startPiped(t, cmd)
	next := lineReader(t, stdout, "prefork", log, 10*time.Second)
	for seen := map[string]bool{}; len(seen) < 4; {
		l := next("listening, worker 1's stack and both workers ready")
		if l != "listening" && l != "stack 1" && l != "ready 0" && l != "ready 1" {
			t.Fatalf("prefork said %q:\n%s", l, log.String())
		}
		seen[l] = true
	}
	addr := netip.AddrPortFrom(a.Iface0().Addr(), port).String()
	by := map[byte]int{}
	for i := range 16 {
		ans, err := askPrefork(b, addr, 42000+2*i, i)
		if err != nil {
			t.Fatalf("connection %d: %v\n%s", i, err, log.String())
		}
		by[ans[0]]++
	}
	d := dumpDaemon(t, sock)
	if len(d.Stacks) != 1 {
		t.Fatalf("%d stacks; want the workers' one:\n%+v\n%s", len(d.Stacks), d.Stacks, log.String())
	}
	st := d.Stacks[0]
	if !control.IsRunStackName(st.Name) || len(st.Clients) != 2 {
		t.Errorf("stack %q has processes %+v; want both workers, on a stack named by onloadd run", st.Name, st.Clients)
	}
	if strings.Contains(log.String(), "every queue of") {
		t.Errorf("a worker was refused a stack:\n%s", log.String())
	}
	t.Logf("stack %q, processes %+v; answers by worker %v", st.Name, st.Clients, by)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("prefork: %v\n%s", err, log.String())
	}
}
