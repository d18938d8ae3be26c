package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/stack"
)

// Handovers for children. A child forked after the core loaded cannot
// run Go; on its first use of an inherited connection it asks for the
// connection's handover to the kernel (fdtable.c, child_takes), or, of
// an inherited listener, for its port to go to the listener's kernel
// socket, which the two share (RetireListener), in
// onloadd's protocol (hello, then handover with the connection's kernel
// socket beside it). On a stack from onloadd it asks onloadd. On a stack
// this process made, only this process can: it serves those requests on
// an abstract Unix socket of its own, made at the first fork that needs
// it (handoverService), for processes of its user.

var (
	hoOnce sync.Once
	hoPath string // "@name": an abstract address
	hoErr  error
)

// handoverService starts serving children's handover requests, once,
// and returns where (an address in onloadd's notation, "@" for an
// abstract one).
func handoverService() (string, error) {
	hoOnce.Do(func() {
		name := fmt.Sprintf("onload-handover-%d", os.Getpid())
		var l *net.UnixListener
		l, hoErr = net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + name, Net: "unixpacket"})
		if hoErr != nil {
			hoErr = fmt.Errorf("serve handovers for children: %w", hoErr)
			return
		}
		hoPath = "@" + name
		go serveHandovers(l)
	})
	return hoPath, hoErr
}

func serveHandovers(l *net.UnixListener) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		go serveChild(c)
	}
}

// serveChild answers one child: hello, then handover requests.
func serveChild(uc *net.UnixConn) {
	defer uc.Close()
	if err := sameUser(uc); err != nil {
		sockets.LogDebug("handover service: %v", err)
		return
	}
	c := control.NewConn(uc)
	for {
		msg, fds, err := c.Recv()
		if err != nil {
			return
		}
		rep := answer(msg, fds)
		control.CloseFDs(fds)
		rep.V = control.Version
		if c.Send(rep) != nil {
			return
		}
	}
}

func sameUser(uc *net.UnixConn) error {
	rc, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	if cerr != nil {
		return cerr
	}
	if int(cred.Uid) != os.Geteuid() {
		return fmt.Errorf("pid %d of uid %d may not have this process's connections handed over", cred.Pid, cred.Uid)
	}
	return nil
}

func answer(msg []byte, fds []int) *control.Reply {
	req, err := control.ParseRequest(msg)
	if err != nil {
		seq := uint32(0)
		if req != nil {
			seq = req.Seq
		}
		return &control.Reply{Seq: seq, Error: err.Error(), Code: control.CodeInvalid}
	}
	rep := &control.Reply{Seq: req.Seq}
	switch {
	case req.Op == control.OpHello:
		rep.Hello = &control.HelloReply{Daemon: "onload core", PID: os.Getpid()}
	case req.Op != control.OpHandover || len(fds) != 1:
		rep.Error, rep.Code = "a child of this process may only ask for a handover, with its socket", control.CodeInvalid
	default:
		d := byID(req.Handover.Sock)
		if d == nil {
			rep.Error, rep.Code = fmt.Sprintf("no accelerated socket %#x here", req.Handover.Sock), control.CodeInvalid
			break
		}
		if on, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err == nil && on == 1 {
			// A listener the child inherited: its port goes to this
			// kernel socket, which the two share (the daemon's
			// retireForChild).
			if err := d.RetireListener(); err != nil {
				rep.Error, rep.Code = err.Error(), control.CodeInvalid
				break
			}
			rep.Handover = &control.HandoverReply{}
			break
		}
		if err := d.Handover(fds[0]); err != nil {
			rep.Error, rep.Code = err.Error(), control.CodeUnavailable
			if errors.Is(err, stack.ErrHandoverLost) {
				rep.Code = control.CodeInternal
			}
			break
		}
		rep.Handover = &control.HandoverReply{}
	}
	return rep
}

// byID finds the Desc of engine socket id among the handles.
func byID(id uint32) *sockets.Desc {
	mu.Lock()
	n := next
	mu.Unlock()
	for h := int32(1); h < n; h++ {
		if d := descs[h].Load(); d != nil && d.SockID() == id {
			return d
		}
	}
	return nil
}
