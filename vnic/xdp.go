package vnic

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/xdp"
)

// XDPConfig says which device queue an XDP NIC binds and how much memory
// it has.
type XDPConfig struct {
	Interface string
	Queue     int
	// FrameSize and FrameCount size the UMEM (defaults 2048 and 4096).
	FrameSize, FrameCount int
	// RingSize is the size of each of the four rings (default 2048).
	RingSize int
	// FillDepth is how many frames the fill ring is kept topped up with
	// (default 128, at most RingSize and FrameCount/2). The kernel takes
	// fill frames in order, so every frame in the ring is touched once per
	// lap: a shallow ring keeps the frames in use few and hot in the caches
	// and TLB, and a poller that refills on every Receive needs no more. A
	// deeper ring absorbs longer bursts while nobody polls.
	FillDepth int
	Mode      xdp.BindMode
	// RxLane receives through a lane (AddLane) opened with the socket:
	// an RX ring of its own and no TX ring, whose descriptor (RxFD) the
	// steering program sends the queue's frames to and waiters block on.
	// In copy mode every poll of an AF_XDP socket with a TX ring drives
	// its transmit under the socket's mutex (xsk_poll), where a kick may
	// be running veth's whole receive path: each thread of a
	// thread-a-connection server that blocked on the socket queued
	// behind the kicks. A poll of the lane touches its RX ring alone.
	RxLane bool
}

// withDefaults fills in the zero fields and checks the counts the pool
// and the fill ring are sized by; the UMEM and the rings check the rest.
func (cfg XDPConfig) withDefaults() (XDPConfig, error) {
	if cfg.FrameSize == 0 {
		cfg.FrameSize = 2048
	}
	if cfg.FrameCount == 0 {
		cfg.FrameCount = 4096
	}
	if cfg.RingSize == 0 {
		cfg.RingSize = 2048
	}
	if cfg.FillDepth == 0 {
		cfg.FillDepth = 128
	}
	if cfg.FrameCount < 2 || cfg.FrameCount > MaxFrames {
		return cfg, fmt.Errorf("frame count %d: must be from 2 to %d", cfg.FrameCount, MaxFrames)
	}
	if cfg.FillDepth < 1 {
		return cfg, fmt.Errorf("fill depth %d: must be at least 1", cfg.FillDepth)
	}
	return cfg, nil
}

// refillBelow is the fill level below which a Receive that took frames
// refills the ring (one that took none always does): the least the kernel
// has to receive into between two polls, so the NIC's RxDepth.
func refillBelow(target uint32) uint32 { return target - target/4 }

// fillTarget is how many frames the fill ring is kept topped up with: the
// fill depth, within the ring and half the frames.
func (cfg XDPConfig) fillTarget() uint32 {
	return uint32(min(cfg.FillDepth, cfg.RingSize, cfg.FrameCount/2))
}

// XDP is a NIC over one AF_XDP socket. Its frame pool lives in the UMEM
// memfd: the frames in the registered part, the pool's descriptors in the
// region after it, so a process given the memfd sees everything.
//
// The socket only receives what the steering program redirects to it:
// register FD() in bpf.Steering.SetSocket for the queue.
type XDP struct {
	umem       *xdp.Umem
	sock       *xdp.Socket
	pool       *Pool
	info       Info
	fillTarget uint32
	inFill     uint32      // frames given to the kernel to receive into
	holdKick   bool        // HoldKicks
	kickOwed   atomic.Bool // frames on the TX ring wait for a kick
	// The frames held since the last kick and when the first was: a hold
	// never keeps more than maxHeld frames, or any for longer than
	// maxHoldNs, however busy the callers stay.
	held      uint32
	heldSince int64
	// late: the stack gives the kicks after its lock (SetLateKicks);
	// due: one is owed to it (TakeKick).
	late, due bool
	// kicking: a thread of this process is in KickUnlocked's system call;
	// kickAgain: another's frames went on the ring meanwhile, for it to
	// kick for them once more.
	kicking, kickAgain atomic.Bool
	zeroCopy           bool // the socket is bound zero-copy
	// lanes are more RX rings on the socket's queue (AddLane), which
	// Receive drains after the socket's own. Replaced, never changed in
	// place: Idle and RxPending read it without the stack lock.
	lanes atomic.Pointer[[]*xdp.Socket]
	// rx is the lane the queue's frames come to (XDPConfig.RxLane), or
	// nil: the socket's own RX ring.
	rx    *xdp.Socket
	stats Stats
}

