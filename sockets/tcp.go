package sockets

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/stack"
)

// TCPConn is an accelerated TCP connection. It implements net.Conn and the
// methods of *net.TCPConn that do not need a kernel file descriptor.
type TCPConn struct {
	sock
	laddr, raddr *net.TCPAddr
	rmu, wmu     sync.Mutex // one reader and one writer at a time, as net

	// moved is the kernel's connection once the kernel took this one
	// over on its reservation (takenOver); from then on c is a shell
	// around it.
	moved  atomic.Pointer[net.TCPConn]
	moveMu sync.Mutex
}

var _ net.Conn = (*TCPConn)(nil)

func tcpAddr(a netip.AddrPort) *net.TCPAddr {
	return &net.TCPAddr{IP: a.Addr().AsSlice(), Port: int(a.Port())}
}

// newTCPConn wraps a connected engine socket.
func (s *Stack) newTCPConn(id stack.SockID, r reservation, ka net.KeepAliveConfig) (*TCPConn, error) {
	c := &TCPConn{}
	la, ra, err := c.init(s, id, r)
	if err != nil {
		return nil, err
	}
	c.laddr, c.raddr = tcpAddr(la), tcpAddr(ra)
	// As net: no Nagle, keepalive as configured (15s by default).
	if err := c.setOption(stack.NoDelay, 1); err != nil {
		c.close()
		return nil, err
	}
	if err := c.SetKeepAliveConfig(ka); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *TCPConn) opErr(op string, err error) error {
	if err == io.EOF {
		return err
	}
	return opError(op, "tcp", c.laddr, c.raddr, err)
}

