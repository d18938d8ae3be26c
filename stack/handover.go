package stack

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/internal/repair"
	"github.com/xdp-onload/onload/vnic"
)

// Live handover to the kernel (docs/ARCHITECTURE.md, "Handover"): an
// established connection leaves the stack for a kernel socket that
// TCP_REPAIR re-creates with the same state (internal/repair). The
// stack's part is to give the state and to step aside without a word to
// the peer:
//
//  1. BeginHandover pins the flow's frames to the stack (FlowPinner), so
//     that none reaches the kernel socket before it is whole; reads the
//     connection (sequence numbers, options, windows, the queues' bytes);
//     and leaves in its place a HANDED-OVER socket, which drops what
//     arrives (counted: the peer sends it again) and answers nothing.
//  2. The caller re-creates the connection in the kernel. Meanwhile the
//     HANDED-OVER socket holds the peer's data segments within the
//     window (up to handoverHold frames), and HandoverCatchUp gives the
//     bytes that follow on from the state BeginHandover gave, for the
//     kernel socket's receive queue before it leaves repair mode: a
//     stream that keeps coming loses nothing to the handover but the
//     peer's acknowledgments, which it sends again.
//  3. EndHandover unpins the flow. Its frames go to the kernel socket:
//     the steering program passes a listener port's segments of a
//     connection the kernel has. The HANDED-OVER socket stays
//     handoverGrace longer, for frames already on their way (a reset
//     from the stack would end the kernel's connection), then frees its
//     slot and its port.
//
// AbortHandover, when the kernel socket could not be made, resets the
// peer: the connection is lost, and the peer knows it.

// The waits for the stack lock of onloadd's handle, which only ever
// trylocks (handoverLock): before a handover begins (nothing has changed
// yet: the caller is told the stack is busy), and at its later steps.
const (
	handoverFirstWait = time.Second
	handoverStepWait  = 10 * time.Second
)

// ErrStackBusy: onloadd could not take the stack's lock in time (one of
// its processes is stopped, or dead, holding it).
var ErrStackBusy = &Errno{"the stack's lock stayed held: one of its processes is stopped inside the stack", syscall.EBUSY}

// handoverLock takes the stack lock for a step of a handover: as every
// call does in a process of the stack; on onloadd's handle (a watcher),
// which only ever trylocks, by trylock for at most wait.
func (s *Stack) handoverLock(wait time.Duration) (unlock func(), err error) {
	if !s.watcher {
		s.lock()
		return s.unlock, nil
	}
	s.mu.Lock()
	if !s.tryLockWithin(wait) {
		s.mu.Unlock()
		return nil, ErrStackBusy
	}
	s.lockedLocked()
	s.setClock(s.fast.now())
	return func() {
		s.unlockTried()
		s.mu.Unlock()
	}, nil
}

// handoverGrace is how long a HANDED-OVER socket keeps its 4-tuple after
// EndHandover, dropping the frames that were already steered to the
// stack.
const handoverGrace = 2 * time.Second

// FlowPinner is a Filters that can steer one connection's frames to the
// stack whatever else would catch them (the steering program's flow
// entries come before its listener entries and its look-up of the
// kernel's sockets).
type FlowPinner interface {
	PinFlow(p Proto, local, remote netip.AddrPort) error
	UnpinFlow(p Proto, local, remote netip.AddrPort) error
}

// KernelFlowsChecker is a Filters that can stop the steering program's
// look-up of the kernel's sockets for a listening port's segments once
// the kernel is found to have no connection there: Listen asks it. A
// dialled connection's port keeps the look-up: a check at every connect
// would read the kernel's whole socket table each time.
type KernelFlowsChecker interface {
	CheckKernelFlows(p Proto, local netip.AddrPort)
}

// ErrHandoverState is returned for a connection that is not in a state
// the kernel can take: ESTABLISHED, or CLOSE-WAIT (the peer's FIN came),
// or, with a FIN of ours queued or sent and not acknowledged, FIN-WAIT-1,
// CLOSING or LAST-ACK.
var ErrHandoverState = fmt.Errorf("%w: only a connection in ESTABLISHED or CLOSE-WAIT, or closed by its user with its FIN not yet acknowledged, can be handed over", ErrInvalid)