// OpenXDP creates the UMEM and the socket and fills the fill ring. It must
// run in the interface's network namespace.
func OpenXDP(cfg XDPConfig) (*XDP, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("open xdp nic: %w", err)
	}
	umem, err := xdp.NewUmem(xdp.UmemConfig{
		FrameSize: cfg.FrameSize, FrameCount: cfg.FrameCount,
		MetaSize: PoolMetaSize(cfg.FrameCount),
	})
	if err != nil {
		return nil, fmt.Errorf("open xdp nic: %w", err)
	}
	pool, err := NewPool(umem.Meta(), umem.Frames(), cfg.FrameSize, unix.XDP_PACKET_HEADROOM)
	if err != nil {
		umem.Close()
		return nil, fmt.Errorf("open xdp nic: %w", err)
	}
	sock, err := xdp.Open(umem, xdp.Config{
		Interface: cfg.Interface, Queue: cfg.Queue, Mode: cfg.Mode,
		RxSize: cfg.RingSize, TxSize: cfg.RingSize, FillSize: cfg.RingSize, CompletionSize: cfg.RingSize,
	})
	if err != nil {
		umem.Close()
		return nil, err // already a sentence naming the interface and queue
	}
	mode := "xdp copy"
	if sock.ZeroCopy() {
		mode = "xdp zero-copy"
	}
	iface := sock.Interface()
	x := &XDP{
		umem: umem, sock: sock, pool: pool,
		info:       Info{Name: fmt.Sprintf("%s queue %d", iface.Name, cfg.Queue), Mode: mode, MTU: iface.MTU, MAC: iface.MAC, RxDepth: int(refillBelow(cfg.fillTarget()))},
		fillTarget: cfg.fillTarget(),
		zeroCopy:   sock.ZeroCopy(),
	}
	if cfg.RxLane {
		if _, _, err := x.AddLane(); err != nil {
			x.Close()
			return nil, fmt.Errorf("open xdp nic: receive lane: %w", err)
		}
		x.rx = x.laneList()[0]
	}
	x.refill()
	return x, nil
}

// AttachRxLane drives the receive lane (XDPConfig.RxLane) of a NIC that
// another process opened, fd its descriptor there (RxFD), as AttachXDP
// drives the socket: the XDP owns fd from the call on.
func (x *XDP) AttachRxLane(fd int) error {
	if x.rx != nil || len(x.laneList()) > 0 {
		unix.Close(fd)
		return errors.New("attach receive lane: the NIC has lanes already")
	}
	l, err := xdp.AttachLane(x.sock, fd, int(x.sock.RX.Size()))
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("attach receive lane: %w", err)
	}
	lanes := []*xdp.Socket{l}
	x.lanes.Store(&lanes)
	x.rx = l
	x.Resync()
	return nil
}

