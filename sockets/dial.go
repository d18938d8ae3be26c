package sockets

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// Dialer is net.Dialer with one more field, Stack. Its fields mean what
// net.Dialer's do. A dial the stack cannot accelerate (another network,
// a local or loopback address, IPv6, a Control function that needs a
// kernel socket) is made by net.Dialer with the same settings.
type Dialer struct {
	Timeout         time.Duration
	Deadline        time.Time
	LocalAddr       net.Addr
	KeepAlive       time.Duration
	KeepAliveConfig net.KeepAliveConfig
	Resolver        *net.Resolver
	FallbackDelay   time.Duration
	Control         func(network, address string, c syscall.RawConn) error
	ControlContext  func(ctx context.Context, network, address string, c syscall.RawConn) error

	// Stack is the accelerated stack to dial from; nil: the process's
	// default stack.
	Stack *Stack
}

// Dial connects to address on network, as net.Dial.
func Dial(network, address string) (net.Conn, error) {
	var d Dialer
	return d.Dial(network, address)
}

// DialTimeout is Dial with a timeout, as net.DialTimeout.
func DialTimeout(network, address string, timeout time.Duration) (net.Conn, error) {
	d := Dialer{Timeout: timeout}
	return d.Dial(network, address)
}

// Dial connects to address on network, as net.Dialer.Dial.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

func (d *Dialer) std() *net.Dialer {
	return &net.Dialer{
		Timeout: d.Timeout, Deadline: d.Deadline, LocalAddr: d.LocalAddr,
		KeepAlive: d.KeepAlive, KeepAliveConfig: d.KeepAliveConfig, Resolver: d.Resolver,
		FallbackDelay: d.FallbackDelay, Control: d.Control, ControlContext: d.ControlContext,
	}
}

func (d *Dialer) resolver() *net.Resolver {
	if d.Resolver != nil {
		return d.Resolver
	}
	return net.DefaultResolver
}

// deadline is the earliest of the Timeout, the Deadline and the context's.
func (d *Dialer) deadline(ctx context.Context, now time.Time) time.Time {
	var t time.Time
	if d.Timeout != 0 {
		t = now.Add(d.Timeout)
	}
	if dl, ok := ctx.Deadline(); ok && (t.IsZero() || dl.Before(t)) {
		t = dl
	}
	if !d.Deadline.IsZero() && (t.IsZero() || d.Deadline.Before(t)) {
		t = d.Deadline
	}
	return t
}

// DialContext connects to address on network using ctx, as
// net.Dialer.DialContext.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if ctx == nil {
		panic("nil context")
	}
	fallback := func(why string) (net.Conn, error) {
		logFallback("dial", network, address, why)
		return d.std().DialContext(ctx, network, address)
	}
	var proto stack.Proto
	switch network {
	case "tcp", "tcp4":
		proto = stack.TCP
	case "udp", "udp4":
		proto = stack.UDP
	default:
		return fallback("network " + network + " is not accelerated")
	}
	if d.Control != nil || d.ControlContext != nil {
		return fallback("Dialer.Control needs a kernel socket")
	}
	s, why := acquire(d.Stack)
	if s == nil {
		return fallback(why)
	}
	defer s.release()
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return fallback("bad address") // net reports the error
	}
	var laddr netip.AddrPort
	if d.LocalAddr != nil {
		ap, ok := localAddrPort(d.LocalAddr)
		if !ok || !s.ours(ap.Addr()) {
			return fallback("local address " + d.LocalAddr.String() + " is not the stack's")
		}
		laddr = netip.AddrPortFrom(netip.Addr{}, ap.Port())
	}
	if dl := d.deadline(ctx, time.Now()); !dl.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	port, err := d.resolver().LookupPort(ctx, network, portStr)
	if err != nil {
		return nil, opError("dial", network, nil, nil, err)
	}
	var ips []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		ips = []netip.Addr{ip.Unmap()}
	} else {
		all, err := d.resolver().LookupNetIP(ctx, "ip", host)
		if err != nil {
			return nil, opError("dial", network, nil, nil, err)
		}
		for _, ip := range all {
			if ip.Unmap().Is4() {
				ips = append(ips, ip.Unmap())
			}
		}
	}
	var first error
	routed, kernelWhy := false, ""
	for _, ip := range ips {
		raddr := netip.AddrPortFrom(ip, uint16(port))
		if w := s.dialsKernel(proto, raddr); w != "" {
			if kernelWhy == "" {
				kernelWhy = w
			}
			continue
		}
		routed = true
		var c net.Conn
		if proto == stack.TCP {
			c, err = s.dialTCP(ctx, laddr, raddr, keepAliveFor(d.KeepAlive, d.KeepAliveConfig))
		} else {
			c, err = s.dialUDP(laddr, raddr)
		}
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = opError("dial", network, nil, addrOf(proto, raddr), err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	if !routed {
		if kernelWhy == "" {
			kernelWhy = host + " is not reached through the stack's interface"
		}
		return fallback(kernelWhy)
	}
	return nil, first
}

func addrOf(p stack.Proto, a netip.AddrPort) net.Addr {
	if p == stack.UDP {
		return udpAddr(a)
	}
	return tcpAddr(a)
}

// localAddrPort reads a Dialer.LocalAddr.
func localAddrPort(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.TCPAddr:
		if ap := a.AddrPort(); a.Zone == "" {
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
		}
	case *net.UDPAddr:
		if ap := a.AddrPort(); a.Zone == "" {
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
		}
	}
	return netip.AddrPort{}, false
}

