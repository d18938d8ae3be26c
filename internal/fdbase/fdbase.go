// Package fdbase keeps the descriptors a process's stack opens out of the
// numbers its program uses. The kernel gives the lowest number free, and
// some programs size their tables by the descriptors they expect to open
// (wrk's event loop holds 10 + 3 x its connections). Under the interposer
// (shim), which sets a base as the core loads, a descriptor the stack
// opens later is moved at or above it; with no base (a Go program on the
// library) nothing moves.
package fdbase

import (
	"sync/atomic"

	"golang.org/x/sys/unix"
)

var (
	base   atomic.Int32
	notify atomic.Pointer[func(fd int, open bool)]
)

// Notify has f told of every descriptor Move moves (open) and Close
// closes; nil for nobody.
func Notify(f func(fd int, open bool)) {
	if f == nil {
		notify.Store(nil)
		return
	}
	notify.Store(&f)
}

func tell(fd int, open bool) {
	if f := notify.Load(); f != nil {
		(*f)(fd, open)
	}
}

// Set sets the base; 0 for none.
func Set(b int) {
	if b < 0 {
		b = 0
	}
	base.Store(int32(b))
}

// Move returns fd moved to the lowest free number at or above the base,
// close-on-exec, and closes fd; or fd itself when there is no base, fd is
// above it already, or no number is free there (the limit). With a base,
// Notify's function hears of the descriptor returned.
func Move(fd int) int {
	b := int(base.Load())
	if fd < 0 || b == 0 {
		return fd
	}
	if fd < b {
		if h, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, b); err == nil {
			unix.Close(fd)
			fd = h
		}
	}
	tell(fd, true)
	return fd
}

// Close closes fd, a descriptor Move returned, telling Notify's function
// first: the number is free for the program again.
func Close(fd int) error {
	if fd < 0 {
		return nil
	}
	if base.Load() > 0 {
		tell(fd, false)
	}
	return unix.Close(fd)
}
