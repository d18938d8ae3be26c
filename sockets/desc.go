package sockets

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/interrupts"
	"github.com/xdp-onload/onload/stack"
)

// Desc is an accelerated TCP socket for a caller that keeps its own file
// descriptors and does its own blocking: the LD_PRELOAD shim's core
// (shim/core). Each Desc stands on a kernel socket of the caller's, kfd,
// which names it in the caller's descriptor table, holds its port (the
// proof onloadd asks for) and is the caller's to close: a Desc never
// closes it.
//
// Every call is non-blocking: what would wait fails with an error whose
// errno (Errno) is EAGAIN. A caller that must wait arms its sockets with
// an eventfd (Stack.ArmAll) and blocks in the kernel on it, beside its
// other descriptors; the next poll that changes a socket writes the
// eventfd.
type Desc struct {
	sock
	from *Desc // the listener an accepted connection came from
}

// DefaultStack returns the process's default stack (made on first use
// from the ONLOAD_* variables, as Dial and Listen do), held: the caller
// gives it back with Release. The error says why there is none; the
// caller's sockets then use the kernel.
func DefaultStack() (*Stack, error) {
	s, why := acquire(nil)
	if s == nil {
		return nil, errors.New(why)
	}
	return s, nil
}

// Release gives back a stack that DefaultStack returned.
func (s *Stack) Release() { s.release() }

// Config is the configuration the stack was made with.
func (s *Stack) Config() Config { return s.cfg }

// SpinTime is how long a caller with nothing to do polls the stack before
// it blocks (the profile's ONLOAD_SPIN).
func (s *Stack) SpinTime() time.Duration { return s.spin }

// ServesLocal reports whether a socket bound to local address a can be
// served by the stack: the wildcard or the stack's own address.
func (s *Stack) ServesLocal(a netip.Addr) bool { return s.ours(a) }

// ConnectsKernel says why a TCP connection to dst goes to the kernel, or
// "" if the stack takes it: one of the stack's own listeners, or a remote
// host on its interface (the host's own addresses go through the
// kernel's loopback) where the stack's queue receives the replies.
func (s *Stack) ConnectsKernel(dst netip.AddrPort) string {
	return s.dialsKernel(stack.TCP, dst)
}

// dialsKernel is ConnectsKernel for protocol p.
func (s *Stack) dialsKernel(p stack.Proto, dst netip.AddrPort) string {
	switch {
	case p == stack.TCP && s.loopsBack(dst):
		return ""
	case !s.routes(dst.Addr()):
		return dst.Addr().String() + " is not reached through the stack's interface"
	}
	return s.kernelConnects
}

// Poll polls the stack once, for a caller that spins while it waits, and
// reports whether it could (false: the stack is closed).
func (s *Stack) Poll() bool {
	if !s.enter() {
		return false
	}
	s.st.Poll()
	s.leave()
	return true
}

// TryPoll polls the stack once unless another thread is in it (which
// then polls before it lets go): a caller's look before it waits, that
// does not queue behind a spinner.
func (s *Stack) TryPoll() {
	if s.enter() {
		s.st.TryPoll()
		s.leave()
	}
}

// TrySpin claims one of the stack's spin slots (see interrupts.Sleeper,
// ONLOAD_SPIN_THREADS): a caller that gets it polls while it waits, and gives
// it back with EndSpin; one that does not blocks at once (the spinners'
// polls wake it).
func (s *Stack) TrySpin() bool { return s.sl.TrySpin() }

// EndSpin gives a spin slot back.
func (s *Stack) EndSpin() { s.sl.EndSpin() }

// SpinThreads is how many of the process's waiters may spin at once.
func (s *Stack) SpinThreads() int { return s.sl.Policy().Spinners }

// Park says a caller is about to block until a wake; Unpark that it woke.
// While anyone is parked the stack's Sleeper keeps polling it, or arms
// its interrupt.
func (s *Stack) Park()   { s.sl.Park(false) }
func (s *Stack) Unpark() { s.sl.Unpark() }

