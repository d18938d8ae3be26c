package test

import (
	"net"
	"strconv"
	"testing"
	"time"
)

// TestShimPollHerd runs shim/test/pollherd.c: eight threads that each
// wait in poll() on a connection of their own and a pipe, one of them
// echoing 2,000 lines while the others wait. A frame's arrival must not
// wake the waiting threads (under one wake-up of them all a round trip,
// as on the kernel, where none is woken), and each is still woken by its
// pipe. Under the shim a wait with a kernel fd in it blocked in ppoll
// with the stack's AF_XDP socket beside the fds, and every frame woke
// every thread waiting so: 5-7 wake-ups a round trip.
func TestShimPollHerd(t *testing.T) {
	shimOnloadd(t)
	prog := buildC(t, "pollherd")
	a, b, ln := echoHosts(t)
	args := []string{b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port), "8", "2000"}
	kernel, _ := runBounded(t, a.Command(prog, args...), 60*time.Second)
	shim, log := runBounded(t, shimCommand(t, a, nil, prog, args...), 60*time.Second)
	const want = "waiting threads' wake-ups a round trip: under 1\nthread 0: every line echoed\n7 of 7 waiting threads woken by their pipe echoed\n"
	if kernel != want || shim != kernel {
		t.Fatalf("under the shim it printed:\n%s\non the kernel:\n%s\nshim's log:\n%s", shim, kernel, log)
	}
	requireAccelerated(t, log, "connecting")
}
