package sockets

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// TCPListener is an accelerated TCP listener. Connections that arrive
// through the stack's interface are accepted by the stack; on a host
// interface the listener also listens in the kernel, on the same address
// and port, so clients on this host (through loopback) and on other
// interfaces are served too. Accept returns both kinds: *TCPConn and
// *net.TCPConn.
type TCPListener struct {
	sock
	addr net.Addr
	ka   net.KeepAliveConfig

	kern  net.Listener // the kernel's half, or nil
	kconn chan net.Conn
	kerr  chan error
	kwg   sync.WaitGroup
}

var _ net.Listener = (*TCPListener)(nil)

// kernelAccepts is how many kernel connections wait for Accept before the
// kernel's own backlog takes over.
const kernelAccepts = 64

func (s *Stack) newTCPListener(id stack.SockID, addr net.Addr, ka net.KeepAliveConfig, kern net.Listener) (*TCPListener, error) {
	l := &TCPListener{addr: addr, ka: ka, kern: kern}
	if !s.newSock(&l.sock, id, reservation{}) {
		return nil, net.ErrClosed
	}
	if kern != nil {
		l.kconn = make(chan net.Conn, kernelAccepts)
		l.kerr = make(chan error, 1)
		l.kwg.Add(1)
		go l.acceptKernel()
	}
	return l, nil
}

// acceptKernel takes connections from the kernel's half and queues them
// for Accept, waking it.
func (l *TCPListener) acceptKernel() {
	defer l.kwg.Done()
	for {
		c, err := l.kern.Accept()
		if err != nil {
			if l.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// As http.Server does with a temporary error: report it and
			// go on after a pause.
			select {
			case l.kerr <- err:
			default:
			}
			l.wq.wake(nil)
			select {
			case <-l.closing:
				return
			case <-time.After(5 * time.Millisecond):
			}
			continue
		}
		select {
		case l.kconn <- c:
		case <-l.closing:
			c.Close()
			return
		}
		l.wq.wake(nil)
	}
}

// Accept waits for and returns the next connection.
func (l *TCPListener) Accept() (net.Conn, error) {
	s := l.stk
	var sp spin
	defer sp.end()
	for {
		if err := l.check(&l.rd); err != nil {
			return nil, l.opErr(err)
		}
		if l.kern != nil {
			select {
			case c := <-l.kconn:
				return c, nil
			case err := <-l.kerr:
				return nil, err
			default:
			}
		}
		if !s.enter() {
			return nil, l.opErr(net.ErrClosed)
		}
		id, err := s.st.Accept(l.id)
		s.leave()
		if err == nil {
			r := s.kernelReservation(id)
			c, err := s.newTCPConn(id, r, l.ka)
			if err != nil {
				return nil, l.opErr(err)
			}
			return c, nil
		}
		if err != stack.ErrWouldBlock {
			return nil, l.opErr(l.engineErr("accept", err))
		}
		l.awaitUnless(&sp, stack.Readable, &l.rd, 0, l.kernelWaiting)
	}
}

// kernelWaiting says whether the kernel's half has a connection or an
// error for Accept. acceptKernel queues it before it wakes the listener.
func (l *TCPListener) kernelWaiting() bool {
	return l.kern != nil && (len(l.kconn) > 0 || len(l.kerr) > 0)
}

func (l *TCPListener) opErr(err error) error {
	return opError("accept", "tcp", nil, l.addr, err)
}

// Close stops listening. Connections already accepted stay open;
// connections not yet accepted are reset.
func (l *TCPListener) Close() error {
	if !l.close() {
		return opError("close", "tcp", nil, l.addr, net.ErrClosed)
	}
	if l.kern != nil {
		l.kern.Close()
		l.kwg.Wait()
		for {
			select {
			case c := <-l.kconn:
				c.Close()
				continue
			default:
			}
			break
		}
	}
	return nil
}

// Addr is the listening address (for a wildcard listen with a kernel
// half, as the kernel reports it).
func (l *TCPListener) Addr() net.Addr { return l.addr }

// SetDeadline sets the deadline for Accept.
func (l *TCPListener) SetDeadline(t time.Time) error {
	if err := l.setReadDeadline(t); err != nil {
		return opError("set", "tcp", nil, l.addr, err)
	}
	return nil
}

// SyscallConn reports that the listener has no single kernel socket.
func (l *TCPListener) SyscallConn() (syscall.RawConn, error) {
	return nil, opError("raw-control", "tcp", nil, l.addr, errNoFD)
}
