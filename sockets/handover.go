package sockets

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/internal/repair"
	"github.com/xdp-onload/onload/stack"
)

// exitHandover is how long an exiting process's connections have to
// deliver their data and FIN in the stack (Stack.Exit) before those
// still at it are handed over to the kernel: a peer that is there
// acknowledges within a round trip or two, and a handover takes a
// millisecond or so of system calls.
const exitHandover = 20 * time.Millisecond

// exitDrain bounds Exit's wait for the NIC to take the last frames
// (Stack.DrainNIC): a kick takes microseconds, a loaded machine's
// scheduler longer.
const exitDrain = 20 * time.Millisecond

// handOverUndelivered gives the kernel each connection closed by its user
// that is still delivering its data or FIN, on a kernel socket of its own
// (its user's is gone), and closes that socket: the kernel finishes the
// connection as it does the sockets of a process that exits. One that
// cannot be handed over stays in the stack.
func (s *Stack) handOverUndelivered() {
	for _, id := range s.st.UndeliveredSockets() {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			logf(levelDebug, "exit: no socket to hand a connection over on: %v", err)
			return
		}
		st, err := s.st.HandoverOrphan(id, fd, handoverWrite)
		unix.Close(fd)
		if err != nil {
			logf(levelDebug, "exit: a closed connection still delivering was not handed over to the kernel: %v", err)
			if errors.Is(err, repair.ErrPermission) {
				return
			}
			continue
		}
		logf(levelDebug, "exit: handed %v->%v over to the kernel to deliver %d bytes and the FIN", st.Local, st.Remote, st.Sent+st.Unsent)
	}
}

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
// On a stack this process made it needs CAP_NET_ADMIN (TCP_REPAIR); on
// one from onloadd, onloadd repairs. The connection must be ESTABLISHED
// or CLOSE-WAIT, or shut for sending (CloseWrite) with its FIN not yet
// acknowledged, which the kernel then sends after the data. When it fails
// before the connection left the stack, c is unchanged; when the kernel
// socket could not be made after that, the peer is reset and c closed,
// and the error says so.
func (c *TCPConn) Handover() (*net.TCPConn, error) {
	fd, err := c.handover()
	var k *net.TCPConn
	if err == nil {
		k, err = c.kernelConn(fd)
	}
	if err != nil {
		return nil, &net.OpError{Op: "handover", Net: "tcp", Source: c.laddr, Addr: c.raddr, Err: err}
	}
	return k, nil
}

// kernelConn makes fd, the kernel's socket of c's connection, a
// *net.TCPConn (fd is its: closed either way).
func (c *TCPConn) kernelConn(fd int) (*net.TCPConn, error) {
	f := os.NewFile(uintptr(fd), fmt.Sprintf("tcp %v->%v", c.laddr, c.raddr))
	nc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, err
	}
	return nc.(*net.TCPConn), nil
}

// handover re-creates the connection on a kernel socket and returns its
// descriptor (the reservation's, if it had one), retiring c.
func (c *sock) handover() (int, error) {
	c.hoMu.Lock()
	defer c.hoMu.Unlock()
	if err := c.check(nil); err != nil {
		return -1, err
	}
	fd := c.reserve.fd1 - 1
	own := fd < 0 // a socket made here; a reservation is c's until it succeeds
	if own {
		var err error
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return -1, os.NewSyscallError("socket", err)
		}
	}
	return fd, c.handoverOnLocked(fd, own)
}

// Handover hands d's connection over to the kernel on kfd, d's own
// kernel socket (so that every holder of kfd holds the connection
// after), and closes d; kfd stays the caller's. The errors are
// TCPConn.Handover's: one that wraps stack.ErrHandoverLost means the
// connection is gone; with any other, d is unchanged.
//
// A handover of d by another thread of this process, under way, is
// waited for: if it gave the connection to kfd's socket (a shim's
// parent closing the connection, handed over for its child, as the child
// asks for it on its copy of the same socket), that is done.
func (d *Desc) Handover(kfd int) error {
	d.hoMu.Lock()
	defer d.hoMu.Unlock()
	if err := d.check(nil); err != nil {
		if ino, ierr := repair.SocketInode(kfd); ierr == nil && d.handedTo != 0 && ino == d.handedTo {
			return nil
		}
		return err
	}
	return d.handoverOnLocked(kfd, false)
}

