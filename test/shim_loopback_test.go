package test

import (
	"strings"
	"testing"
	"time"
)

// TestShimLoopback runs shim/test/loopback.c, a program whose TCP is all
// on 127.0.0.1: the same as on the kernel, and under the shim the core
// never loads (no stack is made, none taken from onloadd), the log
// saying each socket is the kernel's for its loopback address. Before,
// the core loaded and made a stack to hear that it did not serve the
// address: varnish's manager, which listens on 127.0.0.1 for its
// command line, took onloadd's one queue that way, and its worker, of
// another user, was refused a stack.
func TestShimLoopback(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "loopback")
	a, _ := Pair(t, LinkOptions{})
	kernel, _ := runBounded(t, a.Command(prog, "7361"), 30*time.Second)
	shim, log := runBounded(t, shimCommand(t, a, nil, prog, "7362"), 30*time.Second)
	if !strings.Contains(kernel, "client read: over loopback") || shim != kernel {
		t.Fatalf("under the shim it printed:\n%s\non the kernel:\n%s\nshim's log:\n%s", shim, kernel, log)
	}
	for _, want := range []string{"listening in the kernel (a loopback address)", "connecting in the kernel (a loopback address)"} {
		if !strings.Contains(log, want) {
			t.Errorf("the shim's log does not say %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "as the core loaded") || strings.Contains(log, "stack on") {
		t.Errorf("the core loaded for loopback sockets:\n%s", log)
	}
}