// InterruptFD is the file descriptor that turns readable when a frame is
// in the stack's RX ring (its AF_XDP socket's receive lane,
// vnic.XDPConfig.RxLane, where it has one), for a caller that blocks
// in the kernel on it beside its own descriptors (ParkDirect); -1 if the
// NIC has none (an in-memory one). It is level-triggered: readable while
// a frame waits, so a frame that came before the caller blocked is not
// missed. The stack owns it: never close it.
func (s *Stack) InterruptFD() int {
	if x, ok := s.nic.(interface{ RxFD() int }); ok {
		return x.RxFD()
	}
	return -1
}

// ParkDirect says the caller is about to block in the kernel on
// InterruptFD itself and to poll the stack when it wakes; UnparkDirect
// that it woke (interrupts.Sleeper.ParkDirect).
func (s *Stack) ParkDirect()   { s.sl.ParkDirect() }
func (s *Stack) UnparkDirect() { s.sl.UnparkDirect() }

// SetThreads says how many threads of a program under the shim use the
// stack (interrupts.Sleeper.SetThreads).
func (s *Stack) SetThreads(n int) { s.sl.SetThreads(n) }

// kernelPort is the port kfd is bound to, binding it to the stack's
// address and an ephemeral port first if it is not bound.
func (s *Stack) kernelPort(kfd int) (uint16, error) {
	port, v6, err := s.boundPort(kfd)
	if err != nil || port != 0 {
		return port, err
	}
	return s.bindEphemeral(kfd, v6)
}

// bindEphemeral binds kfd, a TCP socket not bound (IPv6 if v6), to the
// stack's address and an ephemeral port (bindFree), and returns the port.
func (s *Stack) bindEphemeral(kfd int, v6 bool) (uint16, error) {
	return s.bindFree(stack.TCP, kfd, s.addr.Addr(), v6)
}

// boundPort is the port kernel socket kfd is bound to (0: none), and
// whether kfd is IPv6 (the shim's dual-stack sockets: its IPv4 names are
// IPv4-mapped, inet4). It is syscall's getsockname: x/sys/unix's asks
// the socket's protocol too (for L2TP), a second system call a
// connection.
func (s *Stack) boundPort(kfd int) (port uint16, v6 bool, err error) {
	sa, err := syscall.Getsockname(kfd)
	if err != nil {
		return 0, false, os.NewSyscallError("getsockname", err)
	}
	switch in := sa.(type) {
	case *syscall.SockaddrInet4:
		return uint16(in.Port), false, nil
	case *syscall.SockaddrInet6:
		return uint16(in.Port), true, nil
	}
	return 0, false, stack.ErrInvalid
}

func (s *Stack) newDesc(id stack.SockID) (*Desc, error) {
	d := &Desc{}
	if !s.newSock(&d.sock, id, reservation{}) {
		s.closeID(id)
		return nil, net.ErrClosed
	}
	return d, nil
}

// ListenDesc makes a listener on kfd, a kernel TCP socket that listens
// already (it serves the clients that do not come through the stack's
// interface, and it holds the port): ip is the address it is bound to,
// the wildcard or the stack's (ServesLocal). Where processes share the
// stack, a listener another of them made on the same port is shared
// (stack.ShareListener). shared: other processes hold kfd's socket too
// and may accept on it (a pre-fork server's workers inherited it): in a
// cluster each member's stack takes its queue's connections of the port,
// as for an SO_REUSEPORT port.
func (s *Stack) ListenDesc(kfd int, ip netip.Addr, shared bool) (*Desc, error) {
	port, err := s.kernelPort(kfd)
	if err != nil {
		return nil, err
	}
	if ip.IsUnspecified() {
		ip = netip.Addr{}
	}
	local := netip.AddrPortFrom(ip, port)
	// Another process of a shared stack listens on this port with the
	// same kernel socket (a pre-fork server's workers) or one of its
	// SO_REUSEPORT group: share its listener.
	if id, ok := s.shareListener(local, kfd, shared); ok {
		return s.newDesc(id)
	}
	id, err := s.openAtFD(stack.TCP, local, true, kfd, shared)
	if errors.Is(err, syscall.EADDRINUSE) && s.stopShared != nil {
		// It may be making the listener at this moment: nginx's workers
		// accelerate the socket they inherited at once, and one of them
		// found the port bound by the other's listener, which did not
		// listen yet (and served from the kernel). It is shared as soon
		// as it listens. Or it is closing it: after a reload, the old
		// workers' listener (and its filter at onloadd) goes while the
		// new workers listen; the port is then free to bind again.
		deadline := time.Now().Add(listenerWait)
		for i := 1; time.Now().Before(deadline); i++ {
			time.Sleep(time.Millisecond)
			if id, ok := s.shareListener(local, kfd, shared); ok {
				return s.newDesc(id)
			}
			if i%10 == 0 {
				if id, err = s.openAtFD(stack.TCP, local, true, kfd, shared); !errors.Is(err, syscall.EADDRINUSE) {
					break
				}
			}
		}
	}
	if err != nil {
		return nil, err
	}
	return s.newDesc(id)
}