// handoverState says whether sk is in a state the kernel can take.
func handoverState(sk *sock) bool {
	if sk.kind != kindTCP {
		return false
	}
	switch sk.state {
	case tcpEstablished, tcpCloseWait:
		return true
	case tcpFinWait1, tcpClosing, tcpLastAck:
		return sk.tflags&(tfFinQueued|tfFinSent) != 0
	}
	return false
}

var errCorruptQueue = errors.New("a queue of the socket is corrupt in the stack image: not handed over")

// BeginHandover takes connection id out of the stack and returns its
// state for repair.Restore. The socket's ID stays valid for
// EndHandover or AbortHandover and nothing else.
func (s *Stack) BeginHandover(id SockID) (*repair.Conn, error) {
	return s.beginHandover(id, false, netip.AddrPort{})
}

// ErrHandoverMoved refuses a handover whose connection's local address
// changed in the image after the handover read it (and checked it, and
// bound the kernel socket to it): only a process writing its image could
// do that. The connection is still the stack's.
var ErrHandoverMoved = errors.New("the connection's local address changed in the stack image during its handover")

// beginHandover is BeginHandover, of a connection its user has closed
// too if orphan (one still delivering its data and FIN). If want is
// valid, the connection's local address must still be it: the address
// the handover checked and bound the kernel socket to is the one whose
// flow it pins.
func (s *Stack) beginHandover(id SockID, orphan bool, want netip.AddrPort) (*repair.Conn, error) {
	unlock, err := s.handoverLock(handoverFirstWait)
	if err != nil {
		return nil, err
	}
	defer unlock()
	sk, err := s.handoverSockLocked(id, orphan)
	if err != nil {
		return nil, err
	}
	if !handoverState(sk) {
		return nil, ErrHandoverState
	}
	local, remote := addrPort(sk.localAddr, sk.localPort), addrPort(sk.remoteAddr, sk.remotePort)
	if want.IsValid() && local != want {
		return nil, fmt.Errorf("%w (%v, was %v)", ErrHandoverMoved, local, want)
	}
	if pin, ok := s.filters.(FlowPinner); ok {
		if err := pin.PinFlow(TCP, local, remote); err != nil {
			return nil, fmt.Errorf("pin the flow for the handover: %w", err)
		}
	}
	c := &repair.Conn{
		Local: local, Remote: remote,
		SndUna: uint32(sk.sndUna), RcvNxt: uint32(sk.rcvNxt),
		MSS: sk.peerMSS, WS: sk.tflags&tfWSOK != 0, SndWS: sk.sndWS, RcvWS: sk.rcvWS,
		SACK: sk.tflags&tfSackOK != 0, TS: sk.tflags&tfTSOK != 0, TSVal: s.tsNow(),
		SndWnd: sk.sndWnd, SndWl1: uint32(sk.sndWl1), RcvWnd: uint32(sk.rcvAdv - sk.rcvNxt),
		FinReceived: sk.tflags&tfRcvFin != 0, PeerTSVal: sk.tsRecent,
		FinQueued: sk.tflags&(tfFinQueued|tfFinSent) != 0,
	}
	if c.MSS == 0 {
		c.MSS = sk.mss
	}
	if sk.rcvAdv.LessThan(sk.rcvNxt) {
		c.RcvWnd = 0
	}
	if err := s.handoverQueuesLocked(sk, c); err != nil {
		s.unpinLocked(sk)
		return nil, err
	}
	// The socket steps aside: no timers, no frames, no user; its tuple
	// and its port stay until EndHandover's grace ends.
	s.cancelTimersLocked(sk)
	s.freeQueuesLocked(sk, false)
	sk.state = tcpHandedOver
	sk.tflags |= tfOrphan | tfHolding
	sk.tflags &^= tfAckNow | tfDelAck
	sk.flags &^= sfAckHeld
	s.img.hdr.counters.TCPHandovers++
	s.retirePortLocked(sk)
	s.touchLocked(sk)
	return c, nil
}

