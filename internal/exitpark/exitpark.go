// Package exitpark makes the kernel release a process's costly
// descriptors after its others when the process exits.
//
// An exiting process's files are released in the reverse order of their
// numbers (the kernel queues each last release as task work, and runs the
// queue last in, first out). The stack's descriptors sit above the
// program's (fdbase), so their releases came first, and an AF_XDP
// socket's waits for an RCU grace period (it unbinds from the device):
// a program's own kernel socket sent its FIN some 30 ms after its exit
// began, where the kernel alone sends it at once (under the shim, a peer
// saw that FIN after a stale ACK, and answered with a reset).
//
// Park holds a second reference to each descriptor's file in a message
// on a socket pair of the process's own. At exit the pair's release drops
// those references, and the files' last releases, queued then, run after
// every release the exit queued first: the program's sockets close, and
// send their FINs, before the AF_XDP socket unbinds.
package exitpark

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/fdbase"
)

// Park holds fds' files (those not negative) until the returned release
// is called or the process ends. What must be free again at once when
// closed (an AF_XDP socket's queue) needs the release too, or the message
// keeps it open.
func Park(fds ...int) (release func() error, err error) {
	var keep []int
	for _, fd := range fds {
		if fd >= 0 {
			keep = append(keep, fd)
		}
	}
	if len(keep) == 0 {
		return func() error { return nil }, nil
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("park descriptors for exit: socketpair: %w", err)
	}
	a, b := fdbase.Move(sp[0]), fdbase.Move(sp[1])
	if err := unix.Sendmsg(a, []byte{0}, unix.UnixRights(keep...), nil, unix.MSG_DONTWAIT); err != nil {
		unix.Close(a)
		unix.Close(b)
		return nil, fmt.Errorf("park descriptors for exit: %w", err)
	}
	done := false
	return func() error {
		if done {
			return nil
		}
		done = true
		// b's queue holds the message: closing b drops the references.
		return errors.Join(unix.Close(b), unix.Close(a))
	}, nil
}