// AttachXDP drives an AF_XDP socket another process opened with OpenXDP:
// umemFD and sockFD are that process's UMEM memfd and socket (received
// over a unix socket, or by fork/exec), and cfg its configuration. The
// frames, their owners and the rings are shared; each side resyncs its
// cached view when it takes over (Resync). The XDP owns both descriptors
// from the call on: it closes them on failure, and Close closes them.
func AttachXDP(umemFD, sockFD int, cfg XDPConfig) (*XDP, error) {
	fail := func(umem *xdp.Umem, err error) (*XDP, error) {
		if umem != nil {
			umem.Close()
		} else {
			unix.Close(umemFD)
		}
		unix.Close(sockFD)
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return fail(nil, fmt.Errorf("attach xdp nic: %w", err))
	}
	umem, err := xdp.OpenUmem(umemFD, xdp.UmemConfig{FrameSize: cfg.FrameSize, FrameCount: cfg.FrameCount, MetaSize: PoolMetaSize(cfg.FrameCount)})
	if err != nil {
		return fail(nil, fmt.Errorf("attach xdp nic: %w", err))
	}
	pool, err := AttachPool(umem.Meta(), umem.Frames())
	if err != nil {
		return fail(umem, fmt.Errorf("attach xdp nic: %w", err))
	}
	sock, err := xdp.AttachSocket(umem, sockFD, xdp.Config{
		Interface: cfg.Interface, Queue: cfg.Queue,
		RxSize: cfg.RingSize, TxSize: cfg.RingSize, FillSize: cfg.RingSize, CompletionSize: cfg.RingSize,
	})
	if err != nil {
		return fail(umem, err)
	}
	x := &XDP{
		umem: umem, sock: sock, pool: pool,
		info:       Info{Name: fmt.Sprintf("%s queue %d", cfg.Interface, cfg.Queue), Mode: "xdp (attached)", MTU: 1500, RxDepth: int(refillBelow(cfg.fillTarget()))},
		fillTarget: cfg.fillTarget(),
		zeroCopy:   sock.ZeroCopy(),
	}
	if iface := sock.Interface(); iface.MTU > 0 {
		x.info.MTU, x.info.MAC = iface.MTU, iface.MAC
	}
	x.Resync()
	return x, nil
}

// Resync reloads the rings' cached indices and recounts the frames given
// to the kernel for receiving.
func (x *XDP) Resync() {
	x.sock.Resync()
	x.inFill = x.sock.Fill.Pending() + x.sock.RX.Pending()
	for _, l := range x.laneList() {
		l.Resync()
		x.inFill += l.RX.Pending()
	}
}

// AddLane opens a lane (xdp.OpenLane): an RX ring of its own on the
// socket's queue, sharing its frames and fill ring, for the steering
// program to send some flows to (bpf.Steering.SetLaneSocket, SetLane), so
// that a thread can wait on the lane's descriptor for its own flows'
// frames. Receive drains every lane. Lane numbers start at 1 and count
// the lanes opened; at most bpf.MaxLanes-1, and only on a NIC this process
// opened (OpenXDP). The caller drives the NIC (holds the stack lock).
func (x *XDP) AddLane() (lane int, fd int, err error) {
	old := x.laneList()
	if len(old)+1 >= maxLanes {
		return 0, -1, fmt.Errorf("add lane: the NIC has %d lanes, the most it may", len(old))
	}
	l, err := xdp.OpenLane(x.sock, int(x.sock.RX.Size()))
	if err != nil {
		return 0, -1, fmt.Errorf("add lane: %w", err)
	}
	lanes := append(old[:len(old):len(old)], l)
	x.lanes.Store(&lanes)
	return len(lanes), l.FD(), nil
}

func (x *XDP) laneList() []*xdp.Socket {
	if l := x.lanes.Load(); l != nil {
		return *l
	}
	return nil
}

// maxLanes is the steering program's MAX_LANES (lane 0 is the socket).
const maxLanes = 16

func (x *XDP) Pool() *Pool { return x.pool }

// Idle reports that the RX ring is empty, the fill ring is more than half
// full and no sent frames wait to be taken back. It reads only the rings'
// shared words, so it is safe to call while another goroutine drives the
// NIC.
func (x *XDP) Idle() bool {
	return x.RxPending() == 0 && x.sock.Completion.Pending() == 0 && x.sock.Fill.Pending() >= x.fillTarget/2 &&
		!x.kickOwed.Load()
}

// HoldKicks puts kicks off while hold is set (KickHolder): transmits and
// Receive leave the kick owed. Releasing the hold does not kick by
// itself: the next transmit or Receive does.
func (x *XDP) HoldKicks(hold bool) { x.holdKick = hold }

// RxPending is how many received frames wait in the RX ring. It reads the
// ring's shared words: any goroutine (or process) may call it.
func (x *XDP) RxPending() uint32 {
	n := x.sock.RX.Pending()
	for _, l := range x.laneList() {
		n += l.RX.Pending()
	}
	return n
}

// KickOwed reports that frames on the TX ring wait for a kick (KickHolder).
// It reads one shared word: any goroutine may call it.
func (x *XDP) KickOwed() bool { return x.kickOwed.Load() }

