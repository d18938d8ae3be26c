package sockets

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/interrupts"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// errNoDaemon is openDaemon's error when nothing answers on the control
// socket: in auto mode the process then makes its own stack.
var errNoDaemon = errors.New("onloadd is not running")

// openDaemon asks onloadd for a stack and maps it: the UMEM, the AF_XDP
// socket and the image come as descriptors over the control socket, and
// the stack runs here, in this process, as a standalone one does. No
// privilege is needed.
func openDaemon(cfg Config) (*Stack, error) {
	path := cfg.DaemonSocket
	if path == "" {
		path = control.DefaultSocket
	}
	cl, err := dialDaemon(path, filepath.Base(os.Args[0]))
	if err != nil {
		var ce *control.Error
		if errors.As(err, &ce) {
			return nil, err
		}
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ECONNREFUSED) {
			return nil, fmt.Errorf("%w (no control socket at %s: start it with onloadd serve, or set ONLOAD_DAEMON_SOCKET to its socket)", errNoDaemon, path)
		}
		if errors.Is(err, unix.EACCES) {
			return nil, fmt.Errorf("onloadd's control socket %s refuses this user (uid %d): ask for its group, or run onloadd with -group", path, os.Getuid())
		}
		return nil, fmt.Errorf("onloadd at %s: %w", path, err)
	}
	undo := []func() error{cl.Close}
	fail := func(err error) (*Stack, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, err
	}
	req := control.StackRequest{
		Interface: cfg.Interface, Name: cfg.StackName, Cluster: cfg.Cluster,
		Frames: cfg.UmemFrames, RingSize: cfg.RingSize, FillDepth: cfg.FillDepth,
		Image: control.ImageConfig{
			Sockets: cfg.Sockets, MinRTOMs: int(cfg.MinRTO / time.Millisecond), DelayedAckMs: int(cfg.DelayedAck / time.Millisecond),
			TimeWaitMs: int(cfg.TimeWait / time.Millisecond),
			SendBuffer: cfg.SendBuffer, RecvBuffer: cfg.RecvBuffer, SendBufferMax: cfg.SendBufferMax, RecvBufferMax: cfg.RecvBufferMax,
			Congestion: cfg.Congestion,
		},
	}
	rep, fds, err := cl.Call(control.Request{Op: control.OpStack, Stack: &req})
	if ce := (*control.Error)(nil); errors.As(err, &ce) && ce.Code == control.CodeNamespace {
		// That onloadd serves another network namespace: for us it is
		// as if none ran.
		return fail(fmt.Errorf("%w in this network namespace (%v)", errNoDaemon, err))
	}
	if err != nil {
		return fail(err)
	}
	if len(fds) != 4 || rep.Stack == nil {
		control.CloseFDs(fds)
		return fail(fmt.Errorf("onloadd's stack reply has %d descriptors, not 4 (an onloadd of another version? run the onloadd beside this library)", len(fds)))
	}
	sr := rep.Stack
	umemFD, xskFD, imgFD, rxFD := fds[0], fds[1], fds[2], fds[3]
	addr, err := netip.ParsePrefix(sr.Addr)
	if err != nil {
		control.CloseFDs(fds)
		return fail(fmt.Errorf("onloadd's stack address %q: %w", sr.Addr, err))
	}
	nic, err := vnic.AttachXDP(umemFD, xskFD, vnic.XDPConfig{
		Interface: sr.Interface, Queue: sr.Queue, FrameSize: sr.FrameSize, FrameCount: sr.Frames,
		RingSize: sr.RingSize, FillDepth: sr.FillDepth,
	})
	if err != nil {
		unix.Close(imgFD)
		unix.Close(rxFD)
		return fail(fmt.Errorf("map onloadd's stack %d: %w", sr.ID, err))
	}
	undo = append(undo, nic.Close)
	if err := nic.AttachRxLane(rxFD); err != nil {
		unix.Close(imgFD)
		return fail(fmt.Errorf("map onloadd's stack %d: %w", sr.ID, err))
	}
	img, err := stack.AttachImage(imgFD)
	if err != nil {
		unix.Close(imgFD)
		return fail(fmt.Errorf("map onloadd's stack %d: %w", sr.ID, err))
	}
	undo = append(undo, img.Close)
	kn, err := stack.NewKernelNeighbours(sr.Interface)
	if err != nil {
		return fail(err)
	}
	// The kernel sends an ARP request only for a privileged process: ask
	// onloadd, without waiting (the stack asks the table again shortly).
	kn.Ask = func(ip netip.Addr) error {
		go cl.Call(control.Request{Op: control.OpResolve, Resolve: &control.ResolveRequest{Stack: sr.ID, Addr: ip.String()}})
		return nil
	}
	undo = append(undo, kn.Close)
	irq, err := interrupts.Readiness(nic.RxFD())
	if err != nil {
		return fail(err)
	}
	undo = append(undo, irq.Close)
	filters := &daemonFilters{c: cl, stack: sr.ID, path: path, proofs: map[proofKey]proof{}, steered: map[proofKey]bool{}, conns: map[uint16]bool{}}
	undo = append(undo, filters.close)
	s, err := attachStack(img, nic, irq, cfg, addr, stack.Options{Filters: filters, Resolver: kn, BadChecksum: checksumWarning(sr.Interface)})
	if err != nil {
		return fail(err)
	}
	for i := len(undo) - 1; i >= 0; i-- {
		s.teardown = append(s.teardown, undo[i])
	}
	s.host, s.ifname, s.proofs = true, sr.Interface, filters
	s.kernelConnects = sr.KernelConnects
	s.shared = newSharedPorts(cfg)
	s.local = hostAddrs()
	s.followKernel()
	// Every stack from onloadd is shared: with the other processes of a
	// named stack, and with onloadd, which polls it when this process
	// does not (takeover), and wakes our goroutines through the image.
	if err := s.shareWakes(); err != nil {
		s.Close()
		return nil, err
	}
	how := "made"
	if sr.Joined {
		how = "joined"
	}
	logf(levelInfo, "stack %d on %s queue %d (%s, through onloadd: %s): %v", sr.ID, sr.Interface, sr.Queue, addr, how, cfg.Profile)
	return s, nil
}

