package test

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShimAddressSpaceLimit runs shim/test/aslimit.c, a program that
// limits its own address space (RLIMIT_AS) with a connection open, as
// vsftpd's session processes do (200 MiB): a child forked after the core
// loaded and the parent map memory under their limits, read the limits
// back as they set them, and the connection echoes, as on the kernel; a
// program the child execs has the child's limit. Under the shim the core
// takes about 2 GiB of address space, none of it the program's: before,
// the child's mmap failed (ENOMEM; vsftpd answered every login "500
// OOPS: mmap"). A shell the parent starts with posix_spawn has the
// parent's own limit, not the raised one (before, 1 GiB read 2.9 GiB
// there), from its start (its first fork, a command substitution,
// raced the parent's prlimit and kept the raised one in a fresh clone's
// CI run), and so does one started without the shim, once it has
// exec'd, and ones started by system and popen (before, 2.9 GiB).
// Started under a limit that leaves the core no room, it runs
// on the kernel.
func TestShimAddressSpaceLimit(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "aslimit")
	a, b, ln := echoHosts(t)
	addr, port := b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	for _, args := range [][]string{{addr, port}, {addr, port, "exec"}, {addr, port, "spawn"}} {
		kernel, _ := runBounded(t, a.Command(prog, args...), 30*time.Second)
		shim, log := runBounded(t, shimCommand(t, a, nil, prog, args...), 30*time.Second)
		requireAccelerated(t, log, "connecting")
		if !strings.Contains(kernel, "parent: echo 23 bytes") || shim != kernel {
			t.Fatalf("%v: under the shim it printed:\n%s\non the kernel:\n%s\nshim's log:\n%s", args, shim, kernel, log)
		}
		t.Logf("%v:\n%s", args, shim)
	}
	// Started under a limit that leaves the core no room (ulimit -v 1.4
	// GB): the sockets stay the kernel's, and it says why. Before, the
	// Go runtime could not start and ended the program at its connect.
	RequireTool(t, "prlimit")
	under := []string{"--as=1400000000", prog, addr, port}
	kernel, _ := runBounded(t, a.Command("prlimit", under...), 30*time.Second)
	shim, log := runBounded(t, shimCommand(t, a, nil, "prlimit", under...), 30*time.Second)
	if !strings.Contains(kernel, "parent: echo 23 bytes") || shim != kernel || !strings.Contains(log, "leaves the stack's core no room") {
		t.Fatalf("under a limit of 1.4 GB: under the shim it printed:\n%s\non the kernel:\n%s\nshim's log:\n%s", shim, kernel, log)
	}
}
