package daemon

import (
	"errors"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/internal/repair"
	"github.com/xdp-onload/onload/stack"
)

// Handover to the kernel (docs/ARCHITECTURE.md, "Handover"): TCP_REPAIR
// needs CAP_NET_ADMIN, so a client's connection is handed over here. The
// client sends the connection's own kernel socket (the fd every holder
// of the connection already has), and onloadd makes the kernel's
// connection on it with the state it reads from the stack's image:
// checked there like any image data.

// handoverWrite bounds how long a handover waits for the kernel socket
// to take the bytes the stack had not sent.
const handoverWrite = 10 * time.Second

// pinFilters are the filters of onloadd's own handle on a stack: the
// stack's ports are steered by its clients' requests (filters.go), so
// binding and releasing change nothing here; a handover pins the flow.
type pinFilters struct {
	steer *bpf.Steering
	id    bpf.StackID
}

func (pinFilters) AddListener(stack.Proto, netip.AddrPort) error    { return nil }
func (pinFilters) RemoveListener(stack.Proto, netip.AddrPort) error { return nil }

func (f pinFilters) PinFlow(p stack.Proto, local, remote netip.AddrPort) error {
	return f.steer.AddFlow(tcpFlow(local, remote), f.id)
}

func (f pinFilters) UnpinFlow(p stack.Proto, local, remote netip.AddrPort) error {
	return f.steer.RemoveFlow(tcpFlow(local, remote))
}

func tcpFlow(local, remote netip.AddrPort) bpf.Flow {
	return bpf.Flow{Proto: bpf.TCP, Local: local, Remote: remote}
}

// handover hands connection req.Sock of stack req.Stack over to the
// kernel on fd, for client c.
func (d *Daemon) handover(c *client, req *control.HandoverRequest, fd int) (*control.HandoverReply, error) {
	if c.netnsErr != nil {
		return nil, c.netnsErr
	}
	d.mu.Lock()
	s := d.stacks[bpf.StackID(req.Stack)]
	var err error
	switch {
	case s == nil:
		err = refuse(codeInvalid, "no stack %d", req.Stack)
	case c.cred.Uid != 0 && int(c.cred.Uid) != s.uid:
		err = refuse(codeDenied, "stack %d belongs to uid %d; only it and root may hand its connections over", req.Stack, s.uid)
	case s.quarantined != "":
		err = refuse(codeUnavailable, "stack %d was cut off (%s)", req.Stack, s.quarantined)
	}
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	var st stack.HandoverStats
	if gerr := guard(func() { st, err = s.st.Handover(stack.SockID(req.Sock), fd, handoverWrite) }); gerr != nil {
		d.mu.Lock()
		d.quarantineLocked(s, "handing a connection over: "+gerr.Error())
		d.mu.Unlock()
		return nil, gerr
	}
	switch {
	case errors.Is(err, stack.ErrBadSocket), errors.Is(err, stack.ErrHandoverState):
		return nil, refuse(codeInvalid, "stack %d socket %#x: %v", req.Stack, req.Sock, err)
	case errors.Is(err, repair.ErrPermission):
		return nil, refuse(codeUnavailable, "onloadd cannot repair sockets: %v", err)
	case errors.Is(err, unix.ENOTSOCK), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOPROTOOPT):
		return nil, refuse(codeInvalid, "the descriptor sent is not a TCP socket that can take the connection: %v", err)
	case errors.Is(err, stack.ErrHandoverLost):
		// An internal error: the client's connection is gone.
		d.log.Warn("handover failed", "stack", s.id, "sock", req.Sock, "client", c.String(), "err", err)
		return nil, err
	case err != nil:
		// The connection is still the stack's.
		return nil, refuse(codeUnavailable, "stack %d socket %#x not handed over: %v", req.Stack, req.Sock, err)
	}
	// A flow entry the stack had for the connection (its process's port
	// went) went with the pin.
	d.mu.Lock()
	delete(s.flows, tcpFlow(st.Local, st.Remote))
	d.mu.Unlock()
	d.log.Info("connection handed over to the kernel", "stack", s.id, "local", st.Local.String(), "remote", st.Remote.String(),
		"client", c.String(), "unread", st.Unread+st.CaughtUp, "unacked", st.Sent, "unsent", st.Unsent, "took", st.Took.String())
	return &control.HandoverReply{Unread: st.Unread + st.CaughtUp, Sent: st.Sent, Unsent: st.Unsent, TookNs: st.Took.Nanoseconds()}, nil
}
