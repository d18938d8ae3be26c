package sockets

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// ListenConfig is net.ListenConfig with one more field, Stack. A listen
// the stack cannot accelerate (another network, a loopback or other local
// address, IPv6 only, a Control function) is made by net.ListenConfig
// with the same settings.
type ListenConfig struct {
	Control         func(network, address string, c syscall.RawConn) error
	KeepAlive       time.Duration
	KeepAliveConfig net.KeepAliveConfig

	// Stack is the accelerated stack to listen on; nil: the process's
	// default stack.
	Stack *Stack
}

// Listen announces on the local network address, as net.Listen.
func Listen(network, address string) (net.Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// ListenPacket announces on the local network address, as
// net.ListenPacket.
func ListenPacket(network, address string) (net.PacketConn, error) {
	var lc ListenConfig
	return lc.ListenPacket(context.Background(), network, address)
}

func (lc *ListenConfig) std() *net.ListenConfig {
	return &net.ListenConfig{Control: lc.Control, KeepAlive: lc.KeepAlive, KeepAliveConfig: lc.KeepAliveConfig}
}

// local decides whether a listen on address can be served by the stack
// (proto is "tcp" or "udp") and returns it, held (the caller releases
// it), with the local address and port to bind there. When it cannot, it
// logs why and returns nil: the caller falls back to net.
func (lc *ListenConfig) local(ctx context.Context, proto, network, address string) (*Stack, netip.AddrPort) {
	s, ap, why := lc.accelerated(ctx, proto, network, address)
	if s == nil {
		logFallback("listen", network, address, why)
	}
	return s, ap
}

func (lc *ListenConfig) accelerated(ctx context.Context, proto, network, address string) (s *Stack, ap netip.AddrPort, why string) {
	if network != proto && network != proto+"4" {
		return nil, ap, "network " + network + " is not accelerated"
	}
	if lc.Control != nil {
		return nil, ap, "ListenConfig.Control needs a kernel socket"
	}
	held, why := acquire(lc.Stack)
	if held == nil {
		return nil, ap, why
	}
	ok := false
	defer func() {
		if !ok {
			held.release()
		}
	}()
	s = held
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, ap, "bad address" // net reports the error
	}
	port, err := splitPort(ctx, net.DefaultResolver, network, portStr)
	if err != nil {
		return nil, ap, "bad port"
	}
	var ip netip.Addr
	switch {
	case host == "":
	case host == "::" && (network == "tcp" || network == "udp"):
		// The dual-stack wildcard: its IPv4 half is ours.
	default:
		a, err := netip.ParseAddr(host)
		if err != nil {
			ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
			if err != nil || len(ips) == 0 {
				return nil, ap, "cannot resolve " + host
			}
			a = ips[0]
		}
		a = a.Unmap()
		if !s.ours(a) {
			return nil, ap, host + " is not the stack's address"
		}
		if !a.IsUnspecified() {
			ip = a
		}
	}
	ok = true
	return s, netip.AddrPortFrom(ip, port), ""
}

// Listen announces on the local network address, as
// net.ListenConfig.Listen.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	s, ap := lc.local(ctx, "tcp", network, address)
	if s == nil {
		return lc.std().Listen(ctx, network, address)
	}
	defer s.release()
	var kern net.Listener
	var addr net.Addr = tcpAddr(netip.AddrPortFrom(s.addr.Addr(), ap.Port()))
	if s.host {
		// The kernel's half: it reserves the port (and picks it, for port
		// 0) and serves clients that do not come through our interface.
		var err error
		if kern, err = lc.std().Listen(ctx, network, address); err != nil {
			return nil, err
		}
		addr = kern.Addr()
		ap = netip.AddrPortFrom(ap.Addr(), uint16(kern.Addr().(*net.TCPAddr).Port))
	}
	fail := func(err error) (net.Listener, error) {
		if kern != nil {
			kern.Close()
		}
		return nil, opError("listen", network, nil, addr, err)
	}
	var proof syscall.Conn
	if kern != nil {
		proof = kern.(syscall.Conn)
	}
	id, err := s.openAt(stack.TCP, ap, true, proof)
	if err != nil {
		return fail(err)
	}
	if !s.host && s.enter() {
		la, _ := s.st.LocalAddr(id)
		s.leave()
		addr = tcpAddr(netip.AddrPortFrom(s.addr.Addr(), la.Port()))
	}
	l, err := s.newTCPListener(id, addr, keepAliveFor(lc.KeepAlive, lc.KeepAliveConfig), kern)
	if err != nil {
		s.closeID(id)
		return fail(err)
	}
	logf(levelInfo, "listen %s %s: accelerated on %s", network, address, s.name())
	return l, nil
}

// ListenPacket announces on the local network address, as
// net.ListenConfig.ListenPacket.
func (lc *ListenConfig) ListenPacket(ctx context.Context, network, address string) (net.PacketConn, error) {
	s, ap := lc.local(ctx, "udp", network, address)
	if s == nil {
		return lc.std().ListenPacket(ctx, network, address)
	}
	defer s.release()
	var kern net.PacketConn
	if s.host {
		var err error
		if kern, err = lc.std().ListenPacket(ctx, network, address); err != nil {
			return nil, err
		}
		ap = netip.AddrPortFrom(ap.Addr(), uint16(kern.LocalAddr().(*net.UDPAddr).Port))
	}
	c, err := s.listenUDP(ap, kern)
	if err != nil {
		if kern != nil {
			kern.Close()
		}
		return nil, opError("listen", network, nil, udpAddr(ap), err)
	}
	return c, nil
}