// Kick kicks the kernel for frames left on the TX ring by a held
// transmit (KickHolder); nothing if none are owed.
func (x *XDP) Kick() error {
	if !x.kickOwed.Load() {
		return nil
	}
	return x.doorbell()
}

// SetLateKicks turns late kicks on or off (LateKicker). Under the lock,
// as Transmit.
func (x *XDP) SetLateKicks(on bool) { x.late = on }

// TakeKick takes the kick a transmit or Receive left due (LateKicker),
// under the lock: the caller gives it (KickUnlocked) once it has let the
// lock go.
func (x *XDP) TakeKick() bool {
	if !x.due {
		return false
	}
	x.due = false
	x.held = 0
	x.stats.TxKicks++
	x.kickOwed.Store(false)
	return true
}

// KickUnlocked gives a kick TakeKick took, without the stack lock: the
// system call. Frames the kernel leaves on the ring stay owed, for the
// next poll to kick (as kick's).
//
// The kernel serialises a socket's transmits on a mutex, and a transmit
// on veth runs the peer's receive, and the peer's TCP, in the caller's
// context: a second thread's kick would spin on the mutex for as long. So
// while one thread of the process kicks, another only asks it to kick once
// more, which covers its frames, and goes on with its work.
func (x *XDP) KickUnlocked() error {
	if !x.kicking.CompareAndSwap(false, true) {
		x.kickAgain.Store(true)
		if x.kicking.CompareAndSwap(false, true) {
			// The kicker finished before it could see the request.
			return x.kickLoop()
		}
		return nil
	}
	return x.kickLoop()
}

// kickLoop kicks until no thread asks for another, then gives up the
// kicking flag; a request that comes as it does is taken by its maker
// (KickUnlocked) or by this loop again. After maxKickLoops kicks it leaves
// what is still asked for owed (kickOwed), for the next poll: a thread
// is not kept kicking for the others for ever.
func (x *XDP) kickLoop() error {
	var err error
	for i := 1; ; i++ {
		x.kickAgain.Store(false)
		if e := x.sock.Kick(); e != nil && err == nil {
			err = e
		}
		if x.kickAgain.Load() && i < maxKickLoops {
			continue
		}
		x.kicking.Store(false)
		if !x.kickAgain.Load() {
			break
		}
		if i >= maxKickLoops {
			x.kickOwed.Store(true)
			break
		}
		if !x.kicking.CompareAndSwap(false, true) {
			break // the asker kicks
		}
	}
	if x.sock.TX.Pending() > 0 {
		x.kickOwed.Store(true)
	}
	return err
}