// handoverOnLocked hands c's connection over on fd, which the handover
// closes on failure if own; on success c is retired (and its
// reservation, fd unless own, is the caller's). c.hoMu is held.
func (c *sock) handoverOnLocked(fd int, own bool) error {
	s := c.stk
	c.handing.Store(true)
	defer c.handing.Store(false)
	la, ra, err := c.addrs()
	if err != nil {
		return err
	}
	if !ra.IsValid() {
		return unix.ENOTCONN
	}
	giveUp := func() {
		if own {
			unix.Close(fd)
		}
	}
	var st stack.HandoverStats
	if s.proofs != nil {
		// onloadd's stack: onloadd repairs (it has the privilege).
		st, err = s.proofs.handover(c.id, fd)
	} else {
		if !s.enter() {
			giveUp()
			return net.ErrClosed
		}
		st, err = s.st.Handover(c.id, fd, handoverWrite)
		s.leave()
	}
	switch {
	case errors.Is(err, stack.ErrHandoverLost):
		// The connection is gone (the peer was told), and with it c
		// and its reservation.
		giveUp()
		c.retire(false)
		return err
	case err != nil:
		giveUp()
		return c.engineErr("handover", err)
	}
	c.handedTo, _ = repair.SocketInode(fd)
	c.retire(!own)
	logf(levelDebug, "handed over %v->%v to the kernel in %v: %d unread (%d of them during the handover), %d unacknowledged and %d unsent bytes",
		la, ra, st.Took, st.Unread+st.CaughtUp, st.CaughtUp, st.Sent, st.Unsent)
	return nil
}

// retire closes c after its engine socket was handed over: the engine
// socket is not c's to close any more, nor, when tookReservation, its
// kernel socket.
func (c *sock) retire(tookReservation bool) { c.shut(false, tookReservation) }

// handover asks onloadd to hand connection id over to the kernel on fd.
// A refusal leaves the connection as it was; a failure after it left
// the stack wraps stack.ErrHandoverLost, as stack.Handover's does.
//
// It asks on a control connection of its own: on the stack's, the call
// held the connection while onloadd waited for the stack's lock, and a
// thread of ours that held the lock and asked onloadd for a filter
// waited for the connection (a deadlock until the call's timeout, 10 s,
// once in some 300 handovers of TestHandoverLateSegments).
func (f *daemonFilters) handover(id stack.SockID, fd int) (stack.HandoverStats, error) {
	var st stack.HandoverStats
	c, err := dialDaemon(f.path, filepath.Base(os.Args[0])+" (handover)")
	if err != nil {
		return st, fmt.Errorf("onloadd at %s: %w", f.path, err)
	}
	defer c.Close()
	rep, fds, err := c.Call(control.Request{Op: control.OpHandover,
		Handover: &control.HandoverRequest{Stack: f.stack, Sock: uint32(id)}}, fd)
	control.CloseFDs(fds)
	var ce *control.Error
	switch {
	case errors.As(err, &ce) && ce.Code == control.CodeInternal:
		return st, fmt.Errorf("%w: %w", stack.ErrHandoverLost, err)
	case err != nil:
		return st, err
	case rep.Handover == nil:
		return st, fmt.Errorf("%w: onloadd's handover reply is empty", stack.ErrHandoverLost)
	}
	h := rep.Handover
	st.Unread, st.Sent, st.Unsent, st.Took = h.Unread, h.Sent, h.Unsent, time.Duration(h.TookNs)
	return st, nil
}

// HandoverVia says where a process that cannot run this stack (a child
// forked after the shim's core loaded) asks for a handover of one of its
// connections: onloadd's control socket and the stack's number there.
// ok is false for a stack the process made itself: only the process
// runs it.
func (s *Stack) HandoverVia() (socket string, stackID uint32, ok bool) {
	if s.proofs == nil {
		return "", 0, false
	}
	return s.proofs.path, s.proofs.stack, true
}

// HandedOver reports whether a handover took d's engine socket (under
// way, or ended moments ago): the caller, which found the socket gone,
// waits for the kernel's connection on its kernel socket.
func (d *Desc) HandedOver() bool { return d.stk.HandedOver(d.id) }

// SockID is the engine's name for d (what a handover request names).
func (d *Desc) SockID() uint32 { return uint32(d.id) }

