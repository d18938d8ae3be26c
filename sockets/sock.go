package sockets

import (
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// sock is what every accelerated socket has: its engine socket, its wait
// queue, deadlines and closing state.
type sock struct {
	stk     *Stack
	id      stack.SockID
	wq      waitq
	closing chan struct{}
	closed  atomic.Bool
	rd, wd  deadline
	reserve reservation // the kernel socket that keeps our port from the kernel
	resMu   sync.Mutex  // reserve's release, against TCPConn.takenOver's use of it
	handing atomic.Bool // this process is handing the connection over (handoverOnLocked)
	// hoMu makes this process's handovers of the connection one at a
	// time (two at once on one kernel socket wreck each other: see
	// stack.handoverClaim); handedTo is the inode of the kernel socket
	// the one that succeeded gave it to.
	hoMu     sync.Mutex
	handedTo uint64
}

// newSock wraps engine socket id, counted against the stack; false if the
// stack is closing.
func (s *Stack) newSock(c *sock, id stack.SockID, r reservation) bool {
	if !s.hold() {
		return false
	}
	*c = sock{stk: s, id: id, closing: make(chan struct{}), reserve: r}
	c.wq.id = id
	s.waits[id.Slot()].Store(&c.wq)
	return true
}

// init wraps engine socket id in c and reads its addresses; on failure
// c is closed (and the reservation released).
func (c *sock) init(s *Stack, id stack.SockID, r reservation) (la, ra netip.AddrPort, err error) {
	if !s.newSock(c, id, r) {
		r.release()
		return la, ra, net.ErrClosed
	}
	if la, ra, err = c.addrs(); err != nil {
		c.close()
	}
	return la, ra, err
}

// close releases the socket; false if it was closed already.
func (c *sock) close() bool { return c.shut(true, false) }

// shut ends c, once: its waiters go, its engine socket is closed (unless
// a handover took it), its reservation released (unless the caller
// keeps it), its hold on the stack given back. False if c was ended
// already.
func (c *sock) shut(closeEngine, keepReservation bool) bool {
	if c.closed.Swap(true) {
		return false
	}
	close(c.closing)
	s := c.stk
	s.waits[c.id.Slot()].CompareAndSwap(&c.wq, nil)
	if closeEngine && s.enter() {
		s.st.Close(c.id)
		s.leave()
	}
	c.resMu.Lock()
	if keepReservation {
		c.reserve = reservation{}
	}
	c.reserve.release()
	c.resMu.Unlock()
	s.release()
	return true
}

// check is the start of every operation: a closed socket or a passed
// deadline fails it.
func (c *sock) check(dl *deadline) error {
	if c.closed.Load() || c.stk.closed.Load() {
		return net.ErrClosed
	}
	if dl != nil && dl.passed() {
		return errTimeoutNow
	}
	return nil
}

// errTimeoutNow is what net reports for a passed deadline.
var errTimeoutNow error = os.ErrDeadlineExceeded

// engineErr maps an engine error for syscall: a socket the engine no
// longer knows was closed under us (the stack closed).
func (c *sock) engineErr(syscallName string, err error) error {
	if err == stack.ErrBadSocket {
		return net.ErrClosed
	}
	return sysErr(syscallName, err)
}

func (c *sock) setDeadline(t time.Time) error {
	if err := c.check(nil); err != nil {
		return err
	}
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

func (c *sock) setReadDeadline(t time.Time) error {
	if err := c.check(nil); err != nil {
		return err
	}
	c.rd.set(t)
	return nil
}

func (c *sock) setWriteDeadline(t time.Time) error {
	if err := c.check(nil); err != nil {
		return err
	}
	c.wd.set(t)
	return nil
}

// setOption sets an engine option, as setsockopt would.
func (c *sock) setOption(o stack.Option, v int) error {
	if err := c.check(nil); err != nil {
		return err
	}
	if !c.stk.enter() {
		return net.ErrClosed
	}
	defer c.stk.leave()
	if err := c.stk.st.SetOption(c.id, o, v); err != nil {
		return c.engineErr("setsockopt", err)
	}
	return nil
}

// addrs reads the socket's local and remote addresses; a wildcard local
// address reads as the stack's.
func (c *sock) addrs() (la, ra netip.AddrPort, err error) {
	s := c.stk
	if !s.enter() {
		return la, ra, net.ErrClosed
	}
	defer s.leave()
	la, _ = s.st.LocalAddr(c.id)
	ra, _ = s.st.RemoteAddr(c.id)
	if la.Addr().IsUnspecified() {
		la = netip.AddrPortFrom(s.addr.Addr(), la.Port())
	}
	return la, ra, nil
}

// openAt opens an engine socket bound to ap (for listening: SO_REUSEADDR,
// as net sets on listeners). kern, if not nil, is the kernel socket that
// holds the port: the proof onloadd asks for.
func (s *Stack) openAt(p stack.Proto, ap netip.AddrPort, listen bool, kern syscall.Conn) (stack.SockID, error) {
	return s.openAtFD(p, ap, listen, connFD(kern), false)
}

// openAtFD is openAt with the kernel socket's descriptor (-1: none);
// shared: other processes hold it too (ListenDesc).
func (s *Stack) openAtFD(p stack.Proto, ap netip.AddrPort, listen bool, proof int, shared bool) (stack.SockID, error) {
	if !s.enter() {
		return stack.NullSock, net.ErrClosed
	}
	defer s.leave()
	id, err := s.st.Open(p)
	if err != nil {
		return stack.NullSock, sysErr("socket", err)
	}
	if listen {
		s.st.SetOption(id, stack.ReuseAddr, 1)
	}
	if listen {
		// Bound and listening in one hold of the lock: no SYN finds
		// the port steered here and no listener (stack.BindListen).
		// The listen of a TCP socket just opened and bound cannot fail:
		// an error is the bind's, named as net names it.
		if err = s.withProof(p, ap, proof, shared, func() error { return s.st.BindListen(id, ap, 4096) }); err != nil {
			err = sysErr("bind", err)
		}
	} else if err = s.bind(p, id, ap, proof, false); err != nil {
		err = sysErr("bind", err)
	}
	if err != nil {
		s.st.Close(id)
		return stack.NullSock, err
	}
	return id, nil
}

// connect opens a socket bound to laddr (reserved, on a host stack) and
// connects it to raddr: for TCP, the handshake has begun.
func (s *Stack) connect(p stack.Proto, laddr, raddr netip.AddrPort) (stack.SockID, reservation, error) {
	if p == stack.TCP && laddr.Port() == 0 {
		// From a shared port, with a kernel socket of its own (not
		// bound: the port's proof holds it) for a handover.
		if id, err := s.openShared(raddr, nil); err != errNoSharedPort {
			if err != nil {
				return stack.NullSock, reservation{}, err
			}
			return id, s.kernelReservation(id), nil
		}
	}
	id, r, err := s.openBound(p, laddr)
	if err != nil {
		return stack.NullSock, r, err
	}
	if !s.enter() {
		r.release()
		return stack.NullSock, r, net.ErrClosed
	}
	err = s.st.Connect(id, raddr)
	s.leave()
	if err != nil && err != stack.ErrInProgress {
		s.closeID(id)
		r.release()
		return stack.NullSock, reservation{}, sysErr("connect", err)
	}
	return id, r, nil
}

// bind binds engine socket id to ap; connecting: the socket connects
// next (stack.BindConnecting: only its four-tuple must be free). On a
// stack of onloadd's, the port is steered by a request that carries
// proof, the kernel socket holding it.
func (s *Stack) bind(p stack.Proto, id stack.SockID, ap netip.AddrPort, proof int, connecting bool) error {
	bind := func() error {
		if connecting {
			return s.st.BindConnecting(id, ap)
		}
		return s.st.Bind(id, ap)
	}
	if s.proofs != nil && connecting && p == stack.TCP && ap.Port() != 0 {
		// Steered before the engine's lock (daemonFilters).
		return s.proofs.withProof(p, ap.Port(), proof, false, func() error { return s.proofs.steerFirst(ap, proof, bind) })
	}
	return s.withProof(p, ap, proof, false, bind)
}

// withProof runs bind, a call that binds an engine socket to ap, with
// proof as the port's proof for onloadd's filter (on a stack of
// onloadd's); shared: other processes hold proof's socket too.
func (s *Stack) withProof(p stack.Proto, ap netip.AddrPort, proof int, shared bool, bind func() error) error {
	if s.proofs == nil {
		return bind()
	}
	return s.proofs.withProof(p, ap.Port(), proof, shared, bind)
}

// connFD is c's descriptor (valid while c is open), or -1.
func connFD(c syscall.Conn) int {
	if c == nil {
		return -1
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return -1
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}
