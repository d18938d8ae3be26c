package sockets

import (
	"errors"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/inet4"
	"github.com/xdp-onload/onload/stack"
)

// reservation is a kernel socket bound to a port the stack uses, so that
// the kernel never gives the port to a socket of its own (whose replies
// the steering program would bring to us). The zero value holds nothing.
type reservation struct {
	fd1 int // the descriptor plus one
}

// reservePort binds a kernel socket of protocol p to addr:port (port 0:
// an ephemeral port, bindFree) and returns it with the port. It runs in
// the calling thread's network namespace.
func (s *Stack) reservePort(p stack.Proto, addr netip.Addr, port uint16) (reservation, uint16, error) {
	typ := unix.SOCK_STREAM
	if p == stack.UDP {
		typ = unix.SOCK_DGRAM
	}
	fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return reservation{}, 0, os.NewSyscallError("socket", err)
	}
	if port == 0 {
		port, err = s.bindFree(p, fd, addr, false)
	} else if err = unix.Bind(fd, &unix.SockaddrInet4{Addr: addr.As4(), Port: int(port)}); err != nil {
		err = os.NewSyscallError("bind", err)
	}
	if err != nil {
		unix.Close(fd)
		return reservation{}, 0, err
	}
	return reservation{fd1: fd + 1}, port, nil
}

// bindFreeTries is how many ports bindFree offers the kernel before it
// lets the kernel pick.
const bindFreeTries = 32

// bindFree binds kernel socket fd (of protocol p, not bound; IPv6 if v6,
// inet4.Sockaddr) to addr and an ephemeral port, and returns the port.
// The port is one no socket of the stack is bound to (stack.FreePort), in
// the kernel's ephemeral range less its reserved ports, as the kernel's
// own pick is: the kernel's pick
// alone may be a port that a connection the program closed still has on
// the stack (sending its FIN, or waiting for the peer's), to the very
// peer the new one is for, and the stack could not connect there
// (redis-benchmark -k 0 under the shim failed with EADDRNOTAVAIL after a
// few hundred connections). A port the kernel has in use is passed over;
// after bindFreeTries of them, or with no free port in the range, the
// kernel picks.
func (s *Stack) bindFree(p stack.Proto, fd int, addr netip.Addr, v6 bool) (uint16, error) {
	if s.enter() {
		port, err := s.bindOffered(p, fd, addr, v6)
		s.leave()
		if port != 0 || err != nil {
			return port, err
		}
	}
	if err := unix.Bind(fd, inet4.Sockaddr(netip.AddrPortFrom(addr, 0), v6)); err != nil {
		return 0, os.NewSyscallError("bind", err)
	}
	port, _, err := s.boundPort(fd)
	return port, err
}

// bindOffered is bindFree's offer of the stack's free ports: the port fd
// is bound to, or 0 (and no error) if the kernel is to pick. Between
// enter and leave.
func (s *Stack) bindOffered(p stack.Proto, fd int, addr netip.Addr, v6 bool) (uint16, error) {
	r := s.kernelPorts()
	for range bindFreeTries {
		port, err := s.st.FreePort(p, r.lo, r.hi, r.reserved)
		if err != nil {
			return 0, nil // none free in the range
		}
		err = unix.Bind(fd, inet4.Sockaddr(netip.AddrPortFrom(addr, port), v6))
		if err == nil {
			return port, nil
		}
		if !errors.Is(err, unix.EADDRINUSE) {
			return 0, os.NewSyscallError("bind", err)
		}
	}
	return 0, nil
}

// portRange is the kernel's ephemeral port range and its reserved ports
// (net.ipv4.ip_local_port_range, ip_local_reserved_ports).
type portRange struct {
	lo, hi   uint16
	reserved func(uint16) bool
}

// kernelPorts reads the kernel's ephemeral range once, in the calling
// thread's network namespace (the stack's); where it cannot be read, the
// kernel's defaults stand (32768-60999, none reserved).
func (s *Stack) kernelPorts() portRange {
	s.portsOnce.Do(func() {
		s.ports = portRange{lo: 32768, hi: 60999}
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
			if f := strings.Fields(string(b)); len(f) == 2 {
				lo, err1 := strconv.ParseUint(f[0], 10, 16)
				hi, err2 := strconv.ParseUint(f[1], 10, 16)
				if err1 == nil && err2 == nil && lo > 0 && lo <= hi {
					s.ports.lo, s.ports.hi = uint16(lo), uint16(hi)
				}
			}
		}
		if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_reserved_ports"); err == nil {
			s.ports.reserved = parsePortList(strings.TrimSpace(string(b)))
		}
	})
	return s.ports
}

// parsePortList reads the kernel's list of ports ("8080,9000-9100"), as a
// test of membership; nil for an empty list. A part it cannot read is
// passed over.
func parsePortList(list string) func(uint16) bool {
	type span struct{ lo, hi uint16 }
	var spans []span
	for part := range strings.SplitSeq(list, ",") {
		a, b, isRange := strings.Cut(strings.TrimSpace(part), "-")
		lo, err1 := strconv.ParseUint(a, 10, 16)
		hi, err2 := lo, error(nil)
		if isRange {
			hi, err2 = strconv.ParseUint(b, 10, 16)
		}
		if err1 == nil && err2 == nil && lo <= hi {
			spans = append(spans, span{uint16(lo), uint16(hi)})
		}
	}
	if len(spans) == 0 {
		return nil
	}
	return func(p uint16) bool {
		for _, sp := range spans {
			if sp.lo <= p && p <= sp.hi {
				return true
			}
		}
		return false
	}
}

func (r *reservation) release() {
	if r.fd1 > 0 {
		unix.Close(r.fd1 - 1)
		r.fd1 = 0
	}
}