// handoverQueuesLocked copies the socket's queued bytes into c: what
// the application has not read, what was sent and not acknowledged
// (from sndUna: the first frame may be partly acknowledged) and what was
// never sent. Out-of-order data is left out: the peer sends it again.
func (s *Stack) handoverQueuesLocked(sk *sock, c *repair.Conn) error {
	p := s.pool
	limit := s.walkLimit()
	// The counts are the image's, which a client writes: onloadd sizes
	// nothing from them beyond what the pool's frames can hold.
	most := uint32(limit * p.FrameSize())
	c.Unread = make([]byte, 0, min(sk.rcvBytes, most))
	steps := 0
	for h := sk.rcvHead; h != vnic.Null; h = p.Next(h) {
		f, ok := p.Frame(h)
		if !ok || steps >= limit {
			s.img.hdr.counters.ImageCorrupt++
			return errCorruptQueue
		}
		steps++
		c.Unread = append(c.Unread, f.Data()...)
	}
	c.Sent = make([]byte, 0, min(uint32(sk.sndMax-sk.sndUna), most))
	c.Unsent = make([]byte, 0, min(sk.sndBytes, most))
	unsent := false
	for h := sk.sndHead; h != vnic.Null; h = p.Next(h) {
		f, ok := p.Frame(h)
		if !ok || steps >= limit {
			s.img.hdr.counters.ImageCorrupt++
			return errCorruptQueue
		}
		steps++
		unsent = unsent || h == sk.sndUnsent
		l := int(f.Aux(auxLen))
		d := f.Buf()
		if txPayload+l > len(d) {
			s.img.hdr.counters.ImageCorrupt++
			return errCorruptQueue
		}
		d = d[txPayload : txPayload+l]
		if skip := int(int32(uint32(sk.sndUna) - f.Aux(auxSeq))); !unsent && skip > 0 {
			if skip >= l {
				continue
			}
			d = d[skip:]
		}
		if unsent {
			c.Unsent = append(c.Unsent, d...)
		} else {
			c.Sent = append(c.Sent, d...)
		}
	}
	return nil
}

// handoverHold bounds the frames a HANDED-OVER socket holds for
// HandoverCatchUp, and after it for EndHandover.
const handoverHold = 512

// handoverHoldLocked keeps a data segment that arrived for a connection
// being handed over, within the window it was last given, for
// HandoverCatchUp, or, after it (tfLate), whole, for EndHandover to give
// the kernel's socket; what it cannot keep is dropped (counted), and the
// peer sends it again. The frame ends up held or freed. payloadOff is
// where the payload starts in the frame, ipEnd where the IP packet ends.
func (s *Stack) handoverHoldLocked(sk *sock, h vnic.Handle, g *segment, payloadOff, ipEnd int) {
	p := s.pool
	seq, n := g.seq, g.n
	end := seq.Add(seqnum.Size(n))
	if n > 0 || g.flags&flagFIN != 0 {
		switch {
		case sk.tflags&tfLate != 0:
			s.handoverLateLocked(sk, h, ipEnd)
			return
		case sk.tflags&tfHolding == 0:
			s.handoverAfterLocked(sk, h, ipEnd)
			return
		}
	}
	if n == 0 {
		p.Free(h) // an acknowledgment: the peer's next one says as much
		return
	}
	if sk.tflags&tfHolding == 0 || !sk.rcvNxt.LessThan(end) || !seq.LessThan(sk.rcvAdv) ||
		sk.oooFrames >= handoverHold || s.lowFramesLocked() {
		s.img.hdr.counters.TCPHandoverDrops++
		p.Free(h)
		return
	}
	off := payloadOff
	if seq.LessThan(sk.rcvNxt) {
		cut := int(seq.Size(sk.rcvNxt))
		off, n, seq = off+cut, n-cut, sk.rcvNxt
	}
	if end := seq.Add(seqnum.Size(n)); sk.rcvAdv.LessThan(end) {
		n -= int(sk.rcvAdv.Size(end)) // past the window: the peer sends it again
	}
	p.Trim(h, off, n)
	if !s.oooInsertLocked(sk, h, seq, n, false) {
		p.Free(h)
	}
}