// Drain kicks until the kernel has taken every frame on the TX ring and
// no thread of the process is kicking, for at most timeout; false if
// frames were left (Drainer). Without the stack lock. A process about to
// end calls it: a frame whose kick it left to another thread's kick loop
// (KickUnlocked) was lost if the process ended first.
func (x *XDP) Drain(timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for {
		kicking := x.kicking.Load()
		if !kicking && x.sock.TX.Pending() == 0 {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		if !kicking && x.kicking.CompareAndSwap(false, true) {
			x.kickLoop()
			continue
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// maxKickLoops bounds the kicks one KickUnlocked gives for other threads.
const maxKickLoops = 16

// doorbell kicks, or with late kicks leaves the kick due to the stack.
func (x *XDP) doorbell() error {
	if x.late {
		x.due = true
		x.kickOwed.Store(true)
		return nil
	}
	return x.kick()
}

// Bounds of a hold (HoldKicks): a batch of this size already shares
// one system call well, and this long is a small part of a round trip.
const (
	maxHeld   = 64
	maxHoldNs = 50_000
)

// holding reports whether n more frames may wait for a later kick.
func (x *XDP) holding(n uint32) bool {
	if !x.holdKick {
		return false
	}
	now := time.Now().UnixNano()
	if x.held == 0 {
		if x.kickOwed.Load() {
			return false // owed by a kick the kernel cut short: kick now
		}
		x.heldSince = now
	}
	if x.held+n > maxHeld || now-x.heldSince > maxHoldNs {
		return false
	}
	x.held += n
	return true
}

// kick hands the TX ring to the kernel. Frames the kernel leaves there
// (it stopped early: a full completion ring, no memory) stay owed, so
// that the next poll, which takes completions back first, kicks again:
// no frame waits on the ring for a send that may be long in coming.
func (x *XDP) kick() error {
	x.stats.TxKicks++
	x.held = 0
	err := x.sock.Kick()
	x.kickOwed.Store(x.sock.TX.Pending() > 0)
	return err
}

func (x *XDP) Info() Info { return x.info }

// SetMTU changes the largest frame Transmit takes (MTUSetter). It runs
// under the stack lock, as Transmit does.
func (x *XDP) SetMTU(mtu int) { x.info.MTU = mtu }

// FD is the AF_XDP socket: its TX ring, and the kicks.
func (x *XDP) FD() int { return x.sock.FD() }

// RxFD is the descriptor the queue's frames arrive on, for the steering
// program's XSKMAP (bpf.Steering.SetSocket) and for a waiter to block on
// (readable while a frame waits): the receive lane's (XDPConfig.RxLane),
// or the socket's.
func (x *XDP) RxFD() int {
	if x.rx != nil {
		return x.rx.FD()
	}
	return x.sock.FD()
}

// Socket is the underlying AF_XDP socket.
func (x *XDP) Socket() *xdp.Socket { return x.sock }

// Umem is the packet memory (its FD shares it with another process).
func (x *XDP) Umem() *xdp.Umem { return x.umem }

// refill tops the fill ring up to its target from the free frames.
func (x *XDP) refill() {
	if x.inFill >= x.fillTarget {
		return
	}
	want := min(x.fillTarget-x.inFill, uint32(x.pool.Available()))
	if want == 0 {
		return
	}
	idx, got := x.sock.Fill.Reserve(want)
	var n uint32
	for ; n < got; n++ {
		addr, ok := x.pool.fillKernel()
		if !ok {
			break
		}
		x.sock.Fill.Set(idx+n, addr)
	}
	x.sock.Fill.Cancel(got - n)
	if n > 0 {
		x.sock.Fill.Submit()
		x.inFill += n
	}
}

// reapBatch is how many sent frames Transmit lets wait in the completion
// ring before taking them back itself.
const reapBatch = 32

// reap takes sent frames back from the completion ring.
func (x *XDP) reap() {
	c := &x.sock.Completion
	idx, got := c.Peek(c.Size())
	if got == 0 {
		return
	}
	for i := range got {
		if !x.pool.kernelDone(c.Get(idx + i)) {
			x.stats.TxErrors++
		}
	}
	c.Release()
}

// Receive takes up to len(hs) frames from the RX ring. Housekeeping
// (taking sent frames back from the completion ring, topping the fill ring
// up) is done when the RX ring is empty or the fill ring is half drained,
// so that a frame that has just arrived goes back to the caller at once.
func (x *XDP) Receive(hs []Handle) int {
	if !x.holding(0) {
		x.Kick()
	}
	got, n := x.receiveRing(&x.sock.RX, hs)
	for _, l := range x.laneList() {
		if n == len(hs) {
			break
		}
		g, m := x.receiveRing(&l.RX, hs[n:])
		got += g
		n += m
	}
	if got == 0 || x.inFill < refillBelow(x.fillTarget) {
		x.reap()
		x.refill()
		// Only a zero-copy driver sets the fill ring's need-wakeup flag;
		// in copy mode reading it would only pull the line the kernel
		// writes its consumer index to, on every empty poll.
		if got == 0 && x.zeroCopy && x.sock.Fill.NeedsWakeup() {
			x.sock.KickRX()
		}
	}
	return n
}

// receiveRing takes up to len(hs) frames off one RX ring: how many
// entries it took, and how many of them were valid frames (in hs).
func (x *XDP) receiveRing(rx *xdp.DescRing, hs []Handle) (got uint32, n int) {
	idx, got := rx.Peek(uint32(len(hs)))
	for i := range got {
		d := rx.Get(idx + i)
		h, ok := x.pool.fromKernel(d.Addr, d.Len)
		if !ok {
			x.stats.RxInvalid++
			continue
		}
		hs[n] = h
		n++
		x.stats.RxBytes += uint64(d.Len)
	}
	if got > 0 {
		rx.Release()
		x.inFill -= min(got, x.inFill)
		x.stats.RxFrames += uint64(n)
	}
	return got, n
}

// Transmit puts frames on the TX ring and kicks the kernel if it asks to be
// (in copy mode it always does: the send happens in that system call).
func (x *XDP) Transmit(hs []Handle) (int, error) { return x.transmit(hs, false) }

// TransmitKeep puts frames on the TX ring while the caller keeps them: they
// are busy until their completions come back.
func (x *XDP) TransmitKeep(hs []Handle) (int, error) { return x.transmit(hs, true) }

func (x *XDP) transmit(hs []Handle, keep bool) (int, error) {
	// Sent frames are taken back in batches (Receive takes them whenever
	// it finds nothing to receive); here only when they pile up.
	if x.sock.Completion.Pending() >= reapBatch {
		x.reap()
	}
	tx := &x.sock.TX
	idx, got := tx.Reserve(uint32(len(hs)))
	var n uint32
	var err error
	maxLen := x.info.MTU + 14
	for i := range got {
		h := hs[i]
		f, ok := x.pool.Frame(h)
		var ferr error
		switch {
		case !ok:
			ferr = ErrStale
		case f.Len() > maxLen:
			ferr = fmt.Errorf("vnic: %d-byte frame exceeds mtu %d: %w", f.Len(), x.info.MTU, ErrTooLong)
		case f.Busy():
			ferr = ErrBusy
		}
		if ferr != nil {
			// Refused alone: the frames after it still go.
			x.stats.TxErrors++
			if err == nil {
				err = ferr
			}
			continue
		}
		takeFront(hs, n, i)
		addr, l := f.toKernel(keep)
		tx.Set(idx+n, xdp.Desc{Addr: addr, Len: l})
		x.stats.TxBytes += uint64(l)
		n++
	}
	tx.Cancel(got - n)
	if n > 0 {
		tx.Submit()
		x.stats.TxFrames += uint64(n)
		if tx.NeedsWakeup() {
			if x.holding(n) {
				x.kickOwed.Store(true)
			} else if kerr := x.doorbell(); kerr != nil && err == nil {
				err = kerr
			}
		}
	}
	return int(n), err
}

// takeFront moves hs[i] to hs[n] (n <= i), shifting the refused frames
// between them up by one: the frames taken stay in their order at the
// front.
func takeFront(hs []Handle, n, i uint32) {
	if n == i {
		return
	}
	h := hs[i]
	copy(hs[n+1:i+1], hs[n:i])
	hs[n] = h
}

// Stats returns the NIC's counters with the kernel's drops folded in.
func (x *XDP) Stats() Stats {
	s := x.stats
	fold := func(sk *xdp.Socket) {
		if ks, err := sk.Stats(); err == nil {
			s.RxDropped += ks.RxDropped + ks.RxRingFull
			s.RxInvalid += ks.RxInvalidDescs
			s.TxErrors += ks.TxInvalidDescs
		}
	}
	fold(x.sock)
	for _, l := range x.laneList() {
		fold(l)
	}
	return s
}

// LaneStats is the kernel's counters of each lane's socket (AddLane,
// the receive lane first), in lane order: a lane's dropped frames are
// counted there, not in the socket's. An entry is zero where the
// kernel did not answer. For dumps: it allocates.
func (x *XDP) LaneStats() []xdp.Stats {
	lanes := x.laneList()
	st := make([]xdp.Stats, len(lanes))
	for i, l := range lanes {
		st[i], _ = l.Stats()
	}
	return st
}

// Close closes the socket and unmaps the UMEM; every handle dies.
func (x *XDP) Close() error {
	if x.sock == nil {
		return nil
	}
	var errs []error
	for _, l := range x.laneList() {
		errs = append(errs, l.Close())
	}
	x.lanes.Store(nil)
	x.rx = nil
	err := errors.Join(append(errs, x.sock.Close(), x.umem.Close())...)
	x.sock, x.umem = nil, nil
	return err
}
