package sockets

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/repair"
	"github.com/xdp-onload/onload/stack"
)

// handoverWrite bounds how long a handover waits for the kernel socket
// to take the bytes the stack had not sent yet.
const handoverWrite = 10 * time.Second

// Handover moves the connection to the kernel, live: the kernel socket
// it returns carries on with the same sequence numbers, options and
// queued bytes (unread, unacknowledged and unsent), and the peer sees
// nothing but a window probe. c is closed afterwards; a Read or Write in
// progress on it returns net.ErrClosed, and what it had moved before the
// handover stays moved.
//
// It needs CAP_NET_ADMIN (TCP_REPAIR) and a stack this process made; an
// established connection with no FIN sent or received. When it fails
// before the connection left the stack, c is unchanged; when the kernel
// socket could not be made after that, the peer is reset and c closed,
// and the error says so.
func (c *TCPConn) Handover() (*net.TCPConn, error) {
	fd, err := c.handover()
	if err != nil {
		return nil, &net.OpError{Op: "handover", Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: err}
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("tcp %v->%v", c.laddr, c.raddr))
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, &net.OpError{Op: "handover", Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: err}
	}
	return nc.(*net.TCPConn), nil
}

// errHandoverDaemon: the stack is onloadd's, and its steering with it.
var errHandoverDaemon = errors.New("the connection is on a stack of onloadd's: handing it over is onloadd's work, not supported yet")

// handover re-creates the connection on a kernel socket and returns its
// descriptor (the reservation's, if it had one), retiring c.
func (c *sock) handover() (int, error) {
	s := c.stk
	if err := c.check(nil); err != nil {
		return -1, err
	}
	if s.proofs != nil {
		return -1, errHandoverDaemon
	}
	la, ra, err := c.addrs()
	if err != nil {
		return -1, err
	}
	if !ra.IsValid() {
		return -1, unix.ENOTCONN
	}
	fd := c.reserve.fd1 - 1
	own := fd < 0 // a socket made here; a reservation is c's until it succeeds
	if own {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return -1, os.NewSyscallError("socket", err)
		}
	}
	giveUp := func() {
		if own {
			unix.Close(fd)
		} else {
			unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0)
		}
	}
	if err := repair.Prepare(fd, la); err != nil {
		giveUp()
		return -1, err
	}
	if !s.enter() {
		giveUp()
		return -1, net.ErrClosed
	}
	conn, err := s.st.BeginHandover(c.id)
	if err != nil {
		s.leave()
		giveUp()
		return -1, c.engineErr("handover", err)
	}
	if err := s.restore(fd, c.id, conn); err != nil {
		s.st.AbortHandover(c.id)
		s.leave()
		unix.Close(fd)
		c.retire(!own)
		return -1, fmt.Errorf("the kernel socket could not be made, and the connection was reset: %w", err)
	}
	// The kernel has the connection: its segments go there now.
	if err := s.st.EndHandover(c.id); err != nil {
		logf(levelInfo, "handover of %v->%v: %v", la, ra, err)
	}
	s.leave()
	if err := repair.WriteAll(fd, conn.Unsent, handoverWrite); err != nil {
		// Bytes the application wrote would be lost: the peer is told.
		unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
		unix.Close(fd)
		c.retire(!own)
		return -1, fmt.Errorf("the kernel socket did not take the bytes not yet sent, and the connection was reset: %w", err)
	}
	c.retire(!own)
	logf(levelDebug, "handed over %v->%v to the kernel: %d unread, %d unacknowledged and %d unsent bytes",
		la, ra, len(conn.Unread), len(conn.Sent), len(conn.Unsent))
	return fd, nil
}

// restore re-creates conn, which BeginHandover gave for engine socket
// id, on fd, with the bytes that arrived since, and takes it out of
// repair mode.
func (s *Stack) restore(fd int, id stack.SockID, conn *repair.Conn) error {
	if err := repair.Restore(fd, conn); err != nil {
		return err
	}
	more, err := s.st.HandoverCatchUp(id)
	if err != nil {
		return err
	}
	if err := repair.Receive(fd, more); err != nil {
		return err
	}
	conn.Unread = append(conn.Unread, more...) // for the log
	return repair.Finish(fd)
}

// retire closes c after its engine socket was handed over: the engine
// socket is not c's to close any more, nor, when tookReservation, its
// kernel socket.
func (c *sock) retire(tookReservation bool) {
	if c.closed.Swap(true) {
		return
	}
	if tookReservation {
		c.reserve = reservation{}
	}
	close(c.closing)
	s := c.stk
	s.waits[c.id.Slot()].CompareAndSwap(&c.wq, nil)
	c.reserve.release()
	s.release()
}
