package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
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

// UnpinFlow removes PinFlow's entry; the connection may be the kernel's
// now, on a listener entry's port (bpf.Steering.MarkKernelFlows).
func (f pinFilters) UnpinFlow(p stack.Proto, local, remote netip.AddrPort) error {
	if err := f.steer.MarkKernelFlows(); err != nil {
		return err
	}
	return f.steer.RemoveFlow(tcpFlow(local, remote))
}

func tcpFlow(local, remote netip.AddrPort) bpf.Flow {
	return bpf.Flow{Proto: bpf.TCP, Local: local, Remote: remote}
}

// handoverStack is stack id, whose connections client c asks to hand
// over: root, or the stack's user, may; not a stack cut off.
func (d *Daemon) handoverStack(c *client, id uint32) (*dstack, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.stacks[bpf.StackID(id)]
	switch {
	case s == nil:
		return nil, refuse(codeInvalid, "no stack %d", id)
	case c.cred.Uid != 0 && int(c.cred.Uid) != s.uid:
		return nil, refuse(codeDenied, "stack %d belongs to uid %d; only it and root may hand its connections over", id, s.uid)
	case s.quarantined != "":
		return nil, refuse(codeUnavailable, "stack %d was cut off (%s)", id, s.quarantined)
	}
	return s, nil
}