// daemonFilters steers a daemon stack's ports: each through a request to
// onloadd, with the kernel socket that proves the port is ours.
//
// The engine asks for a filter in its bind and ends one as a socket's
// slot is freed, both under the stack lock; a request to onloadd is a
// round trip of half a millisecond or more, which every thread of the
// stack would wait out. So a connection's port is steered before the
// engine binds it (steerFirst), and its filter ends in the background
// (RemoveListener): the proof onloadd keeps until then holds the port in
// the kernel, so no bind can take it meanwhile. A listener's port, which
// another socket with SO_REUSEPORT may bind again at once, ends as it
// did, waiting for onloadd.
type daemonFilters struct {
	c     *control.Client
	stack uint32
	path  string // onloadd's control socket

	mu      sync.Mutex
	proofs  map[proofKey]proof  // set around the engine's Bind (withProof)
	steered map[proofKey]bool   // steered before the engine's Bind (steerFirst)
	conns   map[uint16]bool     // TCP ports steered so (a connection's, until released): they end in the background
	ends    chan netip.AddrPort // filters to end, in the background
	// retiring: the listeners' ports whose filters end in the background
	// (RetireListener), each closed when onloadd has answered.
	retiring map[proofKey]chan struct{}
	closed   bool
}

type proofKey struct {
	p    stack.Proto
	port uint16
}

// proof is a port's kernel socket, and whether other processes hold it
// too (control.FilterRequest.Shared).
type proof struct {
	fd     int
	shared bool
}

