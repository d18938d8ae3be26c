package interrupts

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// watched lists the descriptors epoll set epfd watches, from its fdinfo
// ("tfd: N events: ...").
func watched(t *testing.T, epfd int) []int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(epfd))
	if err != nil {
		t.Skipf("cannot read the epoll set's fdinfo: %v", err)
	}
	var fds []int
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "tfd:" {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("fdinfo line %q: %v", l, err)
			}
			fds = append(fds, n)
		}
	}
	return fds
}

// TestReadinessWatchesOnlyWhileArmed: the socket is in the readiness set
// only from an arm to the event it gives, so that while nobody waits on
// the interrupt a frame's arrival finds nobody on the socket's wait queue
// (each such arrival paid the queue's lock and the epoll callback in the
// receiving context, the peer's send on veth). Each way of taking the
// event is checked: the thread waiter's (takeIRQ) and the goroutine's
// (run). A pipe stands in for the AF_XDP socket: both are readable while
// something waits in them.
func TestReadinessWatchesOnlyWhileArmed(t *testing.T) {
	for _, how := range []string{"takeIRQ", "run"} {
		t.Run(how, func(t *testing.T) {
			var p [2]int
			if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(p[0])
			defer unix.Close(p[1])
			r, err := newReadiness([]int{p[0]})
			if err != nil {
				t.Fatal(err)
			}
			defer r.close()
			if w := watched(t, r.epfd); len(w) != 0 {
				t.Fatalf("before any arm the set watches %v, want nothing", w)
			}
			var c <-chan struct{}
			if how == "run" {
				c = r.C()
			}
			for round := 0; round < 3; round++ {
				r.arm()
				if w := watched(t, r.epfd); len(w) != 1 || w[0] != p[0] {
					t.Fatalf("round %d: armed, the set watches %v, want [%d]", round, w, p[0])
				}
				r.arm() // pending: no change
				if _, err := unix.Write(p[1], []byte{1}); err != nil {
					t.Fatal(err)
				}
				if how == "run" {
					select {
					case <-c:
					case <-time.After(5 * time.Second):
						t.Fatalf("round %d: no signal 5 s after the pipe turned readable", round)
					}
				} else {
					fds := []unix.PollFd{{Fd: int32(r.epfd), Events: unix.POLLIN}}
					if n, err := unix.Poll(fds, 5000); n != 1 || err != nil {
						t.Fatalf("round %d: the set did not turn readable (poll: %d, %v)", round, n, err)
					}
					r.takeIRQ()
				}
				// run signals after it has taken the event (took): the
				// socket has left the set by then.
				if w := watched(t, r.epfd); len(w) != 0 {
					t.Fatalf("round %d: the event taken, the set still watches %v", round, w)
				}
				if r.armed.Load() {
					t.Fatalf("round %d: the event taken, an arm is still pending", round)
				}
				var b [8]byte
				unix.Read(p[0], b[:])
			}
		})
	}
}
