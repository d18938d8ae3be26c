// Package eventfd is the two halves of a wake-up between threads that
// block in the kernel: one adds to an eventfd's count, the woken reads
// it back to zero.
package eventfd

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Signal adds 1 to eventfd fd's count: a thread blocked on it wakes. A
// signal that interrupts the write does not lose the wake-up: the write
// is tried again. Other errors (a closed fd, a count at its maximum,
// which is unread wake-ups anyway) leave nothing to wake.
func Signal(fd int) {
	one := [8]byte{1}
	for {
		if _, err := unix.Write(fd, one[:]); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// Drain reads an eventfd's or a timerfd's count, leaving it unreadable
// (the fd must be non-blocking, or known to be readable).
func Drain(fd int) {
	var b [8]byte
	for {
		if _, err := unix.Read(fd, b[:]); !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