// handover hands connection req.Sock of stack req.Stack over to the
// kernel on fd, for client c.
func (d *Daemon) handover(c *client, req *control.HandoverRequest, fd int) (*control.HandoverReply, error) {
	if c.netnsErr != nil {
		return nil, c.netnsErr
	}
	s, err := d.handoverStack(c, req.Stack)
	if err != nil {
		return nil, err
	}
	id := stack.SockID(req.Sock)
	if rep, ok, err := d.retireForChild(c, s, id, fd); ok {
		return rep, err
	}
	var st stack.HandoverStats
	var taken bool
	may := func(local netip.AddrPort) error { return d.mayRepair(s, local, fd) }
	if gerr := guard(func() {
		st, err = s.st.HandoverChecked(id, fd, handoverWrite, may)
		taken = errors.Is(err, stack.ErrBadSocket) && s.st.HandedOver(id)
	}); gerr != nil {
		d.mu.Lock()
		d.quarantineLocked(s, "handing a connection over: "+gerr.Error())
		d.mu.Unlock()
		return nil, gerr
	}
	if taken {
		// Another handover took the connection from the stack as this
		// request came (a process closing its copy for the child it
		// forked, as the child asks for it on its own): if that one
		// gives the connection to fd's socket, this is done too.
		st, done, err := s.st.AwaitHandover(id, fd, handoverWrite)
		switch {
		case done:
			return handoverReply(st), nil
		case errors.Is(err, stack.ErrHandoverLost):
			return nil, err
		case err == nil:
			err = stack.ErrBadSocket
		}
		return nil, refuse(codeInvalid, "stack %d socket %#x: %v", req.Stack, req.Sock, err)
	}
	var r *refusal
	if errors.As(err, &r) {
		// mayRepair's: nothing changed.
		return nil, err
	}
	switch {
	case errors.Is(err, stack.ErrBadSocket), errors.Is(err, stack.ErrHandoverState), errors.Is(err, stack.ErrHandoverMoved):
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
	return handoverReply(st), nil
}

// retireForChild: a child forked after the stack loaded cannot run the
// stack, and uses the listener it inherited (an accept, a poll): it
// asks for the listener's "handover", sending the listener's own kernel
// socket, whose inode is the port's filter's proof. The listener is
// retired (stack.RetireListener) and its port settled as a retiring
// unfilter's (ports.go): new connections go to that kernel socket, which
// the child and its parent share, as two processes share a listener on
// the kernel; those the stack's listener holds stay for its process's
// accepts, and its connections keep their frames by flow entries. ok
// false: fd is not a listening socket that is the proof of one of s's
// ports (a connection's, handed over as such).
func (d *Daemon) retireForChild(c *client, s *dstack, id stack.SockID, fd int) (rep *control.HandoverReply, ok bool, err error) {
	// A listening socket: a connection's kernel socket may be its port's
	// proof too (a connection's own port, in a Go program).
	if !listening(fd) {
		return nil, false, nil
	}
	var local netip.AddrPort
	if gerr := guard(func() { local, err = s.st.LocalAddr(id) }); gerr != nil || err != nil {
		return nil, false, nil
	}
	d.mu.Lock()
	var key bpf.Listener
	var f *filter
	for k, g := range s.filters {
		if k.Proto == bpf.TCP && k.Port == local.Port() && sameSocket(g.proof, fd) {
			key, f = k, g
			break
		}
	}
	d.mu.Unlock()
	if f == nil {
		return nil, false, nil
	}
	if gerr := guard(func() { err = s.st.RetireListener(id) }); gerr != nil {
		d.mu.Lock()
		d.quarantineLocked(s, "retiring a listener: "+gerr.Error())
		d.mu.Unlock()
		return nil, true, gerr
	}
	if err != nil {
		return nil, true, refuse(codeInvalid, "stack %d socket %#x on port %d: %v", s.id, uint32(id), local.Port(), err)
	}
	d.mu.Lock()
	if s.filters[key] == f && !f.gone {
		f.gone, f.retired = true, true
		d.settleRetiredLocked(s, key, f)
	}
	d.mu.Unlock()
	d.log.Info("listener's port given to its kernel socket, for a child forked after the stack loaded", "stack", s.id,
		"local", local.String(), "client", c.String())
	return &control.HandoverReply{}, true, nil
}

// handoverReply says what a handover moved.
func handoverReply(st stack.HandoverStats) *control.HandoverReply {
	return &control.HandoverReply{Unread: st.Unread + st.CaughtUp, Sent: st.Sent, Unsent: st.Unsent, TookNs: st.Took.Nanoseconds()}
}

// handOverAll hands every connection of every stack over to the kernel,
// before onloadd stops (the steering program goes with it, and with it
// the stacks' frames): on the kernel socket that names it in its
// process (stack.HandoverCandidates), which onloadd takes a copy of with
// pidfd_getfd, so that the process finds the kernel's connection on its
// own fd. A connection whose process or socket cannot be reached is
// left to end with the stack.
func (d *Daemon) handOverAll() {
	d.mu.Lock()
	stacks := make([]*dstack, 0, len(d.stacks))
	for _, s := range d.stacks {
		if s.quarantined == "" {
			stacks = append(stacks, s)
		}
	}
	d.mu.Unlock()
	for _, s := range stacks {
		moved, of, err := d.handOverStack(s)
		if err != nil {
			d.log.Warn("connections not handed over: onloadd stops", "stack", s.id, "err", err)
		} else if of > 0 {
			d.log.Info("connections handed over to the kernel: onloadd stops", "stack", s.id, "moved", moved, "of", of)
		}
	}
}

// handOverStack hands s's connections over (handOverAll's work for one
// stack) and says how many moved, of how many.
func (d *Daemon) handOverStack(s *dstack) (moved, of int, err error) {
	var cands []stack.Candidate
	if gerr := guard(func() { cands, err = s.st.HandoverCandidates() }); gerr != nil || err != nil {
		return 0, 0, errors.Join(gerr, err)
	}
	for _, c := range cands {
		if err := d.handOverOne(s, c); err != nil {
			d.log.Warn("connection not handed over", "stack", s.id, "local", c.Local.String(), "remote", c.Remote.String(),
				"pid", c.PID, "err", err)
			continue
		}
		moved++
	}
	return moved, len(cands), nil
}

// drain is OpDrain: stackdump handover.
func (d *Daemon) drain(c *client, id uint32) (*control.DrainReply, error) {
	s, err := d.handoverStack(c, id)
	if err != nil {
		return nil, err
	}
	moved, of, err := d.handOverStack(s)
	if err != nil {
		return nil, refuse(codeUnavailable, "stack %d: %v", id, err)
	}
	d.log.Info("connections handed over to the kernel: asked", "stack", s.id, "by", c.String(), "moved", moved, "of", of)
	return &control.DrainReply{Moved: moved, Of: of}, nil
}

// handOverOne hands candidate c of stack s over on its process's fd.
// The image's word for which process and fd is not trusted: the process
// must be the stack's user's, and the fd an IPv4 TCP socket that is not
// connected (repair.Prepare checks its port).
func (d *Daemon) handOverOne(s *dstack, c stack.Candidate) error {
	if uid, err := processUID(c.PID); err != nil {
		return err
	} else if s.uid != 0 && uid != s.uid {
		return fmt.Errorf("process %d is uid %d's, the stack uid %d's", c.PID, uid, s.uid)
	}
	pfd, err := unix.PidfdOpen(c.PID, 0)
	if err != nil {
		return fmt.Errorf("process %d: %w", c.PID, err)
	}
	defer unix.Close(pfd)
	fd, err := unix.PidfdGetfd(pfd, c.FD, 0)
	if err != nil {
		return fmt.Errorf("fd %d of process %d: %w", c.FD, c.PID, err)
	}
	defer unix.Close(fd)
	may := func(local netip.AddrPort) error {
		if err := d.mayRepair(s, local, fd); err != nil {
			return fmt.Errorf("fd %d of process %d: %w", c.FD, c.PID, err)
		}
		return nil
	}
	var herr error
	if err := guard(func() { _, herr = s.st.HandoverChecked(c.ID, fd, handoverWrite, may) }); err != nil {
		return err
	}
	return herr
}

// processUID is process pid's real user id.
func processUID(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Uid:" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("process %d: no Uid in its status", pid)
}

// unconnectedTCP checks that fd is a TCP socket the kernel has not
// connected, IPv4 or IPv6 (the shim's dual-stack sockets, whose IPv4
// names are IPv4-mapped): what an accelerated connection's kernel socket
// is.
func unconnectedTCP(fd int) error {
	dom, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	typ, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	proto, err3 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err := errors.Join(err1, err2, err3); err != nil || (dom != unix.AF_INET && dom != unix.AF_INET6) || typ != unix.SOCK_STREAM || proto != unix.IPPROTO_TCP {
		return fmt.Errorf("not a TCP/IP socket (%v)", err)
	}
	if _, err := unix.Getpeername(fd); !errors.Is(err, unix.ENOTCONN) {
		return fmt.Errorf("a socket the kernel has connected (%v)", err)
	}
	return nil
}

// mayRepair checks what onloadd is asked to repair: TCP_REPAIR binds a
// socket to a port whoever holds it, so the connection's address must
// be the stack's and its port one steered to the stack (a filter a
// process proved it owns, or the flows of a process that went); and fd
// must be an IPv4 TCP socket the kernel has not connected.
func (d *Daemon) mayRepair(s *dstack, local netip.AddrPort, fd int) error {
	if err := unconnectedTCP(fd); err != nil {
		return refuse(codeInvalid, "the descriptor is %v", err)
	}
	if local.Addr() != s.addr.Addr() {
		return refuse(codeDenied, "%v is not stack %d's address (%v)", local, s.id, s.addr.Addr())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range s.filters {
		if k.Proto == bpf.TCP && k.Port == local.Port() {
			return nil
		}
	}
	for f := range s.flows {
		if f.Local.Port() == local.Port() {
			return nil
		}
	}
	return refuse(codeDenied, "port %d is not steered to stack %d", local.Port(), s.id)
}
