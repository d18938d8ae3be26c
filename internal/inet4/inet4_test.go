package inet4

import (
	"net/netip"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSockaddr(t *testing.T) {
	ap := netip.MustParseAddrPort("198.18.0.2:80")
	for _, tc := range []struct {
		ap   netip.AddrPort
		v6   bool
		want unix.Sockaddr
	}{
		{ap, false, &unix.SockaddrInet4{Addr: [4]byte{198, 18, 0, 2}, Port: 80}},
		{ap, true, &unix.SockaddrInet6{Addr: netip.MustParseAddr("::ffff:198.18.0.2").As16(), Port: 80}},
		{netip.MustParseAddrPort("[::ffff:198.18.0.2]:80"), false, &unix.SockaddrInet4{Addr: [4]byte{198, 18, 0, 2}, Port: 80}},
		{netip.MustParseAddrPort("0.0.0.0:7"), true, &unix.SockaddrInet6{Port: 7}},
		{netip.MustParseAddrPort("0.0.0.0:7"), false, &unix.SockaddrInet4{Port: 7}},
	} {
		if got := Sockaddr(tc.ap, tc.v6); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("Sockaddr(%v, v6 %v) = %+v, want %+v", tc.ap, tc.v6, got, tc.want)
		}
	}
}

// TestKernelNames binds sockets of both families with Sockaddr and reads
// their names back with Port: the kernel takes the IPv4-mapped address
// on an IPv6 socket.
func TestKernelNames(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		dom := unix.AF_INET
		if v6 {
			dom = unix.AF_INET6
		}
		fd, err := unix.Socket(dom, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Skipf("no socket of family %d here: %v", dom, err)
		}
		defer unix.Close(fd)
		if got, err := IsIPv6(fd); err != nil || got != v6 {
			t.Fatalf("IsIPv6 = %v, %v; want %v", got, err, v6)
		}
		if err := unix.Bind(fd, Sockaddr(netip.MustParseAddrPort("127.0.0.1:0"), v6)); err != nil {
			t.Fatalf("bind (v6 %v): %v", v6, err)
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			t.Fatal(err)
		}
		port, is6, ok := Port(sa)
		if !ok || is6 != v6 || port == 0 {
			t.Fatalf("Port(%+v) = %d, v6 %v, ok %v; want a port, v6 %v", sa, port, is6, ok, v6)
		}
	}
	if _, _, ok := Port(&unix.SockaddrUnix{Name: "x"}); ok {
		t.Fatal("Port took a Unix socket's name")
	}
}

// TestBound reads back what sockets of both families are bound to: an
// IPv6 socket's IPv4-mapped address unmapped, its wildcard as 0.0.0.0
// unless it is IPV6_V6ONLY, and nothing for a socket not bound.
func TestBound(t *testing.T) {
	sock := func(dom int, v6only int, bind unix.Sockaddr) int {
		t.Helper()
		fd, err := unix.Socket(dom, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Skipf("no socket of family %d here: %v", dom, err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if dom == unix.AF_INET6 {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
				t.Fatal(err)
			}
		}
		if bind != nil {
			if err := unix.Bind(fd, bind); err != nil {
				t.Fatalf("bind %+v: %v", bind, err)
			}
		}
		return fd
	}
	lo := netip.MustParseAddrPort("127.0.0.1:0")
	for _, tc := range []struct {
		name     string
		fd       int
		wantAddr string // "": not bound to IPv4
	}{
		{"IPv4", sock(unix.AF_INET, 0, Sockaddr(lo, false)), "127.0.0.1"},
		{"IPv6, mapped", sock(unix.AF_INET6, 0, Sockaddr(lo, true)), "127.0.0.1"},
		{"IPv6 wildcard", sock(unix.AF_INET6, 0, &unix.SockaddrInet6{}), "0.0.0.0"},
		{"IPv6 wildcard, IPV6_V6ONLY", sock(unix.AF_INET6, 1, &unix.SockaddrInet6{}), ""},
		{"IPv6 loopback", sock(unix.AF_INET6, 0, &unix.SockaddrInet6{Addr: netip.IPv6Loopback().As16()}), ""},
		{"not bound", sock(unix.AF_INET, 0, nil), ""},
	} {
		ap, ok := Bound(tc.fd)
		if tc.wantAddr == "" {
			if ok {
				t.Errorf("%s: Bound = %v, want none", tc.name, ap)
			}
			continue
		}
		if !ok || ap.Addr().String() != tc.wantAddr || ap.Port() == 0 {
			t.Errorf("%s: Bound = %v, %v; want %s and a port", tc.name, ap, ok, tc.wantAddr)
		}
	}
}
