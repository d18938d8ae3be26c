package sockets

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdp-onload/onload/interrupts"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// Stack is an accelerated TCP/IP stack: its sockets are served in this
// process, over one NIC. Dial, Listen and ListenPacket use the process's
// default stack (created on first use from the ONLOAD_* variables); a
// program may also make its own with Open (an interface) or NewStack (any
// vnic.NIC, such as an in-memory pair) and use it through Dialer.Stack and
// ListenConfig.Stack.
type Stack struct {
	st    *stack.Stack
	nic   vnic.NIC
	sl    *interrupts.Sleeper
	cfg   Config
	spin  time.Duration
	addr  netip.Prefix
	local []netip.Addr // the host's own addresses: traffic to them stays in the kernel
	// host: the stack serves a host interface, so ports are reserved with
	// kernel sockets and listeners also listen in the kernel (local
	// clients reach them through loopback, not through our interface).
	host   bool
	ifname string
	// ifindex: ifname's index (InterfaceIndex), looked up once.
	ifindexOnce sync.Once
	ifindex     int
	// ports: the kernel's ephemeral range (kernelPorts), read once.
	portsOnce sync.Once
	ports     portRange
	// kernelConnects: why connections this process opens go to the
	// kernel, from onloadd (control.StackReply.KernelConnects); "": they
	// are the stack's.
	kernelConnects string
	proofs         *daemonFilters  // a stack of onloadd's: the proofs of our ports
	shared         *sharedPorts    // a stack of onloadd's: ports kept for the connections we open (nil: none)
	follow         *stack.Follower // the kernel's tables, followed (host stacks)
	// stopShared ends the wake-ups shared with the other processes of a
	// named stack of onloadd's (shareWakes).
	stopShared func()
	remoteFD   int // RemoteWakeFD

	waits []atomic.Pointer[waitq] // by socket slot
	// ready: the eventfds of threads blocked until the ready log's next
	// entry (ArmReady), written by its wake-up.
	ready   waitq
	closing chan struct{}

	inflight atomic.Int64 // calls into the engine now
	wakes    wakes        // the stack's wake-ups, rationed
	owed     owedSignals  // their eventfd writes, made after the lock
	closed   atomic.Bool

	mu       sync.Mutex
	refs     int            // sockets open
	teardown []func() error // run in order by Close
	onIdle   func()         // the default stack's reaper
}

// NewStack makes an accelerated stack over nic with interrupt line irq
// (interrupts.Mem for an in-memory NIC). sc gives the stack's address and
// sizes; cfg the spin policy and defaults (its zero value is the balanced
// profile); opt its filters and neighbours (its Wake is the Stack's own).
// The NIC and irq are the caller's to close after Close.
func NewStack(nic vnic.NIC, irq interrupts.Source, sc stack.Config, cfg Config, opt stack.Options) (*Stack, error) {
	return newStack(nic, irq, sc, cfg, opt)
}

func newStack(nic vnic.NIC, irq interrupts.Source, sc stack.Config, cfg Config, opt stack.Options) (*Stack, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if sc.Sockets == 0 {
		sc.Sockets = cfg.Sockets
	}
	if sc.MinRTO == 0 {
		sc.MinRTO = cfg.MinRTO
	}
	if sc.DelayedAck == 0 {
		sc.DelayedAck = cfg.DelayedAck
	}
	if sc.TimeWait == 0 {
		sc.TimeWait = cfg.TimeWait
	}
	if sc.SendBuffer == 0 {
		sc.SendBuffer = cfg.SendBuffer
	}
	if sc.RecvBuffer == 0 {
		sc.RecvBuffer = cfg.RecvBuffer
	}
	if sc.SendBufferMax == 0 {
		sc.SendBufferMax = max(cfg.SendBufferMax, sc.SendBuffer)
	}
	if sc.RecvBufferMax == 0 {
		sc.RecvBufferMax = max(cfg.RecvBufferMax, sc.RecvBuffer)
	}
	if sc.Congestion == "" {
		sc.Congestion = cfg.Congestion
	}
	s := &Stack{nic: nic, cfg: cfg, spin: cfg.Spin, addr: sc.Addr, closing: make(chan struct{}), remoteFD: -1}
	opt.Wake, opt.ReadyWake, opt.Unlocked = s.wake, s.readyWake, s.owed.flush
	st, err := stack.New(nic, sc, opt)
	if err != nil {
		return nil, fmt.Errorf("new stack: %w", err)
	}
	if err := s.start(st, irq); err != nil {
		st.Destroy()
		return nil, err
	}
	return s, nil
}

