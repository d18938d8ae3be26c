package sockets

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// UDPConn is an accelerated UDP socket. It implements net.Conn (when
// dialled) and net.PacketConn, and the methods of *net.UDPConn that do not
// need a kernel file descriptor. A socket from ListenPacket on a host
// interface also has a kernel half on the same port: datagrams from this
// host (through loopback) or other interfaces arrive through it, and
// datagrams to destinations the stack does not reach leave through it.
type UDPConn struct {
	sock
	laddr, raddr *net.UDPAddr
	rmu, wmu     sync.Mutex

	kern net.PacketConn
	kq   chan datagram
	kwg  sync.WaitGroup
}

type datagram struct {
	b    []byte
	from netip.AddrPort
}

var (
	_ net.Conn       = (*UDPConn)(nil)
	_ net.PacketConn = (*UDPConn)(nil)
)

// kernelDatagrams is how many datagrams from the kernel half wait to be
// read before more are dropped (a socket buffer's worth, roughly).
const kernelDatagrams = 256

func udpAddr(a netip.AddrPort) *net.UDPAddr {
	return &net.UDPAddr{IP: a.Addr().AsSlice(), Port: int(a.Port())}
}

func (s *Stack) newUDPConn(id stack.SockID, r reservation, kern net.PacketConn) (*UDPConn, error) {
	c := &UDPConn{kern: kern}
	la, ra, err := c.init(s, id, r)
	if err != nil {
		return nil, err
	}
	c.laddr = udpAddr(la)
	if kern != nil {
		c.laddr = kern.LocalAddr().(*net.UDPAddr)
	}
	if ra.IsValid() {
		c.raddr = udpAddr(ra)
	}
	if kern != nil {
		c.kq = make(chan datagram, kernelDatagrams)
		c.kwg.Add(1)
		go c.readKernel()
	}
	return c, nil
}

func (s *Stack) listenUDP(ap netip.AddrPort, kern net.PacketConn) (*UDPConn, error) {
	var proof syscall.Conn
	if kern != nil {
		proof = kern.(syscall.Conn)
	}
	id, err := s.openAt(stack.UDP, ap, false, proof)
	if err != nil {
		return nil, err
	}
	return s.newUDPConn(id, reservation{}, kern)
}

func (s *Stack) dialUDP(laddr, raddr netip.AddrPort) (*UDPConn, error) {
	id, r, err := s.connect(stack.UDP, laddr, raddr)
	if err != nil {
		return nil, err
	}
	return s.newUDPConn(id, r, nil)
}

// readKernel moves datagrams from the kernel half to the queue Read takes
// from, waking readers; a full queue drops, as a full socket buffer does.
func (c *UDPConn) readKernel() {
	defer c.kwg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := c.kern.ReadFrom(buf)
		if err != nil {
			if c.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		ua, _ := from.(*net.UDPAddr)
		if ua == nil {
			continue
		}
		ap := ua.AddrPort()
		d := datagram{b: append([]byte(nil), buf[:n]...), from: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())}
		select {
		case c.kq <- d:
			c.wq.wake(nil)
		default:
		}
	}
}

func (c *UDPConn) opErr(op string, dst net.Addr, err error) error {
	if dst == nil && c.raddr != nil {
		dst = c.raddr
	}
	return opError(op, "udp", c.laddr, dst, err)
}

// ReadFromUDPAddrPort reads one datagram, as net.UDPConn's: a datagram
// longer than b is truncated.
func (c *UDPConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	s := c.stk
	var sp spin
	defer sp.end()
	for {
		if err := c.check(&c.rd); err != nil {
			return 0, netip.AddrPort{}, c.opErr("read", nil, err)
		}
		if c.kq != nil {
			select {
			case d := <-c.kq:
				return copy(b, d.b), d.from, nil
			default:
			}
		}
		if !s.enter() {
			return 0, netip.AddrPort{}, c.opErr("read", nil, net.ErrClosed)
		}
		n, from, err := s.st.RecvFrom(c.id, b, false)
		s.leave()
		if err == nil {
			return n, from, nil
		}
		if err != stack.ErrWouldBlock {
			return 0, netip.AddrPort{}, c.opErr("read", nil, c.engineErr("recvfrom", err))
		}
		c.awaitUnless(&sp, stack.Readable, &c.rd, 0, c.kernelWaiting)
	}
}

// kernelWaiting says whether the kernel's half has a datagram queued for
// reading. readKernel queues it before it wakes the readers.
func (c *UDPConn) kernelWaiting() bool { return len(c.kq) > 0 }

