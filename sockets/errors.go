package sockets

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"

	"github.com/xdp-onload/onload/stack"
)

// Errors are reported exactly as package net reports them: a *net.OpError
// naming the operation, network and addresses, wrapping
// os.ErrDeadlineExceeded, net.ErrClosed, io.EOF (unwrapped, as net does)
// or an *os.SyscallError holding the errno the kernel would have given,
// so that errors.Is(err, syscall.ECONNRESET) and net.Error's Timeout work
// unchanged.

// timeoutError is net's "i/o timeout" for an expired dial deadline or
// context: errors.Is(err, context.DeadlineExceeded) holds.
type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
func (timeoutError) Is(err error) bool {
	return err == context.DeadlineExceeded
}

// canceledError is net's error for a cancelled context.
type canceledError struct{}

func (canceledError) Error() string     { return "operation was canceled" }
func (canceledError) Is(err error) bool { return err == context.Canceled }

// mapCtxErr maps a context's error to net's.
func mapCtxErr(err error) error {
	switch err {
	case context.Canceled:
		return canceledError{}
	case context.DeadlineExceeded:
		return timeoutError{}
	}
	return err
}

// errNoFD is what SyscallConn reports: there is no kernel socket to hand
// out.
var errNoFD = errors.New("accelerated socket has no kernel file descriptor: its state lives in the user-space stack (use the standard net package for sockets that need one)")

// sysErr turns an engine error into what the kernel would have reported
// from syscall: an *os.SyscallError with the errno.
func sysErr(syscallName string, err error) error {
	var e *stack.Errno
	if errors.As(err, &e) {
		return os.NewSyscallError(syscallName, e.Errno)
	}
	return err
}

func isErrno(err error, n syscall.Errno) bool {
	var e *stack.Errno
	return errors.As(err, &e) && e.Errno == n
}

func opError(op, network string, src, dst net.Addr, err error) error {
	return &net.OpError{Op: op, Net: network, Source: src, Addr: dst, Err: err}
}
