package test

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShimSharedSignalStack runs shim/test/altstack.c: threads that
// share one signal stack, as varnish's worker threads do, each echoing
// through its own connection, with the Go runtime collecting garbage as
// often as it can (GOGC=1: its preemption signal on every thread in the
// stack, often at once). Under the shim each thread that calls the stack
// gets a signal stack of its own in place of the program's, on which the
// program's handler runs too: every echo comes back and every handler
// runs on an alternate stack, as on the kernel. On the shared stack, the
// runtime's handlers on two threads at once ended varnish's worker
// process ("fatal error: index out of range" in the signal handler).
//
// "later": each thread sets the shared stack after its first echo, its
// first call into the stack under the shim, when the shim's is in place
// already: the shim keeps its own installed (sigaltstack is interposed)
// and reports the program's back to it, as the kernel would.
func TestShimSharedSignalStack(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "altstack")
	a, b, ln := echoHosts(t)
	for _, when := range []string{"first", "later"} {
		t.Run(when, func(t *testing.T) {
			args := []string{b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), "32", "3000", when}
			kernel, _ := runBounded(t, a.Command(prog, args...), 60*time.Second)
			shim, log := runBounded(t, shimCommand(t, a, []string{"GOGC=1"}, prog, args...), 60*time.Second)
			const want = "32 threads: 32 echoed every line, 32 ran their handler on an alternate stack, 32 read back the stack they set"
			if !strings.Contains(kernel, want) || shim != kernel {
				t.Fatalf("under the shim it printed:\n%s\non the kernel:\n%s\nshim's log:\n%s", shim, kernel, log)
			}
			requireAccelerated(t, log, "connecting")
		})
	}
}