// selfPid is this process's id: the Go core never runs in a child
// forked after it loaded (the shim hands such a child's connections to
// the kernel), and a Go program forks only to exec.
var selfPid = os.Getpid()

// recordKernelFD tells a stack of onloadd's that fd (if any) names
// connection id here: onloadd, stopping, hands the connection over on
// it (stack.HandoverCandidates), and this process then finds the kernel's
// connection on that fd (TCPConn, and the shim's kernel_took).
func (s *Stack) recordKernelFD(id stack.SockID, fd int) {
	if s.proofs == nil || fd < 0 || !s.enter() {
		return
	}
	s.st.SetKernelFD(id, selfPid, fd)
	s.leave()
}

// takenOver is asked when c found its engine socket gone (err is
// net.ErrClosed): onloadd, stopping, hands every connection over to the
// kernel on its own kernel socket (stack.HandoverCandidates), which for
// a dialled connection is c's reservation. If the kernel has the
// connection there, c moves onto it (c.moved, with c's deadlines) and
// the kernel's connection is returned; nil otherwise.
func (c *TCPConn) takenOver(err error) *net.TCPConn {
	if !errors.Is(err, net.ErrClosed) || c.handing.Load() {
		return nil // not gone, or gone by our own Handover (which says so)
	}
	c.moveMu.Lock()
	defer c.moveMu.Unlock()
	if k := c.moved.Load(); k != nil {
		return k
	}
	nfd := c.takeReservation()
	if nfd < 0 {
		return nil
	}
	k, err := c.kernelConn(nfd)
	if err != nil {
		return nil
	}
	if ns := c.rd.ns.Load(); ns != 0 {
		k.SetReadDeadline(time.Unix(0, ns))
	}
	if ns := c.wd.ns.Load(); ns != 0 {
		k.SetWriteDeadline(time.Unix(0, ns))
	}
	c.moved.Store(k)
	c.retire(false)
	logf(levelInfo, "%v->%v: the kernel has taken the connection over (onloadd stopped); it goes on there", c.laddr, c.raddr)
	return k
}

// takeReservation returns a copy of c's reservation once the kernel has
// made the connection on it (a handover, whose end it waits for, up to
// handoverWrite); -1 if no handover took c's engine socket. The
// reservation is not closed meanwhile.
func (c *TCPConn) takeReservation() int {
	c.resMu.Lock()
	defer c.resMu.Unlock()
	fd := c.reserve.fd1 - 1
	if fd < 0 || c.closed.Load() || !c.stk.waitHandedOver(c.id, fd) {
		return -1
	}
	nfd, err := unix.Dup(fd)
	if err != nil {
		return -1
	}
	return nfd
}

// kernelReservation gives a connection accepted on a stack of onloadd's,
// or opened from a shared port, a kernel socket of its own (not bound:
// the listener, or the port's proof, holds the port), recorded for
// onloadd, which hands the connection over on it when it stops. It is
// made in the calling thread's network namespace, as a dialled
// connection's reservation is. A stack this process made
// needs none: it dies with the process. The zero reservation if none
// could be made (the connection then dies with onloadd, as before).
func (s *Stack) kernelReservation(id stack.SockID) reservation {
	if s.proofs == nil {
		return reservation{}
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		logf(levelDebug, "connection without a kernel socket of its own (%v): onloadd cannot hand it over when it stops", err)
		return reservation{}
	}
	s.recordKernelFD(id, fd)
	return reservation{fd1: fd + 1}
}

// waitHandedOver waits, up to handoverWrite, for a handover that took
// engine socket id to make the connection on fd, its kernel socket: the
// engine's socket goes first (BeginHandover), then the kernel socket is
// connected in repair mode, then it leaves repair mode. false if no
// handover took the socket, or it did not end in time.
func (s *Stack) waitHandedOver(id stack.SockID, fd int) bool {
	deadline := time.Now().Add(handoverWrite)
	for {
		if _, err := unix.Getpeername(fd); err == nil && !repair.InProgress(fd) {
			return true
		} else if err != nil && !s.HandedOver(id) {
			return false // the connection is gone, not handed over
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// HandedOver reports whether a handover took engine socket id (under
// way, or ended moments ago): for the shim's core, whose process found
// the socket gone.
func (s *Stack) HandedOver(id stack.SockID) bool {
	if !s.enter() {
		return false
	}
	defer s.leave()
	return s.st.HandedOver(id)
}
