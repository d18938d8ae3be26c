package sockets

import (
	"net/netip"
	"os"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/stack"
)

// reservation is a kernel socket bound to a port the stack uses, so that
// the kernel never gives the port to a socket of its own (whose replies
// the steering program would bring to us). The zero value holds nothing.
type reservation struct {
	fd1 int // the descriptor plus one
}

// reservePort binds a kernel socket of protocol p to addr:port (port 0:
// the kernel picks a free ephemeral port) and returns it with the port.
// It runs in the calling thread's network namespace.
func reservePort(p stack.Proto, addr netip.Addr, port uint16) (reservation, uint16, error) {
	typ := unix.SOCK_STREAM
	if p == stack.UDP {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return reservation{}, 0, os.NewSyscallError("socket", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(port)}); err != nil {
		unix.Close(fd)
		return reservation{}, 0, os.NewSyscallError("bind", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return reservation{}, 0, os.NewSyscallError("getsockname", err)
	}
	return reservation{fd1: fd + 1}, uint16(sa.(*unix.SockaddrInet4).Port), nil
}

func (r *reservation) release() {
	if r.fd1 > 0 {
		unix.Close(r.fd1 - 1)
		r.fd1 = 0
	}
}