// attachStack runs a stack whose image another process made (onloadd):
// img over nic, with address addr.
func attachStack(img *stack.Image, nic vnic.NIC, irq interrupts.Source, cfg Config, addr netip.Prefix, opt stack.Options) (*Stack, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	s := &Stack{nic: nic, cfg: cfg, spin: cfg.Spin, addr: addr, closing: make(chan struct{}), remoteFD: -1}
	opt.Wake, opt.ReadyWake, opt.Unlocked = s.wake, s.readyWake, s.owed.flush
	st := stack.Attach(img, nic, opt)
	if err := s.start(st, irq); err != nil {
		return nil, err
	}
	return s, nil
}

// start runs the engine st: its wait queues and its Sleeper.
func (s *Stack) start(st *stack.Stack, irq interrupts.Source) error {
	s.st = st
	s.waits = make([]atomic.Pointer[waitq], st.Capacity())
	s.wakes.init(st.Capacity(), runtime.GOMAXPROCS(0))
	var err error
	s.sl, err = interrupts.Start(st, irq, interrupts.Policy{Spin: s.cfg.Spin, Spinners: s.cfg.SpinThreads, Thread: threadWakes.Load()})
	return err
}

// Addr is the stack's address and subnet.
func (s *Stack) Addr() netip.Prefix { return s.addr }

// Engine is the TCP/IP engine under the stack, for inspection
// (counters, DumpSocket).
func (s *Stack) Engine() *stack.Stack { return s.st }

// Sleeper is the stack's interrupt policy, for inspection (its counters).
func (s *Stack) Sleeper() *interrupts.Sleeper { return s.sl }

// readyWake is the engine's ReadyWake callback: it runs under the stack
// lock.
func (s *Stack) readyWake() { s.ready.wake(&s.owed) }

// ForgetSignals is for a thread about to close eventfd efd (the shim's):
// no wake of the stack's writes it after this returns.
func (s *Stack) ForgetSignals(efd int32) { s.owed.forget(efd) }

// wake is the engine's Wake callback: it runs under the stack lock.
func (s *Stack) wake(id stack.SockID) {
	if i := id.Slot(); i < len(s.waits) {
		s.wakes.post(s, i)
	}
}

// enter marks a call into the engine; false if the stack is closed.
func (s *Stack) enter() bool {
	s.inflight.Add(1)
	if s.closed.Load() {
		s.inflight.Add(-1)
		return false
	}
	return true
}

// leave ends a call into the engine. If the call armed a timer earlier
// than an armed Sleeper means to wake, the Sleeper is told.
func (s *Stack) leave() {
	if s.sl.Armed() {
		s.sl.TimerSet(s.st.EarliestTimer())
	}
	s.inflight.Add(-1)
}

// hold counts a socket against the stack; release gives it back.
func (s *Stack) hold() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.refs++
	return true
}

func (s *Stack) release() {
	s.mu.Lock()
	s.refs--
	idle := s.refs == 0 && s.onIdle != nil
	s.mu.Unlock()
	if idle {
		s.onIdle()
	}
}

// Close closes the stack: sockets still open fail with net.ErrClosed, the
// engine and everything it was given are released.
func (s *Stack) Close() error {
	s.mu.Lock()
	if s.closed.Swap(true) {
		s.mu.Unlock()
		return nil
	}
	close(s.closing)
	s.mu.Unlock()
	s.sl.Stop()
	if s.follow != nil {
		s.follow.Close()
	}
	if s.stopShared != nil {
		s.stopShared()
	}
	// Calls already in the engine finish in microseconds.
	for i := 0; s.inflight.Load() != 0 && i < 10000; i++ {
		time.Sleep(100 * time.Microsecond)
	}
	if s.inflight.Load() != 0 {
		return errors.New("close stack: calls still in the engine after 1s; leaving it mapped")
	}
	errs := []error{s.st.Destroy()}
	for _, f := range s.teardown {
		errs = append(errs, f())
	}
	return errors.Join(errs...)
}