// Read reads data from the connection, as net.TCPConn.Read: io.EOF at the
// end of the stream, and a *net.OpError otherwise.
func (c *TCPConn) Read(b []byte) (int, error) {
	if k := c.moved.Load(); k != nil {
		return k.Read(b)
	}
	if len(b) == 0 {
		if err := c.check(nil); err != nil {
			return 0, c.opErr("read", err)
		}
		return 0, nil
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	s := c.stk
	var sp spin
	defer sp.end()
	for {
		if err := c.check(&c.rd); err != nil {
			if k := c.takenOver(err); k != nil {
				return k.Read(b)
			}
			return 0, c.opErr("read", err)
		}
		if !s.enter() {
			if k := c.takenOver(net.ErrClosed); k != nil {
				return k.Read(b)
			}
			return 0, c.opErr("read", net.ErrClosed)
		}
		// As in Write: what this poll sends waits for the goroutines
		// the stack woke, whose sends kick it. Otherwise the ACK the
		// read owes waits for this goroutine's answer to carry it, or
		// its next wait to send it (awaitUnless), as the shim's reads'
		// do: a server of a connection a request sent a pure ACK of
		// each request before its answer. Should the goroutine go
		// elsewhere, the Sleeper sends it (boundHeldKick), or the
		// delayed-ACK timer.
		recv, more := s.st.RecvCorked, s.wakes.busy()
		if more {
			recv = s.st.RecvMore
		}
		n, err := recv(c.id, b, false)
		if more {
			s.kickIfLast()
		} else if s.st.CorkedOwed() {
			s.boundHeldKick(readKickWait)
		}
		s.leave()
		switch {
		case err == nil && n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err != stack.ErrWouldBlock:
			err = c.engineErr("read", err)
			if k := c.takenOver(err); k != nil {
				return k.Read(b)
			}
			return 0, c.opErr("read", err)
		}
		c.await(&sp, stack.Readable, &c.rd, 0)
	}
}

// Write writes data to the connection. It returns when all of b is queued
// for sending, or with the count written so far and the error.
func (c *TCPConn) Write(b []byte) (int, error) {
	if k := c.moved.Load(); k != nil {
		return k.Write(b)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	s := c.stk
	var sp spin
	defer sp.end()
	total := 0
	for {
		if err := c.check(&c.wd); err != nil {
			if k := c.takenOver(err); k != nil {
				n, err := k.Write(b[total:])
				return total + n, err
			}
			return total, c.opErr("write", err)
		}
		if total == len(b) {
			return total, nil
		}
		if !s.enter() {
			if k := c.takenOver(net.ErrClosed); k != nil {
				n, err := k.Write(b[total:])
				return total + n, err
			}
			return total, c.opErr("write", net.ErrClosed)
		}
		// Goroutines the stack woke are about to run, and likely to send
		// too: the kick that hands the kernel our frames waits for them.
		send, more := s.st.Send, s.wakes.busy()
		if more {
			send = s.st.SendMore
			s.wakes.heldSends.Add(1)
		}
		n, err := send(c.id, b[total:])
		if more {
			s.kickIfLast()
		}
		s.leave()
		total += n
		var retry time.Duration
		switch {
		case err == nil:
			continue
		case err == stack.ErrFramesBusy:
			retry = time.Millisecond
		case err != stack.ErrWouldBlock:
			err = c.engineErr("write", err)
			if k := c.takenOver(err); k != nil {
				n, err := k.Write(b[total:])
				return total + n, err
			}
			return total, c.opErr("write", err)
		}
		c.await(&sp, stack.Writable, &c.wd, retry)
	}
}

// Close closes the connection: the peer gets a FIN after the data queued
// (or a reset, if data arrived that was never read, or SetLinger(0)).
// Blocked Read and Write calls return net.ErrClosed.
func (c *TCPConn) Close() error {
	if k := c.moved.Load(); k != nil {
		return k.Close()
	}
	if !c.close() {
		return c.opErr("close", net.ErrClosed)
	}
	return nil
}

// CloseRead shuts down the reading side: reads return io.EOF.
func (c *TCPConn) CloseRead() error { return c.shutdown(syscall.SHUT_RD) }

// CloseWrite shuts down the writing side: the peer reads io.EOF after the
// data queued.
func (c *TCPConn) CloseWrite() error { return c.shutdown(syscall.SHUT_WR) }

func (c *TCPConn) shutdown(how int) error {
	if k := c.moved.Load(); k != nil {
		if how == syscall.SHUT_RD {
			return k.CloseRead()
		}
		return k.CloseWrite()
	}
	if err := c.check(nil); err != nil {
		return c.opErr("close", err)
	}
	if !c.stk.enter() {
		return c.opErr("close", net.ErrClosed)
	}
	err := c.stk.st.Shutdown(c.id, how)
	c.stk.leave()
	if err != nil {
		return c.opErr("close", c.engineErr("shutdown", err))
	}
	// Wake our own readers: they now read io.EOF.
	c.wq.wake(nil)
	return nil
}

func (c *TCPConn) LocalAddr() net.Addr  { return c.laddr }
func (c *TCPConn) RemoteAddr() net.Addr { return c.raddr }

func (c *TCPConn) SetDeadline(t time.Time) error {
	if k := c.moved.Load(); k != nil {
		return k.SetDeadline(t)
	}
	return c.setErr(c.setDeadline(t))
}

func (c *TCPConn) SetReadDeadline(t time.Time) error {
	if k := c.moved.Load(); k != nil {
		return k.SetReadDeadline(t)
	}
	return c.setErr(c.setReadDeadline(t))
}

func (c *TCPConn) SetWriteDeadline(t time.Time) error {
	if k := c.moved.Load(); k != nil {
		return k.SetWriteDeadline(t)
	}
	return c.setErr(c.setWriteDeadline(t))
}

func (c *TCPConn) setErr(err error) error {
	if err != nil {
		return c.opErr("set", err)
	}
	return nil
}

// SetNoDelay turns Nagle's algorithm off (true, the default, as in net) or
// on.
func (c *TCPConn) SetNoDelay(noDelay bool) error {
	return c.setErr(c.setOption(stack.NoDelay, b2i(noDelay)))
}

// SetKeepAlive turns keepalive probes on or off.
func (c *TCPConn) SetKeepAlive(keepalive bool) error {
	return c.setErr(c.setOption(stack.KeepAlive, b2i(keepalive)))
}

// SetKeepAlivePeriod sets the idle time before the first probe and the
// time between probes, rounded up to whole seconds, as net does.
func (c *TCPConn) SetKeepAlivePeriod(d time.Duration) error {
	secs := keepSecs(d)
	if err := c.setOption(stack.KeepIdle, secs); err != nil {
		return c.setErr(err)
	}
	return c.setErr(c.setOption(stack.KeepIntvl, secs))
}

// SetKeepAliveConfig configures keepalive as net.TCPConn's does: Idle and
// Interval 0 mean 15s, Count 0 means 9, and -1 leaves a value unchanged.
func (c *TCPConn) SetKeepAliveConfig(cfg net.KeepAliveConfig) error {
	if err := c.setOption(stack.KeepAlive, b2i(cfg.Enable)); err != nil {
		return c.setErr(err)
	}
	if !cfg.Enable {
		return nil
	}
	for _, o := range []struct {
		opt stack.Option
		v   int
	}{
		{stack.KeepIdle, keepDuration(cfg.Idle)},
		{stack.KeepIntvl, keepDuration(cfg.Interval)},
		{stack.KeepCount, keepCount(cfg.Count)},
	} {
		if o.v < 0 {
			continue
		}
		if err := c.setOption(o.opt, o.v); err != nil {
			return c.setErr(err)
		}
	}
	return nil
}

// SetLinger sets what Close does with unsent data: sec < 0 (the default)
// sends it in the background; 0 discards it and resets the connection;
// sec > 0 behaves as sec < 0 (the data is sent in the background; net's
// documentation allows Close not to block).
func (c *TCPConn) SetLinger(sec int) error {
	v := -1
	if sec == 0 {
		v = 0
	}
	return c.setErr(c.setOption(stack.Linger, v))
}

// SetReadBuffer sets the receive buffer size (clamped to what the stack
// supports, as the kernel clamps).
func (c *TCPConn) SetReadBuffer(bytes int) error {
	return c.setErr(c.setOption(stack.RecvBuffer, clampBuffer(bytes)))
}

// SetWriteBuffer sets the send buffer size (clamped).
func (c *TCPConn) SetWriteBuffer(bytes int) error {
	return c.setErr(c.setOption(stack.SendBuffer, clampBuffer(bytes)))
}

// Info reports the connection's transport state, as Linux's TCP_INFO:
// round-trip time, windows, what is in flight, SACKed and lost, the
// congestion control and the buffers as autotuning left them.
func (c *TCPConn) Info() (stack.TCPInfo, error) {
	if err := c.check(nil); err != nil {
		return stack.TCPInfo{}, err
	}
	if !c.stk.enter() {
		return stack.TCPInfo{}, net.ErrClosed
	}
	defer c.stk.leave()
	return c.stk.st.TCPInfo(c.id)
}

// SetUserTimeout sets how long sent data may stay unacknowledged before
// the connection is given up (TCP_USER_TIMEOUT, RFC 5482); 0 turns it off.
func (c *TCPConn) SetUserTimeout(d time.Duration) error {
	if d < 0 || d > (1<<31-1)*time.Millisecond {
		return c.setErr(fmt.Errorf("user timeout %v: must be from 0 to %v", d, (1<<31-1)*time.Millisecond))
	}
	return c.setErr(c.setOption(stack.UserTimeout, int(d/time.Millisecond)))
}

// MultipathTCP reports false: the connection is plain TCP.
func (c *TCPConn) MultipathTCP() (bool, error) { return false, nil }

// SyscallConn reports that there is no kernel socket under the
// connection: its state lives in the user-space stack.
func (c *TCPConn) SyscallConn() (syscall.RawConn, error) {
	return nil, c.opErr("raw-control", errNoFD)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Bounds the engine takes for keepalive settings and buffers.
const (
	minBuffer = 2 << 10
	maxBuffer = 64 << 20
)

func clampBuffer(n int) int { return min(max(n, minBuffer), maxBuffer) }

// keepSecs rounds a keepalive period up to whole seconds, within the
// engine's range.
func keepSecs(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return min(max(s, 1), 32767)
}

// keepDuration is net's reading of a KeepAliveConfig duration: 0 means
// 15s, negative means unchanged (-1).
func keepDuration(d time.Duration) int {
	switch {
	case d < 0:
		return -1
	case d == 0:
		return 15
	}
	return keepSecs(d)
}

func keepCount(n int) int {
	switch {
	case n < 0:
		return -1
	case n == 0:
		return 9
	}
	return min(n, 127)
}