// listenerWait bounds how long ListenDesc waits for another process of a
// shared stack to finish the listener it is making on the same port.
const listenerWait = 200 * time.Millisecond

// shareListener shares the stack's listener on local (stack.ShareListener)
// with kfd as the proof of the port should it steer it again (a listener
// its process retired as it passed kfd's socket to this one).
func (s *Stack) shareListener(local netip.AddrPort, kfd int, shared bool) (id stack.SockID, ok bool) {
	if !s.enter() {
		return stack.NullSock, false
	}
	defer s.leave()
	s.withProof(stack.TCP, local, kfd, shared, func() error {
		id, ok = s.st.ShareListener(local)
		return nil
	})
	return id, ok
}

// Preset is an option of a connection that its first segment carries
// (IP_TOS, IP_TTL): one the program set on its socket before connect.
type Preset struct {
	Opt   stack.Option
	Value int
}

// preset sets id's options before it connects.
func (s *Stack) preset(id stack.SockID, pre []Preset) error {
	for _, p := range pre {
		if err := s.st.SetOption(id, p.Opt, p.Value); err != nil {
			return sysErr("setsockopt", err)
		}
	}
	return nil
}

// ConnectDesc connects a socket on kfd, a kernel TCP socket, to dst: from
// a shared port (sharedPorts) if kfd is not bound and one is free for
// dst, kfd staying unbound; otherwise from kfd's port, kfd bound to the
// stack's address and an ephemeral port first if it is not bound, which
// then holds the port; with the options pre. The handshake has begun:
// the socket turns writable when it completes, and SockError says why it
// failed.
func (s *Stack) ConnectDesc(kfd int, dst netip.AddrPort, pre ...Preset) (*Desc, error) {
	port, v6, err := s.boundPort(kfd)
	if err != nil {
		return nil, err
	}
	if port == 0 {
		// From a shared port: kfd stays unbound (the port's proof
		// holds the port) until a handover binds it there.
		if id, err := s.openShared(dst, pre); err != errNoSharedPort {
			if err != nil {
				return nil, err
			}
			s.recordKernelFD(id, kfd)
			return s.newDesc(id)
		}
		if port, err = s.bindEphemeral(kfd, v6); err != nil {
			return nil, err
		}
	}
	if !s.enter() {
		return nil, net.ErrClosed
	}
	id, err := s.st.Open(stack.TCP)
	if err == nil {
		err = s.preset(id, pre)
		if err == nil {
			if err = s.bind(stack.TCP, id, netip.AddrPortFrom(s.addr.Addr(), port), kfd, true); err != nil {
				err = sysErr("bind", err)
			} else if err = s.st.Connect(id, dst); err == stack.ErrInProgress {
				err = nil
			}
		}
		if err != nil {
			s.st.Close(id)
		}
	}
	s.leave()
	if err != nil {
		return nil, err
	}
	s.recordKernelFD(id, kfd)
	return s.newDesc(id)
}

