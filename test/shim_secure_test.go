package test

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShimSecureExec runs shim/test/secure.c, a program that execs its
// worker with its real and effective users apart, as squid's master does
// (root in effect, its user in name): the dynamic loader runs such a
// worker in secure mode, which ignores the LD_PRELOAD entry with a path
// that `onloadd run` writes. Both workers echo through their connections
// as on the kernel; the worker exec'd as it is runs accelerated, the other
// on the kernel, and the shim says why, once. Before, squid under
// `onloadd run` ran wholly on the kernel and nothing said so.
func TestShimSecureExec(t *testing.T) {
	prog, a, addr, port := secureProgram(t)
	kernel, _ := runBounded(t, a.Command(prog, addr, port), 30*time.Second)
	shim, log := runBounded(t, shimCommand(t, a, nil, prog, addr, port), 30*time.Second)
	requireAccelerated(t, log, "connecting")
	for _, want := range []string{"same users: secure mode 0", "users apart: secure mode 1", "users apart: echo through", "users apart: exit 0"} {
		if !strings.Contains(kernel, want) {
			t.Fatalf("on the kernel, no %q:\n%s", want, kernel)
		}
	}
	said := "runs in the dynamic loader's secure mode (real uid 65534, effective 0"
	if shim != kernel || strings.Count(log, said) != 1 {
		t.Fatalf("under the shim it printed:\n%s\non the kernel:\n%s\nshim's log (want %q once):\n%s", shim, kernel, said, log)
	}
	t.Logf("%s\nshim's log:\n%s", shim, log)
}

// secureProgram builds shim/test/secure.c, and the echo server it talks
// to from host a at addr:port.
func secureProgram(t *testing.T) (prog string, a *Host, addr, port string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the program sets its real user apart from its effective one")
	}
	shimOnloadd(t)
	prog = buildC(t, "secure")
	a, b, ln := echoHosts(t)
	return prog, a, b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}