// keepAliveFor is net's reading of KeepAlive and KeepAliveConfig.
func keepAliveFor(d time.Duration, cfg net.KeepAliveConfig) net.KeepAliveConfig {
	if !cfg.Enable && d >= 0 {
		return net.KeepAliveConfig{Enable: true, Idle: d}
	}
	return cfg
}

// dialTCP opens a TCP connection from the stack.
func (s *Stack) dialTCP(ctx context.Context, laddr, raddr netip.AddrPort, ka net.KeepAliveConfig) (*TCPConn, error) {
	id, r, err := s.connect(stack.TCP, laddr, raddr)
	if err != nil {
		return nil, err
	}
	c, err := s.newTCPConn(id, r, ka)
	if err != nil {
		return nil, err
	}
	s.recordKernelFD(id, r.fd1-1)
	c.raddr = tcpAddr(raddr)
	if err := c.waitConnected(ctx); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// openBound opens an engine socket bound to the stack's address and
// laddr's port (0: an ephemeral one), reserving the port in the kernel
// when the stack serves a host interface.
func (s *Stack) openBound(p stack.Proto, laddr netip.AddrPort) (stack.SockID, reservation, error) {
	if !s.enter() {
		return stack.NullSock, reservation{}, net.ErrClosed
	}
	defer s.leave()
	id, err := s.st.Open(p)
	if err != nil {
		return stack.NullSock, reservation{}, sysErr("socket", err)
	}
	port := laddr.Port()
	var r reservation
	if s.host {
		if r, port, err = s.reservePort(p, s.addr.Addr(), port); err != nil {
			s.st.Close(id)
			return stack.NullSock, reservation{}, err
		}
	}
	if err := s.bind(p, id, netip.AddrPortFrom(s.addr.Addr(), port), r.fd1-1, p == stack.TCP); err != nil {
		s.st.Close(id)
		r.release()
		return stack.NullSock, reservation{}, sysErr("bind", err)
	}
	return id, r, nil
}

func (s *Stack) closeID(id stack.SockID) {
	if s.enter() {
		s.st.Close(id)
		s.leave()
	}
}

// waitConnected waits for the handshake: the socket turns writable, or
// reports why it failed.
func (c *TCPConn) waitConnected(ctx context.Context) error {
	s := c.stk
	var dl deadline
	if t, ok := ctx.Deadline(); ok {
		dl.set(t)
	}
	stop := context.AfterFunc(ctx, func() { dl.set(time.Unix(1, 0)) })
	defer stop()
	var sp spin
	defer sp.end()
	for {
		if err := ctx.Err(); err != nil {
			return mapCtxErr(err)
		}
		if dl.passed() {
			return timeoutError{}
		}
		if err := c.check(nil); err != nil {
			return err
		}
		if !s.enter() {
			return net.ErrClosed
		}
		ev := s.st.Events(c.id)
		var err error
		if ev&stack.Error != 0 {
			err = s.st.SockError(c.id)
		}
		s.leave()
		switch {
		case err != nil:
			return sysErr("connect", err)
		case ev&stack.Hangup != 0:
			return sysErr("connect", stack.ErrConnReset)
		case ev&stack.Writable != 0:
			return nil
		}
		c.await(&sp, stack.Writable, &dl, 0)
	}
}

// splitPort parses a port number or service name as net does.
func splitPort(ctx context.Context, r *net.Resolver, network, port string) (uint16, error) {
	if n, err := strconv.ParseUint(port, 10, 16); err == nil {
		return uint16(n), nil
	}
	p, err := r.LookupPort(ctx, network, port)
	return uint16(p), err
}