// Accept takes the next connection off listener d; the caller names it
// by kfd, a kernel socket of its own, as every Desc. EAGAIN when there
// is none.
func (d *Desc) Accept(kfd int) (*Desc, error) {
	s := d.stk
	if err := d.check(nil); err != nil {
		return nil, err
	}
	if !s.enter() {
		return nil, net.ErrClosed
	}
	id, err := s.st.Accept(d.id)
	s.leave()
	if err != nil {
		return nil, err
	}
	s.recordKernelFD(id, kfd)
	c, err := s.newDesc(id)
	if c != nil {
		c.from = d
	}
	return c, err
}

// AcceptedFrom is the listener whose Accept returned d, or nil.
func (d *Desc) AcceptedFrom() *Desc { return d.from }

// Recv reads into b (peek: without taking it off the queue); 0 and nil at
// the end of the stream.
func (d *Desc) Recv(b []byte, peek bool) (int, error) {
	if err := d.check(nil); err != nil {
		return 0, err
	}
	s := d.stk
	if !s.enter() {
		return 0, net.ErrClosed
	}
	n, err := s.st.Recv(d.id, b, peek)
	s.leave()
	return n, err
}

// RecvCorked is Recv from a caller who will wait (or send) in a moment,
// as SendMore's: the ACK its read owes may wait for that, or go with its
// answer (stack.Stack.RecvCorked); the stack's Sleeper sends it within
// heldKickWait should the caller not come back. owed says the caller's
// next wait owes KickHeld.
func (d *Desc) RecvCorked(b []byte, peek bool) (n int, owed bool, err error) {
	if err := d.check(nil); err != nil {
		return 0, false, err
	}
	s := d.stk
	if !s.enter() {
		return 0, false, net.ErrClosed
	}
	n, err = s.st.RecvCorked(d.id, b, peek)
	owed = s.boundHeldKick(heldKickWait)
	s.leave()
	return n, owed, err
}

// Send queues what of b the send buffer takes.
func (d *Desc) Send(b []byte) (int, error) {
	if err := d.check(nil); err != nil {
		return 0, err
	}
	s := d.stk
	if !s.enter() {
		return 0, net.ErrClosed
	}
	n, err := s.st.Send(d.id, b)
	s.leave()
	return n, err
}

// EventsOf reports the readiness of many sockets under one taking of the
// stack's lock: out[i] for ds[i] (0 for nil), and in edges (unless nil)
// the counts stack.Stack.EventsOf gives for edge-triggered waiters. ids is
// scratch, as long as ds.
func (s *Stack) EventsOf(ds []*Desc, ids []stack.SockID, out []stack.Events, edges []uint32) {
	for i, d := range ds {
		ids[i] = stack.NullSock
		if d != nil && d.stk == s && !d.closed.Load() {
			ids[i] = d.id
		}
	}
	if !s.enter() {
		for i := range out {
			out[i] = stack.Error | stack.Hangup
		}
		return
	}
	s.st.EventsOf(ids, out, edges)
	s.leave()
	for i, d := range ds {
		if d != nil && ids[i] == stack.NullSock {
			out[i] = stack.Error | stack.Hangup // closed
		}
	}
}

// ID is the engine's name for the socket; its Slot is what the stack's
// ready log names (ReadySince).
func (d *Desc) ID() stack.SockID { return d.id }

// Sockets is the size of the stack's socket table: every slot the ready
// log names is below it.
func (s *Stack) Sockets() int { return len(s.waits) }

// ReadySince reads the stack's ready log from *seq (stack.Stack.ReadySince):
// the slots of the sockets whose readiness may have risen since, for a
// caller that checks those instead of all it watches. ok false: check
// them all. A closed stack says so too.
func (s *Stack) ReadySince(seq *uint32, slots []uint32) (n int, ok bool) {
	if !s.enter() {
		return 0, false
	}
	n, ok = s.st.ReadySince(seq, slots)
	s.leave()
	return n, ok
}

// ReadyHead is the ready log's head (stack.Stack.ReadyHead): where a
// caller that is about to check all it watches reads on from.
func (s *Stack) ReadyHead() uint32 {
	if !s.enter() {
		return 0
	}
	h := s.st.ReadyHead()
	s.leave()
	return h
}