// withProof runs bind with fd as the proof for port.
func (f *daemonFilters) withProof(p stack.Proto, port uint16, fd int, shared bool, bind func() error) error {
	k := proofKey{p, port}
	f.mu.Lock()
	f.proofs[k] = proof{fd, shared}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.proofs, k)
		f.mu.Unlock()
	}()
	return bind()
}

func (f *daemonFilters) request(op control.Op, p stack.Proto, local netip.AddrPort, shared bool, fds ...int) error {
	return f.call(op, &control.FilterRequest{
		Stack: f.stack, Kind: control.Listen, Proto: p.String(), Local: local.String(), Shared: shared,
	}, fds...)
}

func (f *daemonFilters) call(op control.Op, req *control.FilterRequest, fds ...int) error {
	_, rfds, err := f.c.Call(control.Request{Op: op, Filter: req}, fds...)
	control.CloseFDs(rfds)
	return err
}

// RetireListener asks onloadd to end local's filter while the stack's
// connections on the port live on (stack.ListenerRetirer): it steers them
// by flow entries first. In the background: the engine calls it under
// the stack lock, which onloadd takes to see the connections.
func (f *daemonFilters) RetireListener(p stack.Proto, local netip.AddrPort) {
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed {
		return
	}
	req := &control.FilterRequest{Stack: f.stack, Kind: control.Listen, Proto: p.String(), Local: local.String(), Retire: true}
	k, done := proofKey{p, local.Port()}, make(chan struct{})
	f.mu.Lock()
	if f.retiring == nil {
		f.retiring = map[proofKey]chan struct{}{}
	}
	f.retiring[k] = done
	f.mu.Unlock()
	go func() {
		defer close(done)
		if err := f.call(control.OpUnfilter, req); err != nil {
			logf(levelDebug, "%s port %d: its listener closed, its connections live on, and onloadd kept the port: %v", p, local.Port(), err)
		}
		f.mu.Lock()
		if f.retiring[k] == done {
			delete(f.retiring, k)
		}
		f.mu.Unlock()
	}()
}

// waitRetired waits, d at most, for onloadd's answer to the retirement of
// port local (RetireListener), which it gives once the port is the
// kernel's or it could not look at the stack.
func (f *daemonFilters) waitRetired(p stack.Proto, local netip.AddrPort, d time.Duration) {
	f.mu.Lock()
	done := f.retiring[proofKey{p, local.Port()}]
	f.mu.Unlock()
	if done == nil {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

func (f *daemonFilters) AddListener(p stack.Proto, local netip.AddrPort) error {
	k := proofKey{p, local.Port()}
	f.mu.Lock()
	pf, ok := f.proofs[k]
	if f.steered[k] {
		delete(f.steered, k)
		f.mu.Unlock()
		return nil
	}
	if p == stack.TCP {
		// Not a connection's port now (a mark another process's
		// release of it left: at most one a port).
		delete(f.conns, local.Port())
	}
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("no kernel socket holds %s port %d for this process", p, local.Port())
	}
	return f.request(control.OpFilter, p, local, pf.shared, pf.fd)
}

// steerFirst steers TCP port local to the stack before the engine's
// bind (BindConnecting) of a connection, outside the stack lock; bind
// runs it. A port the kernel just gave us (fd bound to it) is no other
// socket's, so the engine's own request would only repeat this one.
func (f *daemonFilters) steerFirst(local netip.AddrPort, fd int, bind func() error) error {
	k := proofKey{stack.TCP, local.Port()}
	if err := f.request(control.OpFilter, stack.TCP, local, false, fd); err != nil {
		return err
	}
	f.mu.Lock()
	f.steered[k] = true
	f.conns[local.Port()] = true
	f.mu.Unlock()
	err := bind()
	f.mu.Lock()
	unused := f.steered[k]
	delete(f.steered, k)
	f.mu.Unlock()
	if unused && err != nil {
		// A bind that failed before the engine steered the port. One
		// that succeeded without asking (the port had a socket of the
		// stack's already) keeps the filter: it goes with the port's
		// last socket.
		f.RemoveListener(stack.TCP, local)
	}
	return err
}

// RemoveListener ends the filter of local: a connection's in the
// background (see daemonFilters).
func (f *daemonFilters) RemoveListener(p stack.Proto, local netip.AddrPort) error {
	f.mu.Lock()
	if p != stack.TCP || !f.conns[local.Port()] {
		f.mu.Unlock()
		return f.request(control.OpUnfilter, p, local, false)
	}
	delete(f.conns, local.Port())
	if f.closed {
		f.mu.Unlock()
		return net.ErrClosed
	}
	if f.ends == nil {
		f.ends = make(chan netip.AddrPort, 4096)
		go f.endFilters(f.ends)
	}
	select {
	case f.ends <- local:
		f.mu.Unlock()
		return nil
	default: // a backlog of thousands: wait for this one
		f.mu.Unlock()
		return f.request(control.OpUnfilter, p, local, false)
	}
}

// endFilters ends the TCP filters sent on ends, until it is closed.
func (f *daemonFilters) endFilters(ends <-chan netip.AddrPort) {
	for local := range ends {
		f.request(control.OpUnfilter, stack.TCP, local, false)
	}
}

// close stops the background work; the connection to onloadd closes
// after (the stack's teardown).
func (f *daemonFilters) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed && f.ends != nil {
		close(f.ends)
	}
	f.closed = true
	return nil
}

