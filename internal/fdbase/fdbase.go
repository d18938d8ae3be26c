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

var base atomic.Int32

// Set sets the base; 0 for none.
func Set(b int) {
	if b < 0 {
		b = 0
	}
	base.Store(int32(b))
}

// Move returns fd moved to the lowest free number at or above the base,
// close-on-exec, and closes fd; or fd itself when there is no base, fd is
// above it already, or no number is free there (the limit).
func Move(fd int) int {
	b := int(base.Load())
	if fd < 0 || fd >= b {
		return fd
	}
	h, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, b)
	if err != nil {
		return fd
	}
	unix.Close(fd)
	return h
}
