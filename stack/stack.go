package stack

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/timers"
	"github.com/xdp-onload/onload/vnic"
)

// Proto is a transport protocol.
type Proto uint8

const (
	UDP Proto = kindUDP
	TCP Proto = kindTCP
)

func (p Proto) String() string {
	switch p {
	case UDP:
		return "udp"
	case TCP:
		return "tcp"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// ipProto is the IPv4 protocol number of a socket kind.
func ipProto(kind uint8) uint8 {
	if kind == kindTCP {
		return 6
	}
	return 17
}

// Filters steer traffic to the stack: the XDP steering program's maps, or
// nothing for an in-memory NIC. The stack asks for the local ports it
// binds and gives them back when it closes them.
type Filters interface {
	AddListener(p Proto, local netip.AddrPort) error
	RemoveListener(p Proto, local netip.AddrPort) error
}

// ListenerRetirer is Filters that can end a listener's filter while the
// stack still has connections on its port (onloadd's: it steers each by
// a flow entry first). A stack's last listener on a port closes, or is
// retired (RetireListener), and its accepted connections live on: new
// connections to the port are no longer the stack's, as the kernel's are
// no longer the closed listener's, and a listener another process has on
// the port (a server restarted, or the one its predecessor passed the
// socket to) must get them. Without it the port stays steered until its
// last connection goes, and the stack resets those connections' SYNs.
type ListenerRetirer interface {
	RetireListener(p Proto, local netip.AddrPort)
}

// FlowSteerer is Filters that can steer one connection by a flow entry
// of its own, ahead of its port's listener entry (a stack's own, on the
// steering program): the stack retires a port so itself
// (retireListenerLocked).
type FlowSteerer interface {
	SteerFlow(p Proto, local, remote netip.AddrPort) error
	UnsteerFlow(p Proto, local, remote netip.AddrPort) error
}

// Resolver finds the Ethernet address of a neighbour the stack does not
// know yet (the kernel's neighbour table, in production).
type Resolver interface {
	Resolve(ip netip.Addr) (net.HardwareAddr, bool)
}

// Stack is this process's handle on a stack: the image it shares with
// any other process that maps it, the NIC, and scratch space. Its methods
// are safe for concurrent use: each takes the stack lock.
type Stack struct {
	img       *Image
	nic       vnic.NIC
	overflow  func(bool)      // Options.Overflow
	badCsum   func()          // Options.BadChecksum, until its call
	kicks     vnic.KickHolder // nic, if its kicks can be held (SendMore, RecvMore)
	late      vnic.LateKicker // nic, if it leaves its kicks for after the lock
	pool      *vnic.Pool
	filters   Filters
	resolver  Resolver
	reserve   int // free frames kept for receiving (see lowFramesLocked)
	rxDepth   int // the NIC's vnic.Info.RxDepth: the windows' shares are of it (tcp_rcvshare.go)
	tickNs    int64
	tickRecip uint64 // 2^64 / tickNs, for toTicks
	fast      *fastClock
	joined    atomic.Uint32 // this process's procs slot plus one (JoinWakes); 0: not joined. Set under the lock, read without it too (proc)
	remote    atomic.Uint32 // procs (bits) whose threads this handle's polls must wake
	wakes     wakeSockets   // this handle's wake socket (WakeSocket) and the one it wakes others from
	mtu       int           // the image's, as this handle last took it (syncMTULocked)
	maxMTU    int           // what the NIC's frames hold

	raceHB uint32      // see race_on.go
	id     uint64      // this handle's identity, to notice another took the lock
	nowNs  int64       // the clock, read when the lock was taken
	nowTk  timers.Tick // nowNs in ticks, worked out with it
	// kickNow: the application's Send is running; tcpOutputLocked hands
	// its segments to the NIC before its timer bookkeeping.
	kickNow bool
	// autocork: a SendCorked is running: its last partial segment may wait
	// for the caller's next wait (tcp_autocork.go); corked lists the
	// sockets so held, since corkedAt (nowNs), and corkedN counts them for
	// KickOwed.
	autocork bool
	// ackHold: a RecvCorked is reading: the ACK its read owes may wait
	// with the held segments (holdAckLocked).
	ackHold  bool
	corked   []SockID
	corkedAt int64
	corkedN  atomic.Int32

	// Scratch, used with the lock held.
	rx []vnic.Handle
	// batch: a poll's batch of frames is being taken in; it lists the
	// connections whose output waits for the batch's end (tcp_batch.go).
	// nil outside a poll.
	batch    []SockID
	batchBuf []SockID
	batchRun int           // frames of the batch's last connection in a row
	inOrder  bool          // the segment just taken in was data in order, by header prediction
	tx       []vnic.Handle // frames to give to the NIC
	txKeep   []vnic.Handle // frames to lend it (TCP data kept for retransmission)
	loop     []vnic.Handle // frames to our own address, to take in at unlock (loopback.go)
	loopIn   []vnic.Handle // the batch being taken in
	looped   atomic.Int32  // len(loop), for idle
	expired  []timers.ID

	wake func(SockID) // Options.Wake
	// readyWake is Options.ReadyWake, owed at the ready log's next entry
	// while readyArmed (ArmReady; under the lock).
	readyWake func()
	unlocked  func() // Options.Unlocked
	// peerFD is the raw socket that gives handed-over connections'
	// kernel sockets the segments that came to the stack late
	// (EndHandover makes it, in the stack's network namespace; -1: none
	// yet). The process's own, never in the image.
	peerFD int
	// flights are the handovers this handle has under way (handoverClaim).
	flights flights
	// handedTuples are the connections this handle handed over, as it
	// found them at BeginHandover, for their grace: the late segments it
	// gives the kernel must be theirs (lateSendLocked). Not the image's:
	// onloadd must not take another process's word for them.
	handedTuples map[SockID]handedTuple
	tuplesMu     sync.Mutex
	readyArmed   bool
	woken        int // sleepers woken since TryPoll began

	polledAt atomic.Int64 // see PolledAt
	watcher  bool         // onloadd's handle: its polls are not the process's (SetWatcher)
	mu       sync.Mutex   // this process's goroutines queue here for the lock (see lock)
	threads  bool         // the callers are threads come in from C: no queue on mu (see lock)
}

// rxBudget is how many frames one poll takes from the NIC.
const rxBudget = 64

// Options wire a new stack to the world around it.
type Options struct {
	Filters    Filters  // nil: no steering (an in-memory NIC)
	Resolver   Resolver // nil: only Neighbours are known
	Neighbours map[netip.Addr]net.HardwareAddr
	// Wake is called, with the stack lock held, for each socket a poll
	// changed while a thread waited on it (WaitFor). It must not block or
	// call into the stack.
	Wake func(SockID)
	// ReadyWake is called, with the stack lock held, at the ready log's
	// first entry after a caller asked for it (ArmReady). It must not
	// block or call into the stack.
	ReadyWake func()
	// Unlocked, if set, is called after each release of the stack lock
	// by this handle, outside the lock: Wake and ReadyWake may leave it
	// their system calls (an eventfd write that wakes a thread), which
	// under the lock held every other thread of the stack off while the
	// kernel woke one. It must not call into the stack.
	Unlocked func()
	// Overflow, if set, is called with the stack lock held when the
	// socket table fills with live connections (true: nearly full) and
	// when it has room again (false): while it is full, the steering
	// program gives new connections to the listeners' kernel halves
	// (bpf.Control.SetFull). It must not block or call into the stack.
	Overflow func(full bool)
	// BadChecksum, if set, is called once, with the stack lock held, at
	// the first TCP segment or UDP datagram this handle drops for a
	// wrong checksum (counted RxTCPBadChecksum, RxUDPBadChecksum): on a
	// veth whose peer leaves its checksums to an offload, every one is
	// wrong, and the stack answers nothing. It must not block or call
	// into the stack.
	BadChecksum func()
}

// New makes a stack over nic: a new image, configured by cfg.
func New(nic vnic.NIC, cfg Config, opt Options) (*Stack, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if nic.Info().MTU < cfg.MTU {
		return nil, fmt.Errorf("stack config: MTU %d is larger than the NIC's (%d)", cfg.MTU, nic.Info().MTU)
	}
	if cfg.MTU > frameMTU(nic) {
		return nil, fmt.Errorf("stack config: MTU %d does not fit the NIC's %d-byte frames", cfg.MTU, nic.Pool().FrameSize()-nic.Pool().Headroom())
	}
	img, err := newImage(&cfg, Now())
	if err != nil {
		return nil, err
	}
	s := newStack(img, nic, opt)
	for ip, mac := range opt.Neighbours {
		if err := s.AddNeighbour(ip, mac); err != nil {
			img.Close()
			return nil, err
		}
	}
	return s, nil
}

// Attach makes a handle on an existing image (another process's stack)
// over nic, which must be a view of the same frames.
func Attach(img *Image, nic vnic.NIC, opt Options) *Stack {
	return newStack(img, nic, opt)
}

var stackIDs atomic.Uint64

// frameMTU is the largest MTU the NIC's frames hold (with the Ethernet
// header), and the stack takes (9000).
func frameMTU(nic vnic.NIC) int {
	return min(9000, nic.Pool().FrameSize()-nic.Pool().Headroom()-14)
}

func newStack(img *Image, nic vnic.NIC, opt Options) *Stack {
	kicks, _ := nic.(vnic.KickHolder)
	late, _ := nic.(vnic.LateKicker)
	if late != nil {
		late.SetLateKicks(true)
	}
	st := &Stack{
		kicks:   kicks,
		late:    late,
		threads: threadCallers.Load(),
		id:      uint64(os.Getpid())<<32 | stackIDs.Add(1),
		reserve: max(16, nic.Pool().Count()/32),
		img:     img, nic: nic, pool: nic.Pool(), filters: opt.Filters, resolver: opt.Resolver, overflow: opt.Overflow,
		badCsum: opt.BadChecksum,
		tickNs:  int64(img.hdr.tickNs), tickRecip: recip(img.hdr.tickNs), fast: newClock(), mtu: int(img.hdr.mtu),
		maxMTU: frameMTU(nic), rxDepth: nic.Info().RxDepth,
		rx: make([]vnic.Handle, rxBudget), batchBuf: make([]SockID, 0, rxBudget), tx: make([]vnic.Handle, 0, 256), txKeep: make([]vnic.Handle, 0, 256),
		loop: make([]vnic.Handle, 0, maxLoop), loopIn: make([]vnic.Handle, 0, maxLoop),
		expired: make([]timers.ID, 64), wake: opt.Wake, readyWake: opt.ReadyWake, unlocked: opt.Unlocked, wakes: wakeSockets{own: -1},
		peerFD: -1,
	}
	st.wakes.send.Store(-1)
	return st
}

// Image is the stack's image, to hand to another process.
func (s *Stack) Image() *Image { return s.img }

// Addr is the stack's IPv4 address.
func (s *Stack) Addr() netip.Addr { return netip.AddrFrom4(s.img.hdr.addr) }

// Gateway is the stack's next hop off its subnet; the zero Addr if it has
// none.
func (s *Stack) Gateway() netip.Addr {
	s.lock()
	defer s.unlock()
	if s.img.hdr.gateway == [4]byte{} {
		return netip.Addr{}
	}
	return netip.AddrFrom4(s.img.hdr.gateway)
}

// Counters returns a copy of the stack's counters.
func (s *Stack) Counters() Counters {
	s.lock()
	defer s.unlock()
	return s.img.hdr.counters
}

// lock takes the stack lock, waiting for it. The goroutines of this
// process queue on the handle's mutex first, so that at most one of them
// waits on the image's lock word (which sleeps in futex_wait, holding an
// OS thread): Go's mutex parks the rest in the scheduler, and hands the
// lock on in order once a waiter has waited a millisecond. A crowd of
// goroutines in futex_wait came back one by one through the scheduler's
// global run queue, and some waited tens of milliseconds for the lock.
// Polls take the word alone, by trylock (Poll, TryPoll): whoever holds it
// does their work. Where the callers are threads come in from C
// (CallersAreThreads) they go to the word at once: each is an OS thread
// already, and parking one in the scheduler hands its processor to
// another OS thread and back.
func (s *Stack) lock() {
	if !s.threads {
		s.mu.Lock()
	}
	s.img.hdr.lock.Lock()
	s.lockedLocked()
}

// lockedLocked runs whenever this handle has just taken the lock: if
// another process drove the stack since, the NIC's cached view of the
// rings is stale.
func (s *Stack) lockedLocked() {
	raceAcquire(&s.raceHB)
	s.nowNs = 0 // read again when needed
	if h := s.img.hdr; h.poller != s.id {
		s.nic.Resync()
		h.poller = s.id
	}
	if int(s.img.hdr.mtu) != s.mtu {
		s.syncMTULocked()
	}
}

// unlock does the work others deferred to us, then lets the lock go.
func (s *Stack) unlock() {
	s.unlockTried()
	if !s.threads {
		s.mu.Unlock()
	}
}

// unlockTried lets go of a lock taken by trylock (LockOrDefer), which
// holds the image's word only.
//
// The NIC's doorbell is rung after the lock is let go (vnic.LateKicker):
// in copy mode the kick is the kernel's whole transmit, which under the
// lock would hold every other thread and process of the stack off.
func (s *Stack) unlockTried() {
	if len(s.loop) > 0 {
		s.loopLocked()
	}
	kick := s.late != nil && s.late.TakeKick()
	raceRelease(&s.raceHB)
	s.img.hdr.lock.Unlock(s.deferredLocked)
	if s.unlocked != nil {
		s.unlocked()
	}
	if kick {
		s.late.KickUnlocked()
	}
	if s.remote.Load() != 0 {
		s.wakeRemotes()
	}
}

func (s *Stack) deferredLocked(d Deferred) {
	if d&DeferPoll != 0 {
		s.pollLocked()
	}
	s.flushLocked()
	s.loopLocked()
	if s.late != nil && s.late.TakeKick() {
		// Work others left us: rare enough to kick under the lock.
		s.late.KickUnlocked()
	}
	raceRelease(&s.raceHB)
}

// Destroy closes every socket, freeing its frames, and unmaps the image.
// The NIC is the caller's to close.
func (s *Stack) Destroy() error {
	defer s.closeWakeSockets()
	s.lock()
	for i := range s.img.socks {
		sk := &s.img.socks[i]
		if sk.kind != kindFree {
			s.closeLocked(sk)
		}
	}
	for i := range s.img.neigh {
		e := &s.img.neigh[i]
		for h := e.pendHead; h != vnic.Null; {
			next := s.pool.Next(h)
			s.pool.Free(h)
			h = next
		}
		e.pendHead, e.pendTail, e.npending = vnic.Null, vnic.Null, 0
	}
	s.flushLocked()
	if s.peerFD >= 0 {
		unix.Close(s.peerFD)
		s.peerFD = -1
	}
	s.unlock()
	return s.img.Close()
}

// AddNeighbour records the Ethernet address of a neighbour.
func (s *Stack) AddNeighbour(ip netip.Addr, mac net.HardwareAddr) error {
	if !ip.Is4() || len(mac) != 6 {
		return fmt.Errorf("neighbour %v at %v: want an IPv4 address and an Ethernet address", ip, mac)
	}
	s.lock()
	defer s.unlock()
	var m [6]byte
	copy(m[:], mac)
	if !s.setNeighbourLocked(ip.As4(), m) {
		return errors.New("neighbour table is full")
	}
	s.flushLocked()
	return nil
}

// lowFramesLocked reports that the free frames are down to the reserve
// kept for receiving. Below it, sends wait and received data is dropped
// (its acknowledgements still count): if queued data could take every
// frame, the NIC would have none to receive into, the ACKs that free
// sent frames would never arrive, and the stack would deadlock.
func (s *Stack) lowFramesLocked() bool { return s.pool.Available() <= s.reserve }

// framesTightLocked reports that a quarter of the frames or less are free:
// buffers stop growing by themselves (as Linux's tcp_mem pressure stops
// autotuning), so that the connections' buffers do not add up to more
// than the pool.
func (s *Stack) framesTightLocked() bool { return s.pool.Available() < s.pool.Count()/4 }

// sendFramesFullLocked reports that the TCP send queues hold half the
// frames: the rest stay for receiving. Data queued to send waits for its
// ACK, and the ACK waits for the peer to take the data in; if two stacks
// each spent their frames on sending, neither could take the other's data
// in, and both would wait for ever.
func (s *Stack) sendFramesFullLocked() bool {
	return int(s.img.hdr.sndFrames) >= s.pool.Count()/2
}

// recip is 2^64 / n, rounded down.
func recip(n uint64) uint64 {
	q, _ := bits.Div64(1, 0, n)
	return q
}
