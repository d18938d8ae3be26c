// Package inet4 names IPv4 addresses on kernel sockets of either family.
// An IPv6 socket that is not IPV6_V6ONLY reaches IPv4 peers through
// IPv4-mapped addresses (::ffff:a.b.c.d, RFC 4291 2.5.5.2), and the
// kernel sockets the stack stands on are the program's own, IPv6 where
// the program made them so (the shim's dual-stack sockets).
package inet4

import (
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// Sockaddr is ap, an IPv4 address and port, as a socket of the family v6
// says takes it: a SockaddrInet4, or for an IPv6 socket a SockaddrInet6
// with the IPv4-mapped address (the IPv6 wildcard for 0.0.0.0, which
// takes IPv4 too).
func Sockaddr(ap netip.AddrPort, v6 bool) unix.Sockaddr {
	a := ap.Addr().Unmap()
	if !v6 {
		return &unix.SockaddrInet4{Addr: a.As4(), Port: int(ap.Port())}
	}
	if a.IsUnspecified() {
		return &unix.SockaddrInet6{Port: int(ap.Port())}
	}
	return &unix.SockaddrInet6{Addr: a.As16(), Port: int(ap.Port())}
}

// IsIPv6 reports whether fd is an IPv6 socket.
func IsIPv6(fd int) (bool, error) {
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return false, os.NewSyscallError("getsockopt SO_DOMAIN", err)
	}
	return dom == unix.AF_INET6, nil
}

// Bound is the IPv4 address and port socket fd is bound to: an IPv4
// socket's, an IPv6 socket's IPv4-mapped address, or 0.0.0.0 for an IPv6
// socket on the wildcard that takes IPv4 too (not IPV6_V6ONLY: Go's
// net.Listen(":port"), the shim's listeners on ::). false: not bound to
// a port, or to no IPv4 address.
func Bound(fd int) (netip.AddrPort, bool) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, false
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), a.Port != 0
	case *unix.SockaddrInet6:
		ip := netip.AddrFrom16(a.Addr)
		switch {
		case ip.Is4In6():
			return netip.AddrPortFrom(ip.Unmap(), uint16(a.Port)), a.Port != 0
		case ip.IsUnspecified():
			if v6only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY); err == nil && v6only == 0 {
				return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(a.Port)), a.Port != 0
			}
		}
	}
	return netip.AddrPort{}, false
}

// Port is the port a socket's name sa holds, and whether sa is IPv6;
// ok is false for a family other than the two.
func Port(sa unix.Sockaddr) (port uint16, v6, ok bool) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return uint16(a.Port), false, true
	case *unix.SockaddrInet6:
		return uint16(a.Port), true, true
	}
	return 0, false, false
}