// threadWakes: see WakesToThreads.
var threadWakes atomic.Bool

// WakesToThreads says the process's waiters are threads that block
// outside Go, each on its own descriptors (the LD_PRELOAD shim's): a stack
// shared with other processes wakes them through a socket they wait on
// (RemoteWakeFD), not through a goroutine that waits for the others'
// polls and wakes them in turn. The stacks' Sleepers then sleep on
// threads of their own (interrupts.Policy.Thread): such threads come into
// Go from C, and the runtime's timers and wake-ups can be late there.
// Call it before the first stack.
func WakesToThreads() { threadWakes.Store(true) }

// RemoteWakeFD is the socket that turns readable when another process's
// poll of a shared stack made a socket ready that this process's
// threads wait on (WakesToThreads); -1 if the stack is not shared so. A
// thread that finds it readable drains it and calls TakeRemoteWakes. The
// stack owns it: never close it.
func (s *Stack) RemoteWakeFD() int { return s.remoteFD }

// TakeRemoteWakes wakes the threads whose sockets other processes' polls
// made ready (RemoteWakeFD).
func (s *Stack) TakeRemoteWakes() {
	if s.enter() {
		s.st.TakeRemoteWakes()
		s.leave()
	}
}

// shareWakes lets the other processes of a shared stack (and onloadd)
// wake this one's goroutines: their polls may take in what ours wait for. One goroutine
// waits on this process's word in the image (a futex, which holds an OS
// thread while it waits) and wakes the goroutines whose sockets were
// touched.
//
// Where the waiters are threads that block outside Go (WakesToThreads)
// they are woken through a wake socket instead (stack.WakeSocket,
// RemoteWakeFD), and there is no goroutine.
func (s *Stack) shareWakes() error {
	if err := s.st.JoinWakes(); err != nil {
		return err
	}
	if threadWakes.Load() {
		fd, err := s.st.WakeSocket()
		if err != nil {
			s.st.LeaveWakes()
			return err
		}
		s.remoteFD = fd
		s.stopShared = func() {
			s.remoteFD = -1
			s.st.LeaveWakes()
		}
		return nil
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		seq := s.st.WaitRemote(0, 0)
		for {
			select {
			case <-done:
				return
			default:
			}
			next := s.st.WaitRemote(seq, 100*time.Millisecond)
			if next == seq || !s.enter() {
				continue
			}
			seq = next
			s.st.TakeRemoteWakes()
			s.leave()
		}
	}()
	s.stopShared = func() {
		close(done)
		<-exited
		s.st.LeaveWakes()
	}
	return nil
}