// Exit is for a process that is exiting: on a stack of its own (not
// onloadd's) it closes every socket the process left open, as the kernel
// closes a process's descriptors when it exits (a connection sends what
// was written and then FIN; RST instead if data came that was never
// read, or with SO_LINGER 0), and serves the stack until the peers have
// acknowledged those connections' data and FIN, or wait has passed. The
// kernel finishes such connections after the process is gone; here
// nothing would, and a peer that was not sending learned of the end only
// at its own timeout. So a connection still delivering after a moment
// (exitHandover) is handed over to the kernel, which finishes it however
// long the peer takes (handOverUndelivered); one that cannot be (a
// process without the privilege to repair sockets) has the rest of
// wait. A stack of onloadd's is left to onloadd, which
// closes the process's sockets once it is gone (stack.CloseAbandoned). It
// reports how many connections were still finishing at the end (-1: the
// stack lock stayed held, by another thread that does not let it go);
// Finish says the same as an error.
func (s *Stack) Exit(wait time.Duration) (lingering int) {
	if s.proofs != nil || !s.enter() {
		return 0
	}
	defer s.leave()
	start := time.Now()
	end := start.Add(wait)
	if _, ok := s.st.CloseAbandoned(min(wait, 100*time.Millisecond)); !ok {
		return -1
	}
	handed := false
	// The frames the closes sent (a reset for a connection whose bytes
	// were never read) leave before the process does: a kick left to
	// another thread's kick loop went with the process (TestShimEnds's
	// peer then learned of the end 15 s on, from its own retransmission).
	defer s.st.DrainNIC(exitDrain)
	for {
		n := s.st.Undelivered()
		if n == 0 {
			return 0
		}
		now := time.Now()
		if !handed && now.Sub(start) >= min(wait, exitHandover) {
			handed = true
			s.handOverUndelivered()
			continue
		}
		if now.After(end) {
			return n
		}
		s.st.Poll()
		s.st.KickHeld()
		time.Sleep(50 * time.Microsecond)
	}
}

// Finish is Exit, with an error that says what was left unfinished.
func (s *Stack) Finish(wait time.Duration) error {
	switch n := s.Exit(wait); {
	case n < 0:
		return fmt.Errorf("finish: the stack lock stayed held; the connections left open end without a FIN")
	case n > 0:
		return fmt.Errorf("finish: %d connections had not delivered their data and FIN after %v; they end unfinished", n, wait)
	}
	return nil
}

// routes reports whether the stack carries traffic to dst: an IPv4
// address on its subnet, or beyond its gateway, that is not the host's own
// (that traffic goes through the kernel's loopback).
func (s *Stack) routes(dst netip.Addr) bool {
	dst = dst.Unmap()
	if !dst.Is4() || dst.IsLoopback() || dst.IsUnspecified() || dst.IsMulticast() || dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return false
	}
	if dst == s.addr.Addr() {
		return false
	}
	for _, a := range s.local {
		if a == dst {
			return false
		}
	}
	if s.addr.Contains(dst) {
		// The subnet's broadcast address is not a host.
		return dst != broadcast(s.addr)
	}
	return s.st.Gateway().IsValid()
}

// loopsBack reports whether a TCP connection to dst stays in the stack:
// dst is the stack's own address and one of its sockets (this process's
// or, on a shared stack, another's) listens there. Any other connection
// to the host's own addresses goes through the kernel's loopback, where
// the kernel half of an accelerated listener answers it too.
func (s *Stack) loopsBack(dst netip.AddrPort) bool {
	return dst.Addr().Unmap() == s.addr.Addr() && s.st.Listening(dst)
}

