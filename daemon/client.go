package daemon

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
)

// client is one connection to the control socket: a process, known by
// the credentials it connected with.
type client struct {
	d       *Daemon
	conn    *control.Conn
	cred    unix.Ucred
	program string
	hello   bool
	stacks  map[bpf.StackID]*dstack
	// netnsErr, if set, is why the client cannot be served: it lives in
	// another network namespace, whose interfaces are not ours.
	netnsErr error
	// pidfd refers to the client's process (-1 if the kernel could not
	// give one); selfPid is its id as it sees itself (getpid, in its own
	// pid namespace): what it writes in a stack lock it holds.
	pidfd   int
	selfPid int
	// secure: the client runs in the dynamic loader's secure mode
	// (control.Hello.Secure; mayUse).
	secure bool
}

// mayUse says whether c may share, join or adopt a stack (or cluster)
// that a process of uid made: its own user's, or any for root, but for a
// client in the dynamic loader's secure mode, whose environment (which
// named the stack) is a less privileged user's: a set-user-ID root
// program would otherwise join a stack that user made, and share its
// sockets' memory with that user's processes, or adopt an orphan whose
// memory a process of theirs still maps.
func (c *client) mayUse(uid int) bool {
	return int(c.cred.Uid) == uid || c.cred.Uid == 0 && !c.secure
}

func (c *client) String() string {
	if c.program != "" {
		return fmt.Sprintf("pid %d (%s, uid %d)", c.cred.Pid, c.program, c.cred.Uid)
	}
	return fmt.Sprintf("pid %d (uid %d)", c.cred.Pid, c.cred.Uid)
}

// idleTimeout bounds how long a client that has not said hello may hold
// a connection; after the hello a client may stay quiet for as long as
// it lives.
const idleTimeout = 10 * time.Second

func (d *Daemon) newClient(uc *net.UnixConn) (*client, error) {
	conn := control.NewConn(uc)
	cred, err := conn.Peer()
	if err != nil {
		return nil, err
	}
	c := &client{d: d, conn: conn, cred: *cred, stacks: map[bpf.StackID]*dstack{}, pidfd: -1}
	c.netnsErr = clientNetns(uc, int(cred.Pid))
	c.pidfd, c.selfPid = clientProcess(int(cred.Pid))
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("onloadd is stopping")
	}
	d.clients[c] = struct{}{}
	return c, nil
}

// serve answers c's requests, one at a time, until it disconnects; then
// everything it held is released.
func (c *client) serve() {
	d := c.d
	defer func() {
		d.mu.Lock()
		for _, s := range c.stacks {
			d.leaveLocked(c, s)
		}
		delete(d.clients, c)
		d.mu.Unlock()
		c.conn.Close()
		if c.pidfd >= 0 {
			unix.Close(c.pidfd)
		}
		if c.hello {
			d.log.Debug("client gone", "client", c.String())
		}
	}()
	c.conn.SetDeadline(time.Now().Add(idleTimeout))
	for {
		msg, fds, err := c.conn.Recv()
		if err != nil {
			if !control.IsClosed(err) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, os.ErrDeadlineExceeded) {
				// A malformed datagram: say so, and go on serving.
				d.log.Warn("bad message", "client", c.String(), "err", err)
				if c.send(&control.Reply{Error: err.Error(), Code: control.CodeInvalid}) == nil {
					continue
				}
			}
			return
		}
		rep, rfds := c.handle(msg, fds)
		err = c.send(rep, rfds...)
		if err != nil {
			d.log.Warn("reply not sent", "client", c.String(), "err", err)
			return
		}
		if c.hello {
			c.conn.SetDeadline(time.Time{})
		}
	}
}

func (c *client) send(rep *control.Reply, fds ...int) error {
	rep.V = control.Version
	return c.conn.Send(rep, fds...)
}