// ArmReady asks for eventfd efd to be written at the ready log's next
// entry (stack.Stack.ArmReady), for a caller about to block until any of
// many sockets may be ready, unless the log has moved past seq (its
// position after its last check): then moved is true and nothing stays
// asked. ok is false where the stack cannot (it is shared with other
// processes): the caller arms its sockets (ArmAll). A closed stack says
// moved, so that the caller looks again and finds its sockets closed.
func (s *Stack) ArmReady(efd int32, seq uint32) (moved, ok bool) {
	s.ready.watch(efd)
	if !s.enter() {
		s.ready.unwatch(efd)
		return true, true
	}
	moved, ok = s.st.ArmReady(seq)
	s.leave()
	if moved || !ok {
		s.ready.unwatch(efd)
	}
	return moved, ok
}

// DisarmReady takes back what ArmReady asked.
func (s *Stack) DisarmReady(efd int32) { s.ready.unwatch(efd) }

// ArmAll asks for eventfd efd to be written at the next change of the
// state of any of ds (ds[i] for the events in want[i]; nil, or want 0:
// skipped), under one taking of the lock, unless one of them is ready
// for what it wants (or has an error or hang-up) now: their events go in
// out. It returns how many are ready; if any is, none stays armed
// (DisarmAll takes the request back). A want of stack.Edge waits for the
// socket's edge count to move from edges[i] (stack.Stack.WaitForAll). ids
// is scratch.
func (s *Stack) ArmAll(ds []*Desc, want, out []stack.Events, edges []uint32, efd int32, ids []stack.SockID) int {
	for i, d := range ds {
		ids[i] = stack.NullSock
		if d != nil && d.stk == s && want[i] != 0 {
			d.wq.watch(efd)
			ids[i] = d.id
		}
	}
	ready := 0
	if s.enter() {
		ready = s.st.WaitForAll(ids, want, out, edges)
		s.leave()
	} else {
		ready = len(ds)
	}
	if ready > 0 {
		s.DisarmAll(ds, efd)
	}
	return ready
}

// DisarmAll takes back what ArmAll asked.
func (s *Stack) DisarmAll(ds []*Desc, efd int32) {
	for _, d := range ds {
		if d != nil {
			d.wq.unwatch(efd)
		}
	}
}

// SendMore is Send from a caller who will wait (or send again) in a
// moment: the segments wait on the NIC's ring for the kick that
// KickHeld, the next send or the next poll gives them all at once. Should
// the caller not come back, the stack's Sleeper kicks them within
// heldKickWait.
func (d *Desc) SendMore(b []byte) (int, error) {
	if err := d.check(nil); err != nil {
		return 0, err
	}
	s := d.stk
	if !s.enter() {
		return 0, net.ErrClosed
	}
	n, err := s.st.SendCorked(d.id, b)
	s.boundHeldKick(heldKickWait)
	s.leave()
	return n, err
}

// boundHeldKick has an armed Sleeper kick, within wait, what a corked
// call left for its caller's next wait; it reports whether anything was
// left.
func (s *Stack) boundHeldKick(wait time.Duration) bool {
	if !s.st.KickOwed() {
		return false
	}
	if s.sl.Armed() {
		s.sl.TimerSet(s.st.Clock() + int64(wait))
	}
	return true
}

// heldKickWait bounds how long frames the shim's corked calls (SendMore,
// RecvCorked) left wait for their kick, should the caller not come back
// to a wait (which kicks at once). It is a safety net, and a coarse one:
// each time it moves the Sleeper's timer earlier costs the shim's thread
// a system call (the Sleeper's timerfd) and the Sleeper a wake-up, and
// at 100 µs that was every other request of a busy redis-server. At
// 1 ms it set the Sleeper's rhythm under pipelined redis (a wake-up
// every millisecond, 700 timer settings a second from redis-server's
// thread); at the Sleeper's longest look (interrupts.MaxLook) a send
// finds the Sleeper due sooner and sets nothing.
const heldKickWait = interrupts.MaxLook

// readKickWait is heldKickWait for the Go library's reads (TCPConn.Read),
// whose Sleeper's timer is the Go runtime's.
const readKickWait = time.Millisecond