// ReadFromUDP reads one datagram and says who sent it.
func (c *UDPConn) ReadFromUDP(b []byte) (int, *net.UDPAddr, error) {
	n, from, err := c.ReadFromUDPAddrPort(b)
	if err != nil {
		return n, nil, err
	}
	return n, udpAddr(from), nil
}

// ReadFrom implements net.PacketConn.
func (c *UDPConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, from, err := c.ReadFromUDP(b)
	if from == nil {
		return n, nil, err
	}
	return n, from, err
}

// Read reads one datagram (from the connected peer, if dialled).
func (c *UDPConn) Read(b []byte) (int, error) {
	n, _, err := c.ReadFromUDPAddrPort(b)
	return n, err
}

// WriteToUDPAddrPort sends one datagram to addr.
func (c *UDPConn) WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	if c.raddr != nil {
		return 0, c.opErr("write", udpAddr(addr), net.ErrWriteToConnected)
	}
	return c.send(b, netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port()))
}

// WriteToUDP sends one datagram to addr.
func (c *UDPConn) WriteToUDP(b []byte, addr *net.UDPAddr) (int, error) {
	if addr == nil {
		return 0, c.opErr("write", nil, errMissingAddress)
	}
	return c.WriteToUDPAddrPort(b, addr.AddrPort())
}

// WriteTo implements net.PacketConn.
func (c *UDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, c.opErr("write", addr, syscall.EINVAL)
	}
	return c.WriteToUDP(b, ua)
}

// Write sends one datagram to the connected peer.
func (c *UDPConn) Write(b []byte) (int, error) {
	if c.raddr == nil {
		return 0, c.opErr("write", nil, errMissingAddress)
	}
	return c.send(b, netip.AddrPort{})
}

var errMissingAddress = errors.New("missing address")

func (c *UDPConn) send(b []byte, to netip.AddrPort) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	s := c.stk
	var dst net.Addr
	if to.IsValid() {
		dst = udpAddr(to)
		if c.kern != nil && !s.routes(to.Addr()) {
			// Not through our interface: the kernel half sends it.
			n, err := c.kern.WriteTo(b, dst)
			return n, err
		}
	}
	var sp spin
	defer sp.end()
	for {
		if err := c.check(&c.wd); err != nil {
			return 0, c.opErr("write", dst, err)
		}
		if !s.enter() {
			return 0, c.opErr("write", dst, net.ErrClosed)
		}
		n, err := s.st.SendTo(c.id, b, to)
		s.leave()
		if err == nil {
			return n, nil
		}
		if err != stack.ErrNoBuffers {
			return 0, c.opErr("write", dst, c.engineErr("sendto", err))
		}
		c.await(&sp, stack.Writable, &c.wd, time.Millisecond)
	}
}

// Close closes the socket; blocked calls return net.ErrClosed.
func (c *UDPConn) Close() error {
	if !c.close() {
		return c.opErr("close", nil, net.ErrClosed)
	}
	if c.kern != nil {
		c.kern.Close()
		c.kwg.Wait()
	}
	return nil
}

func (c *UDPConn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr is the connected peer, or nil.
func (c *UDPConn) RemoteAddr() net.Addr {
	if c.raddr == nil {
		return nil
	}
	return c.raddr
}

func (c *UDPConn) setErr(err error) error {
	if err != nil {
		return c.opErr("set", nil, err)
	}
	return nil
}

func (c *UDPConn) SetDeadline(t time.Time) error      { return c.setErr(c.setDeadline(t)) }
func (c *UDPConn) SetReadDeadline(t time.Time) error  { return c.setErr(c.setReadDeadline(t)) }
func (c *UDPConn) SetWriteDeadline(t time.Time) error { return c.setErr(c.setWriteDeadline(t)) }

// SetReadBuffer sets the receive buffer size (clamped).
func (c *UDPConn) SetReadBuffer(bytes int) error {
	return c.setErr(c.setOption(stack.RecvBuffer, clampBuffer(bytes)))
}

// SetWriteBuffer sets the send buffer size (clamped).
func (c *UDPConn) SetWriteBuffer(bytes int) error {
	return c.setErr(c.setOption(stack.SendBuffer, clampBuffer(bytes)))
}

// SyscallConn reports that there is no kernel socket under the socket.
func (c *UDPConn) SyscallConn() (syscall.RawConn, error) {
	return nil, c.opErr("raw-control", nil, errNoFD)
}