func broadcast(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// ours reports whether a local address names this stack: its own address
// or the wildcard.
func (s *Stack) ours(a netip.Addr) bool {
	a = a.Unmap()
	return !a.IsValid() || a.IsUnspecified() || a == s.addr.Addr()
}

// Dump describes the stack for diagnosis: every socket's state, the
// engine's counters and the Sleeper's.
func (s *Stack) Dump() string {
	if !s.enter() {
		return "stack closed"
	}
	defer s.leave()
	nl := s.nicLine()
	s.wakes.mu.Lock()
	wk := fmt.Sprintf("wakes: %d woken not yet run (limit %d), %d queued; %d woken, %d queued first, %d sends held their kick",
		s.wakes.backlog.Load(), s.wakes.limit, s.wakes.n, s.wakes.woken.Load(), s.wakes.queuedWakes.Load(), s.wakes.heldSends.Load())
	s.wakes.mu.Unlock()
	for i := range s.waits {
		if w := s.waits[i].Load(); w != nil {
			wk += s.dumpWaiters(i, w)
		}
	}
	return fmt.Sprintf("%s%ssleeper %+v %s\n%s\n", s.st.Dump(), nl, s.sl.Stats(), s.sl.Line(), wk)
}

// NICDump describes the stack's NIC: its counters and, for AF_XDP, the
// kernel's counters of the socket and of each lane (frames it dropped
// for want of a fill ring entry or room in the RX ring) and its rings.
func (s *Stack) NICDump() string {
	if !s.enter() {
		return "stack closed"
	}
	defer s.leave()
	return s.nicLine()
}

func (s *Stack) nicLine() string {
	var ks string
	var ns vnic.Stats
	s.st.InspectNIC(func(nic vnic.NIC) { // the polls write what it reads
		ns = nic.Stats()
		if x, ok := nic.(*vnic.XDP); ok {
			if st, err := x.Socket().Stats(); err == nil {
				sk := x.Socket()
				ks = fmt.Sprintf("xsk %+v rings: rx %d fill %d tx %d completion %d kick owed %v\n", st,
					x.RxPending(), sk.Fill.Pending(), sk.TX.Pending(), sk.Completion.Pending(), x.KickOwed())
			}
			for i, st := range x.LaneStats() {
				ks += fmt.Sprintf("lane %d xsk %+v\n", i+1, st)
			}
		}
	})
	return fmt.Sprintf("nic %+v\n%s", ns, ks)
}

// dumpWaiters describes slot i's sleepers, if it has any: what they
// wait for, the socket's events, and, where the socket is ready for them
// and no wake is queued for it, that a wake-up was lost. The sleepers are
// counted again after the events are read: a poll that readies the
// socket posts its wake under the stack lock, so a sleeper still counted
// after that has none coming unless the wake is queued.
func (s *Stack) dumpWaiters(i int, w *waitq) string {
	asleep := func() (int32, stack.Events) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.n, w.want
	}
	if n, _ := asleep(); n == 0 {
		return "" // most slots: no engine call for them
	}
	ev := s.st.Events(w.id)
	n, want := asleep()
	if n == 0 {
		return ""
	}
	s.wakes.mu.Lock()
	queued := s.wakes.queued[i]
	s.wakes.mu.Unlock()
	d := fmt.Sprintf(" [slot %d: %d asleep for %#x, events %#x", i, n, want, ev)
	switch {
	case ev&(want|stack.Error|stack.Hangup) == 0:
	case queued:
		d += ", ready, its wake queued"
	default:
		d += ", READY WITH NO WAKE COMING"
	}
	return d + "]"
}

// followKernel keeps the stack in step with the kernel's tables for its
// interface (MTU, gateway, neighbours). A stack that cannot follow them
// still runs, on what it read when it was made; the log says so.
func (s *Stack) followKernel() {
	f, err := stack.FollowKernel(s.st, s.ifname, func(format string, a ...any) {
		logf(levelInfo, "stack on %s: %s", s.ifname, fmt.Sprintf(format, a...))
	})
	if err != nil {
		logf(levelError, "stack on %s: %v; it keeps the MTU, gateway and neighbours it has", s.ifname, err)
		return
	}
	s.follow = f
}