// HandoverCatchUp ends the holding of a connection being handed over
// and returns the bytes held that follow on, without a gap, from the
// rcvNxt BeginHandover gave; the rest is dropped.
func (s *Stack) HandoverCatchUp(id SockID) ([]byte, error) {
	sk, unlock, err := s.lockHandedOver(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Frames that came since the last poll are held too: a segment
	// that waits in the receive ring past here is dropped, and the peer
	// sends it again only after its retransmission timeout (200 ms on
	// Linux, for the request a client sends right after connecting).
	s.pollLocked()
	p := s.pool
	var out []byte
	next := sk.rcvNxt
	steps := 0
	for h := sk.oooHead; h != vnic.Null && steps <= handoverHold; h = p.Next(h) {
		steps++
		seq, d := seqnum.Value(p.Aux(h, auxOOOSeq)), p.Data(h)
		if next.LessThan(seq) {
			break
		}
		if end := seq.Add(seqnum.Size(len(d))); next.LessThan(end) {
			out = append(out, d[seq.Size(next):]...)
			next = end
		}
	}
	s.pruneOOOLocked(sk)
	// What comes from here until EndHandover steers the flow to the
	// kernel is kept whole, for EndHandover to give the kernel's socket
	// (repair mode, which took the bytes above, ends before then).
	sk.tflags = sk.tflags&^tfHolding | tfLate
	return out, nil
}

// handoverLateLocked keeps a segment that arrived after HandoverCatchUp
// whole (its IP packet: the frame's data from the IP header to ipEnd),
// on the socket's out-of-order list, which the catch-up emptied, the
// latest first; EndHandover gives the kernel's socket these.
func (s *Stack) handoverLateLocked(sk *sock, h vnic.Handle, ipEnd int) {
	p := s.pool
	if sk.oooFrames >= handoverHold || s.lowFramesLocked() || ipEnd <= ethLen {
		s.img.hdr.counters.TCPHandoverDrops++
		p.Free(h)
		return
	}
	p.Trim(h, ethLen, ipEnd-ethLen)
	p.SetNext(h, sk.oooHead) // the latest first
	sk.oooHead = h
	sk.oooFrames++
	sk.oooBytes += uint32(ipEnd - ethLen)
}

// handoverAfterLocked gives the kernel's socket a segment that came
// after EndHandover, within its grace: one steered here before the
// unpin took effect, and in the receive ring only after EndHandover's
// poll (by hand, 82µs after it, once in some 150 handovers). A system
// call under the lock, as the kernel takes the segment in; such
// segments are few, and dropped one would wait for the peer's
// retransmission timeout. It goes on the raw socket EndHandover made in
// the stack's network namespace (a socket made here would be in the
// polling thread's), after those kept before it. A handle that made
// none (a process of onloadd's stack: it may not repair, nor send raw)
// keeps it whole for one that did (GiveLate, from onloadd's watcher).
func (s *Stack) handoverAfterLocked(sk *sock, h vnic.Handle, ipEnd int) {
	if s.peerFD < 0 {
		if sk.flags&sfLateKept == 0 && sk.oooFrames < handoverHold {
			sk.flags |= sfLateKept
			atomic.AddUint32(&s.img.hdr.lateKept, 1)
		}
		s.handoverLateLocked(sk, h, ipEnd)
		return
	}
	var pkts [][]byte
	if sk.flags&sfLateKept != 0 {
		pkts = s.lateKeptTakeLocked(sk)
	}
	if d := s.pool.Data(h); ipEnd > ethLen && ipEnd <= len(d) {
		pkts = append(pkts, d[ethLen:ipEnd])
	}
	s.lateSendLocked(s.idOf(sk), pkts)
	s.pool.Free(h)
}

// lateSendLocked gives the kernel the segments pkts of connection id,
// as the peer's, on the handle's raw socket, and counts them.
func (s *Stack) lateSendLocked(id SockID, pkts [][]byte) {
	s.lateCountLocked(s.lateSend(s.peerFD, id, pkts), len(pkts))
}

// lateCountLocked counts late segments: sent of them given to the kernel,
// the rest dropped.
func (s *Stack) lateCountLocked(sent, of int) {
	s.img.hdr.counters.TCPHandoverLate += uint64(sent)
	s.img.hdr.counters.TCPHandoverDrops += uint64(of - sent)
}

// peerSocketLocked makes the handle's raw socket for late segments, in
// the calling thread's network namespace, unless it has one, and returns
// it (-1 if it cannot: a process that may not).
func (s *Stack) peerSocketLocked() int {
	if s.peerFD < 0 {
		if fd, err := repair.PeerSocket(); err == nil {
			s.peerFD = fd
		}
	}
	return s.peerFD
}

// lateSend sends on raw socket fd, of pkts, those of connection id as
// this handle handed it over (handedTuples), and returns how many the
// kernel took.
func (s *Stack) lateSend(fd int, id SockID, pkts [][]byte) int {
	s.tuplesMu.Lock()
	tu, ok := s.handedTuples[id]
	s.tuplesMu.Unlock()
	if !ok || fd < 0 {
		return 0
	}
	ours := pkts[:0:0]
	for _, p := range pkts {
		if repair.PeerPacket(p, tu.local, tu.remote) {
			ours = append(ours, p)
		}
	}
	return repair.SendPeerPackets(fd, ours)
}

// handedTuple is a connection a handle handed over, and when its grace
// ends (Clock).
type handedTuple struct {
	local, remote netip.AddrPort
	until         int64
}

// rememberHanded records connection id's four-tuple as a handover of
// this handle found it (lateSend), and forgets those whose grace ended.
func (s *Stack) rememberHanded(id SockID, local, remote netip.AddrPort) {
	s.tuplesMu.Lock()
	defer s.tuplesMu.Unlock()
	now := s.Clock()
	for k, tu := range s.handedTuples {
		if tu.until < now {
			delete(s.handedTuples, k)
		}
	}
	if s.handedTuples == nil {
		s.handedTuples = make(map[SockID]handedTuple)
	}
	s.handedTuples[id] = handedTuple{local, remote, now + int64(handoverGrace) + int64(handoverStepWait)}
}

// lateKeptTakeLocked takes what a HANDED-OVER socket kept for GiveLate.
func (s *Stack) lateKeptTakeLocked(sk *sock) [][]byte {
	pkts := s.handoverLateTakeLocked(sk)
	sk.flags &^= sfLateKept
	atomic.AddUint32(&s.img.hdr.lateKept, ^uint32(0))
	return pkts
}

// LateWaiting reports, without the lock, that segments of connections
// handed over wait for a handle that can give them to the kernel
// (GiveLate): onloadd's watcher looks at every turn.
func (s *Stack) LateWaiting() bool { return atomic.LoadUint32(&s.img.hdr.lateKept) != 0 }

// InHandoverGrace reports, without the lock, that a handover ended less
// than handoverGrace ago: a process may yet poll a segment steered here
// before it and keep it for GiveLate, and onloadd's watcher of an idle
// stack looks every 50 ms meanwhile, not only at the next frame or timer
// (the process may take the frame that would have woken it).
func (s *Stack) InHandoverGrace() bool {
	at := atomic.LoadInt64(&s.img.hdr.handedOverAt)
	return at != 0 && s.Clock()-at < int64(handoverGrace)
}

// GiveLate gives the kernel's sockets the segments that HANDED-OVER
// sockets kept (handoverAfterLocked), on a raw socket of this handle's,
// made in the calling thread's network namespace, which must be the
// stack's (onloadd's watcher). It takes the lock by trylock: a holder
// leaves them for the next call.
func (s *Stack) GiveLate() {
	if !s.LateWaiting() || !s.img.hdr.lock.TryLock() {
		return
	}
	s.lockedLocked()
	if s.peerSocketLocked() >= 0 {
		for i := uint32(0); i < s.img.hdr.sockHigh && i < uint32(len(s.img.socks)) && s.LateWaiting(); i++ {
			if sk := &s.img.socks[i]; sk.kind == kindTCP && sk.state == tcpHandedOver && sk.flags&sfLateKept != 0 {
				s.lateSendLocked(s.idOf(sk), s.lateKeptTakeLocked(sk))
			}
		}
	}
	s.unlockTried()
}

// lateForgetLocked drops what a HANDED-OVER socket, freed at the end of
// its grace, kept that no handle gave (counted).
func (s *Stack) lateForgetLocked(sk *sock) {
	if sk.flags&sfLateKept != 0 {
		s.img.hdr.counters.TCPHandoverDrops += uint64(len(s.lateKeptTakeLocked(sk)))
	}
}

// handoverLateTakeLocked takes the segments handoverLateLocked kept,
// as IP packets, and frees their frames; a socket no longer keeps any.
func (s *Stack) handoverLateTakeLocked(sk *sock) [][]byte {
	p := s.pool
	var out [][]byte
	steps := uint32(0)
	for h := sk.oooHead; h != vnic.Null && steps < handoverHold; h = p.Next(h) {
		steps++
		out = append(out, bytes.Clone(p.Data(h)))
	}
	slices.Reverse(out) // in the order they came
	s.pruneOOOLocked(sk)
	sk.tflags &^= tfLate
	return out
}

// lockHandedOver takes the lock for a later step of a handover and
// resolves the socket BeginHandover took; unlock when err is nil.
func (s *Stack) lockHandedOver(id SockID) (sk *sock, unlock func(), err error) {
	if unlock, err = s.handoverLock(handoverStepWait); err != nil {
		return nil, nil, err
	}
	if sk = s.handedOverLocked(id); sk == nil {
		unlock()
		return nil, nil, ErrBadSocket
	}
	return sk, unlock, nil
}

// HandedOver reports whether id names a socket BeginHandover took: its
// handover is under way, or ended less than handoverGrace ago. Lock-free
// (each word read atomically), for a holder of the connection's kernel
// socket that found the engine's socket gone and waits for the kernel's
// connection to be made on it.
func (s *Stack) HandedOver(id SockID) bool {
	idx := id.index()
	if idx >= uint32(len(s.img.socks)) {
		return false
	}
	sk := &s.img.socks[idx]
	return atomic.LoadUint32(&sk.gen) == id.gen() && sk.racyKind() == kindTCP && sk.racyState() == tcpHandedOver
}

// handoverSockLocked resolves id as sockLocked does, and also a
// connection its user has closed if orphan.
func (s *Stack) handoverSockLocked(id SockID, orphan bool) (*sock, error) {
	if orphan {
		return s.anySockLocked(id)
	}
	return s.sockLocked(id)
}

// handedOverLocked resolves the ID of a socket BeginHandover took.
func (s *Stack) handedOverLocked(id SockID) *sock {
	idx := id.index()
	if idx >= uint32(len(s.img.socks)) {
		return nil
	}
	sk := &s.img.socks[idx]
	if sk.kind != kindTCP || sk.gen != id.gen() || id.gen() == 0 || sk.state != tcpHandedOver {
		return nil
	}
	return sk
}

// EndHandover unpins the flow of a connection the kernel now has, and
// frees its socket after handoverGrace.
func (s *Stack) EndHandover(id SockID) error {
	sk, unlock, err := s.lockHandedOver(id)
	if err != nil {
		return err
	}
	if err := s.unpinLocked(sk); err != nil {
		unlock()
		return fmt.Errorf("unpin the handed-over flow: %w", err)
	}
	s.img.wheel.Set(s.sockTimer(sk, timerTW), s.nowTick()+s.ticks(handoverGrace))
	atomic.StoreInt64(&s.img.hdr.handedOverAt, s.Clock())
	// The segments that came after the catch-up, and those steered here
	// before the unpin took effect (in the receive ring now), go to the
	// kernel's socket as the peer's, each as it came (its timestamp
	// too): dropped, the peer would send them again only after its
	// retransmission timeout (200 ms on Linux).
	s.pollLocked()
	late := s.handoverLateTakeLocked(sk)
	// The caller's thread is in the stack's network namespace (it made
	// the kernel socket there).
	fd := s.peerSocketLocked()
	unlock()
	if len(late) > 0 {
		n := s.lateSend(fd, id, late)
		if unlock, err := s.handoverLock(handoverStepWait); err == nil {
			s.lateCountLocked(n, len(late))
			unlock()
		}
	}
	return nil
}

// AbortHandover resets the peer of a connection whose kernel socket
// could not be made, and frees the socket.
func (s *Stack) AbortHandover(id SockID) error {
	sk, unlock, err := s.lockHandedOver(id)
	if err != nil {
		return err
	}
	defer unlock()
	s.unpinLocked(sk)
	s.controlLocked(sk, flagRST, sk.sndNxt)
	s.tcpCloseFinalLocked(sk)
	s.flushLocked()
	return nil
}

func (s *Stack) unpinLocked(sk *sock) error {
	return s.unpin(addrPort(sk.localAddr, sk.localPort), addrPort(sk.remoteAddr, sk.remotePort))
}

// unpin removes PinFlow's entry for a connection (a map update: the
// stack lock is not needed for it).
func (s *Stack) unpin(local, remote netip.AddrPort) error {
	pin, ok := s.filters.(FlowPinner)
	if !ok {
		return nil
	}
	return pin.UnpinFlow(TCP, local, remote)
}

// HandoverStats says what a handover moved and how long the connection
// was out of everyone's hands (from BeginHandover to EndHandover).
type HandoverStats struct {
	Local, Remote        netip.AddrPort
	Unread, Sent, Unsent int
	CaughtUp             int
	Took                 time.Duration
}

// ErrHandoverLost marks a handover that failed after the connection left
// the stack: the peer was reset (AbortHandover), or the bytes not yet
// sent could not be written.
var ErrHandoverLost = errors.New("the connection was reset")

// Handover hands connection id over to the kernel on fd, a TCP socket
// that is not connected (bound to the connection's port, or not bound):
// the steps above, with repair.Prepare first, so that a process without
// CAP_NET_ADMIN or a connection in another state fails with nothing
// changed. An error that wraps ErrHandoverLost means the connection is
// gone; any other means it is still the stack's. fd's blocking mode is
// kept; the bytes not yet sent are written within writeTimeout.
func (s *Stack) Handover(id SockID, fd int, writeTimeout time.Duration) (HandoverStats, error) {
	return s.handover(id, fd, writeTimeout, false, nil)
}

// HandoverChecked is Handover for a caller that does not trust the
// image (onloadd, which repairs with its own privilege): check is given
// the connection's local address as the handover read it, before
// anything changes, and an error from it refuses the handover (returned
// wrapped). The address checked is the one the kernel socket is bound
// to and the flow pinned for: if the image changes it after the check,
// the handover is refused (ErrHandoverMoved). check runs without the
// stack's lock.
func (s *Stack) HandoverChecked(id SockID, fd int, writeTimeout time.Duration, check func(local netip.AddrPort) error) (HandoverStats, error) {
	return s.handover(id, fd, writeTimeout, false, check)
}

// HandoverOrphan is Handover of a connection its user has closed, still
// delivering its data or FIN (UndeliveredSockets), on a kernel socket
// made for it: a process that exits hands such connections to the
// kernel, which finishes them after it is gone.
func (s *Stack) HandoverOrphan(id SockID, fd int, writeTimeout time.Duration) (HandoverStats, error) {
	return s.handover(id, fd, writeTimeout, true, nil)
}

func (s *Stack) handover(id SockID, fd int, writeTimeout time.Duration, orphan bool, check func(netip.AddrPort) error) (st HandoverStats, err error) {
	land, st, err := s.handoverClaim(id, fd, writeTimeout+handoverClaimSlack)
	if land == nil {
		return st, err
	}
	defer func() { land(st, err) }()
	return s.handoverClaimed(id, fd, writeTimeout, orphan, check)
}

// handoverClaimSlack is how much longer than its write timeout a
// handover may take, for handoverClaim's wait: its steps wait for the
// stack's lock a few times (handoverStepWait) and make some dozens of
// system calls.
const handoverClaimSlack = 5 * time.Second

// handoverClaimed is handover, the connection's only one under way.
func (s *Stack) handoverClaimed(id SockID, fd int, writeTimeout time.Duration, orphan bool, check func(netip.AddrPort) error) (HandoverStats, error) {
	var st HandoverStats
	unlock, err := s.handoverLock(handoverFirstWait)
	if err != nil {
		return st, err
	}
	sk, err := s.handoverSockLocked(id, orphan)
	var local netip.AddrPort
	var reuse bool // the connection's SO_REUSEADDR (or the fd's), for its TIME-WAIT
	if err == nil {
		local = addrPort(sk.localAddr, sk.localPort)
		reuse = sk.tflags&tfReuseAddr != 0
	}
	unlock()
	if err != nil {
		return st, err
	}
	if check != nil {
		if err := check(local); err != nil {
			return st, fmt.Errorf("connection from %v: %w", local, err)
		}
	}
	fdReuse, err := repair.Prepare(fd, local)
	if err != nil {
		return st, err
	}
	start := time.Now()
	c, err := s.beginHandover(id, orphan, local)
	if err != nil {
		repair.Abandon(fd, fdReuse)
		return st, err
	}
	st.Local, st.Remote = c.Local, c.Remote
	st.Unread, st.Sent, st.Unsent = len(c.Unread), len(c.Sent), len(c.Unsent)
	s.rememberHanded(id, c.Local, c.Remote)
	lost := func(err error) (HandoverStats, error) {
		s.AbortHandover(id)
		return st, fmt.Errorf("%w: the kernel socket could not be made: %w", ErrHandoverLost, err)
	}
	if err := repair.Restore(fd, c); err != nil {
		return lost(err)
	}
	more, err := s.HandoverCatchUp(id)
	if err != nil {
		return lost(err)
	}
	st.CaughtUp = len(more)
	if err := repair.Receive(fd, more); err != nil {
		return lost(err)
	}
	if err := repair.Finish(fd, reuse || fdReuse); err != nil {
		return lost(err)
	}
	if c.FinReceived {
		// The peer's FIN, which repair mode cannot give.
		if err := repair.InjectFIN(c); err != nil {
			unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
			s.EndHandover(id)
			return st, fmt.Errorf("%w: the peer's FIN could not be given to the kernel socket: %w", ErrHandoverLost, err)
		}
	}
	// The kernel has the connection: its segments go there now.
	err = s.EndHandover(id)
	st.Took = time.Since(start)
	if errors.Is(err, ErrStackBusy) {
		// The flow must go to the kernel even so; the socket's slot
		// stays HANDED-OVER until the stack ends.
		err = s.unpin(c.Local, c.Remote)
	}
	if err != nil {
		// Its segments still come here, where they are dropped: the
		// connection stalls. Say so; it cannot be undone.
		return st, fmt.Errorf("%w: %w", ErrHandoverLost, err)
	}
	if err := repair.WriteAll(fd, c.Unsent, writeTimeout); err != nil {
		// Bytes the application wrote would be lost: the peer is told.
		unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
		return st, fmt.Errorf("%w: the kernel socket did not take the bytes not yet sent: %w", ErrHandoverLost, err)
	}
	if c.FinQueued {
		// Our FIN, after the data, where ours was.
		if err := unix.Shutdown(fd, unix.SHUT_WR); err != nil {
			unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1})
			return st, fmt.Errorf("%w: the kernel socket did not take our FIN: %w", ErrHandoverLost, os.NewSyscallError("shutdown", err))
		}
	}
	return st, nil
}

