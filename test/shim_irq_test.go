package test

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// epollTargets lists, for each epoll set process pid has open, the
// descriptors it watches (its fdinfo's "tfd:" lines).
func epollTargets(pid int) (map[int][]int, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	sets := map[int][]int{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink(dir + "/" + e.Name()); l != "anon_inode:[eventpoll]" {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
		if err != nil {
			continue // closed meanwhile
		}
		var tfds []int
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "tfd:" {
				if n, err := strconv.Atoi(f[1]); err == nil {
					tfds = append(tfds, n)
				}
			}
		}
		sets[fd] = tfds
	}
	return sets, nil
}

// TestShimInterruptOnlyWhileBlocked: a thread that blocked in the shim's
// wait and woke leaves no socket in the epoll set it blocked in
// (shim/test/irqset.c). The set holds the program's epoll set and, only
// during the block, the stack's interrupt (its AF_XDP socket): left in it
// while the thread ran, the interrupt cost every frame's arrival the
// socket's wait-queue lock and the epoll callback, in the context that
// received the frame (on veth the client's send: 4% of redis-benchmark's
// CPU against redis-server under the shim).
func TestShimInterruptOnlyWhileBlocked(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "irqset")
	a, b := Pair(t, LinkOptions{})
	ln := kernelListener(t, b)
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		select {
		case c := <-accepted:
			c.Close()
		default:
		}
	})
	cmd := shimCommand(t, a, nil, prog, b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	stdin, stdout, log := startPiped(t, cmd)
	defer stdin.Close()
	var pid, epfd int
	l := lineReader(t, stdout, "irqset", log, 20*time.Second)("its pid and epoll fd")
	if _, err := fmt.Sscan(l, &pid, &epfd); err != nil {
		t.Fatalf("irqset printed %q, want its pid and epoll fd: %v\n%s", l, err, log.String())
	}
	requireAccelerated(t, log.String(), "connecting")
	sets, err := epollTargets(pid)
	if err != nil {
		t.Skipf("cannot read the program's descriptors: %v", err)
	}
	found := false
	for set, tfds := range sets {
		holds := false
		for _, fd := range tfds {
			holds = holds || fd == epfd
		}
		if !holds {
			continue // the program's own set, or the core's
		}
		found = true // the thread's set: the program's set is in it
		for _, fd := range tfds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd)); strings.HasPrefix(l, "socket:") {
				t.Errorf("the thread's epoll set (fd %d) still watches socket fd %d (%s) after its block: the stack's interrupt stays on the socket's wait queue while the thread runs", set, fd, l)
			}
		}
	}
	if !found {
		t.Fatalf("no epoll set of the process watches the program's set (fd %d): the shim's wait did not block in a set of its own; sets: %v\n%s", epfd, sets, log.String())
	}
}