// KickHeld gives the NIC the frames SendMore left waiting.
func (s *Stack) KickHeld() {
	if s.st.KickOwed() && s.enter() {
		s.st.KickHeld()
		s.leave()
	}
}

// Close closes the socket (TCP's orderly close, or a reset as SO_LINGER
// says); kfd stays open.
func (d *Desc) Close() { d.close() }

// Shutdown shuts down reading (SHUT_RD), writing (SHUT_WR) or both.
func (d *Desc) Shutdown(how int) error {
	if err := d.check(nil); err != nil {
		return err
	}
	s := d.stk
	if !s.enter() {
		return net.ErrClosed
	}
	err := s.st.Shutdown(d.id, how)
	s.leave()
	return err
}

// RetireListener gives a listener's port to the kernel: its socket was
// passed to another process, which shares the kernel's socket
// (stack.Stack.RetireListener). On a stack of onloadd's it returns once
// onloadd has taken the port's filter away (retireWait at most): the
// connections that come after go to the kernel's socket, for either
// process, not to this stack, which would refuse them once the sender
// closed its copy.
func (d *Desc) RetireListener() error {
	if err := d.check(nil); err != nil {
		return err
	}
	s := d.stk
	if !s.enter() {
		return net.ErrClosed
	}
	local, _ := s.st.LocalAddr(d.id)
	err := s.st.RetireListener(d.id)
	s.leave()
	if err == nil && s.proofs != nil {
		s.proofs.waitRetired(stack.TCP, local, retireWait)
	}
	return err
}

// retireWait bounds how long RetireListener waits for onloadd.
const retireWait = 100 * time.Millisecond

// SetOption sets an option the engine keeps.
func (d *Desc) SetOption(o stack.Option, v int) error { return d.setOption(o, v) }

// Option reads an option the engine keeps.
func (d *Desc) Option(o stack.Option) (int, error) {
	s := d.stk
	if !s.enter() {
		return 0, net.ErrClosed
	}
	v, err := s.st.Option(d.id, o)
	s.leave()
	return v, err
}

// Addrs are the socket's local and remote addresses.
func (d *Desc) Addrs() (la, ra netip.AddrPort, err error) { return d.addrs() }

// TCPInfo describes the connection.
func (d *Desc) TCPInfo() (stack.TCPInfo, error) {
	s := d.stk
	if !s.enter() {
		return stack.TCPInfo{}, net.ErrClosed
	}
	ti, err := s.st.TCPInfo(d.id)
	s.leave()
	return ti, err
}

// SockError takes the socket's pending error (SO_ERROR), nil if none.
func (d *Desc) SockError() error {
	s := d.stk
	if !s.enter() {
		return net.ErrClosed
	}
	err := s.st.SockError(d.id)
	s.leave()
	return err
}

// Dump describes the socket, for diagnosis.
func (d *Desc) Dump() string {
	s := d.stk
	if !s.enter() {
		return "closed"
	}
	defer s.leave()
	return s.st.DumpSocket(d.id)
}

// Errno is the errno a system call would have failed with for err, as
// the kernel reports it (0 for nil).
func Errno(err error) syscall.Errno {
	// The common cases without errors.As, which allocates: this runs for
	// every EAGAIN.
	switch e := err.(type) {
	case nil:
		return 0
	case *stack.Errno:
		return e.Errno
	case syscall.Errno:
		return e
	}
	var se *stack.Errno
	var en syscall.Errno
	switch {
	case errors.As(err, &se):
		return se.Errno
	case errors.As(err, &en):
		return en
	case errors.Is(err, net.ErrClosed):
		return syscall.EBADF
	}
	return syscall.EIO
}

// LogFallback logs, at debug level (ONLOAD_LOG=debug), that an operation
// on address goes to the kernel and why.
func LogFallback(op, address, why string) { logFallback(op, "tcp", address, why) }

// LogDebug logs at the debug level (ONLOAD_LOG=debug), for the shim's core.
func LogDebug(format string, args ...any) { logf(levelDebug, format, args...) }

// LogError logs at the error level (always shown), for the shim's core.
func LogError(format string, args ...any) { logf(levelError, format, args...) }