// SetKernelFD records that connection id is named by fd in process pid
// (as it sees itself), for HandoverCandidates.
func (s *Stack) SetKernelFD(id SockID, pid, fd int) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	if pid <= 0 || fd < 0 {
		return ErrInvalid
	}
	sk.kfdPID, sk.kfd1 = uint32(pid), uint32(fd)+1
	return nil
}

// Candidate is a connection that can be handed over by whoever can reach
// its kernel socket: fd FD of process PID (as that process sees itself;
// read from the image, so not to be trusted further than a syscall that
// checks it).
type Candidate struct {
	ID      SockID
	PID, FD int
	Local   netip.AddrPort
	Remote  netip.AddrPort
}

// HandoverCandidates lists the connections in a state the kernel can
// take whose kernel socket a process recorded (SetKernelFD).
// ErrStackBusy if onloadd's handle could not take the lock.
func (s *Stack) HandoverCandidates() ([]Candidate, error) {
	unlock, err := s.handoverLock(handoverFirstWait)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var out []Candidate
	for i := range s.img.socks {
		sk := &s.img.socks[i]
		if !handoverState(sk) || sk.kfd1 == 0 || sk.kfdPID == 0 || sk.tflags&tfOrphan != 0 {
			continue
		}
		out = append(out, Candidate{ID: s.idOf(sk), PID: int(sk.kfdPID), FD: int(sk.kfd1 - 1),
			Local: addrPort(sk.localAddr, sk.localPort), Remote: addrPort(sk.remoteAddr, sk.remotePort)})
	}
	return out, nil
}