// handle answers one request. Descriptors that came with it are the
// handler's: kept (a filter's proof) or closed.
func (c *client) handle(msg []byte, fds []int) (rep *control.Reply, rfds []int) {
	kept := false
	defer func() {
		if !kept {
			control.CloseFDs(fds)
		}
	}()
	req, err := control.ParseRequest(msg)
	if req == nil {
		return errReply(0, refuse(codeInvalid, "%v", err)), nil
	}
	if err != nil {
		return errReply(req.Seq, refuse(codeInvalid, "%v", err)), nil
	}
	if !c.hello && req.Op != control.OpHello {
		return errReply(req.Seq, refuse(codeInvalid, "request %q before hello: a connection begins with hello", req.Op)), nil
	}
	wantFDs := 0
	if req.Op == control.OpFilter || req.Op == control.OpHandover {
		wantFDs = 1
	}
	if len(fds) != wantFDs {
		return errReply(req.Seq, refuse(codeInvalid, "request %q carries %d descriptors, not %d", req.Op, len(fds), wantFDs)), nil
	}
	d := c.d
	rep = &control.Reply{Seq: req.Seq}
	switch req.Op {
	case control.OpHello:
		if c.hello {
			return errReply(req.Seq, refuse(codeInvalid, "a second hello")), nil
		}

		// Under the lock: the dump and the cluster holds read them from
		// other clients' goroutines.
		d.mu.Lock()
		c.hello, c.program, c.secure = true, truncate(req.Hello.Program, 64), req.Hello.Secure
		d.mu.Unlock()
		rep.Hello = &control.HelloReply{Daemon: Version, PID: os.Getpid()}
		d.log.Debug("client", "client", c.String())
	case control.OpStack:
		if c.netnsErr != nil {
			return errReply(req.Seq, d.logRefusal(c, req.Op, c.netnsErr)), nil
		}
		d.mu.Lock()
		s, joined, err := d.stackLocked(c, req.Stack)
		if err == nil {
			s.clients[c] = struct{}{}
			c.stacks[s.id] = s
			rfds = []int{s.nic.Umem().FD(), s.nic.FD(), s.st.Image().FD(), s.nic.RxFD()}
			rep.Stack = s.reply(joined)
			if joined {
				d.log.Info("stack joined", "stack", s.id, "name", s.name, "client", c.String())
			}
		}
		d.mu.Unlock()
		if err != nil {
			return errReply(req.Seq, d.logRefusal(c, req.Op, err)), nil
		}
	case control.OpFilter, control.OpUnfilter:
		d.mu.Lock()
		s := c.stacks[bpf.StackID(req.Filter.Stack)]
		switch {
		case s == nil:
			err = refuse(codeDenied, "stack %d is not one of yours", req.Filter.Stack)
		case req.Op == control.OpFilter:
			if err = d.addFilterLocked(c, s, req.Filter, fds[0]); err == nil {
				kept = true
			}
		default:
			var key bpf.Listener
			if key, err = filterKey(req.Filter); err == nil {
				// Any process of the stack may end a filter: the last
				// of the processes sharing a listener closes it.
				if f := s.filters[key]; f != nil && req.Filter.Retire {
					// Its listener closed; its connections live on:
					// settled as a gone process's port is (ports.go).
					f.gone, f.retired = true, true
					d.settleRetiredLocked(s, key, f)
				} else if f == nil {
					// Nothing to end: a connection's filter becomes flow
					// entries when the process that made it goes
					// (ports.go), and they go as the connection ends,
					// before or after a process that adopted the stack
					// asks (in the background: it waits for no reply).
					d.log.Debug("unfilter: no filter", "stack", s.id, "proto", key.Proto.String(), "local", req.Filter.Local, "client", c.String())
				} else {
					d.removeFilterLocked(s, key)
				}
			}
		}
		d.mu.Unlock()
		if err != nil {
			return errReply(req.Seq, d.logRefusal(c, req.Op, err)), nil
		}
	case control.OpDump:
		rep.Dump = d.dump(req.Dump.Engine)
	case control.OpResolve:
		d.mu.Lock()
		s := c.stacks[bpf.StackID(req.Resolve.Stack)]
		d.mu.Unlock()
		if s == nil {
			err = refuse(codeDenied, "stack %d is not one of yours", req.Resolve.Stack)
		} else {
			err = s.resolve(req.Resolve.Addr)
		}
		if err != nil {
			return errReply(req.Seq, d.logRefusal(c, req.Op, err)), nil
		}
	case control.OpKill:
		d.mu.Lock()
		rep.Kill, err = d.killLocked(c, bpf.StackID(req.Kill.Stack))
		d.mu.Unlock()
		if err != nil {
			return errReply(req.Seq, d.logRefusal(c, req.Op, err)), nil
		}
	case control.OpDrain:
		rep.Drain, err = d.drain(c, req.Drain.Stack)
		if err != nil {
			return errReply(req.Seq, d.logRefusal(c, req.Op, err)), nil
		}
	case control.OpHandover:
		// The descriptor is the client's socket: it keeps its own.
		rep.Handover, err = d.handover(c, req.Handover, fds[0])
		if err != nil {
			return errReply(req.Seq, d.logRefusal(c, req.Op, err)), nil
		}
	}
	return rep, rfds
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// refusal is an error reply's code and sentence.
type refusal struct {
	code control.Code
	msg  string
}

func (r *refusal) Error() string { return r.msg }

const (
	codeInvalid     = control.CodeInvalid
	codeDenied      = control.CodeDenied
	codeInUse       = control.CodeInUse
	codeExhausted   = control.CodeExhausted
	codeUnavailable = control.CodeUnavailable
)

func refuse(code control.Code, format string, a ...any) error {
	return &refusal{code: code, msg: fmt.Sprintf(format, a...)}
}

func errReply(seq uint32, err error) *control.Reply {
	var r *refusal
	if errors.As(err, &r) {
		return &control.Reply{Seq: seq, Error: r.msg, Code: r.code}
	}
	return &control.Reply{Seq: seq, Error: err.Error(), Code: control.CodeInternal}
}

// logRefusal logs a refused request (refusals at debug, failures as
// warnings) and returns err.
func (d *Daemon) logRefusal(c *client, op control.Op, err error) error {
	var r *refusal
	if errors.As(err, &r) {
		d.log.Info("request refused", "client", c.String(), "op", string(op), "why", r.msg)
	} else {
		d.log.Warn("request failed", "client", c.String(), "op", string(op), "err", err)
	}
	return err
}

// clientNetns checks that the client lives in onloadd's network
// namespace: a stack is made on onloadd's interfaces, and a process in
// another namespace (its own veths, its own addresses) would be given the
// wrong ones. The namespace is the client's socket's (a Unix socket's
// accepted end is made in the connecting socket's namespace), which is
// the connecting thread's, not only its process's.
func clientNetns(uc *net.UnixConn, pid int) error {
	rc, err := uc.SyscallConn()
	if err != nil {
		return err
	}
	var same bool
	var nerr error
	rc.Control(func(fd uintptr) { same, nerr = sameNetns(int(fd)) })
	if nerr != nil {
		return refuse(control.CodeNamespace, "cannot tell which network namespace process %d is in: %v", pid, nerr)
	}
	if !same {
		return refuse(control.CodeNamespace, "process %d is in another network namespace than onloadd (pid %d): run an onloadd in that namespace, with a -socket of its own", pid, os.Getpid())
	}
	return nil
}

// secureWhy adds, to a refusal mayUse made, why root was refused too.
func secureWhy(c *client) string {
	if c.cred.Uid == 0 && c.secure {
		return " (a program in the dynamic loader's secure mode shares stacks only with its own user's, root or not)"
	}
	return ""
}
