package stack

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/fdbase"
)

// Sleeping and waking (seed 001): a thread that finds its socket not
// ready asks to be woken (WaitFor) and sleeps; whoever next polls the
// stack and changes that socket's state calls Options.Wake for it, once.
// The request is a flag in the socket's slot, so a poll by any handle of
// this process sees it; the sleepers themselves are the caller's (the
// sockets package parks goroutines, not threads).

// WaitFor asks for a wake-up on socket id: if any event in want is ready
// now, it returns the socket's events and asks for nothing; otherwise it
// returns 0 and the next poll that changes the socket's state (a segment
// or datagram for it, one of its timers, a connection completing on a
// listener) calls Options.Wake(id). A closed or unknown socket reports
// Error|Hangup.
func (s *Stack) WaitFor(id SockID, want Events) Events {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return Error | Hangup
	}
	if ev := s.eventsLocked(sk); ev&(want|Error|Hangup) != 0 {
		return ev
	}
	s.waitLocked(sk)
	return 0
}

// waitLocked asks for a wake-up of this process's threads on sk.
func (s *Stack) waitLocked(sk *sock) {
	if self := procBit(s.proc()); self == 0 {
		sk.flags |= sfWake
	} else {
		sk.waiters |= self
	}
}

// proc is this process's procs slot plus one (JoinWakes); 0 where it has
// not joined. It is set under the lock; the readers without it
// (Elsewhere, ParkedDirect, WaitRemote) take it once.
func (s *Stack) proc() uint8 { return uint8(s.joined.Load()) }

// procBit is process slot proc's bit in a socket's openers and waiters
// (0 for a handle that shares no wakes).
func procBit(proc uint8) uint32 {
	if proc == 0 || proc > maxProcs {
		return 0
	}
	return 1 << (proc - 1)
}

// WaitForAll is WaitFor for many sockets under one taking of the lock:
// out[i] for ids[i] and want[i] (a NullSock, or want 0, is skipped). It
// returns how many are ready; those ask for nothing. A want of Edge is
// ready only if the socket's edge count (EventsOf) is no longer edges[i]:
// it changed since the caller looked.
func (s *Stack) WaitForAll(ids []SockID, want, out []Events, edges []uint32) int {
	s.lock()
	defer s.unlock()
	ready := 0
	for i, id := range ids {
		out[i] = 0
		if id == NullSock || want[i] == 0 {
			continue
		}
		sk, err := s.sockLocked(id)
		if err != nil {
			out[i] = Error | Hangup
			ready++
			continue
		}
		if want[i]&Edge != 0 {
			if edges != nil && sk.edges != edges[i] {
				out[i] = s.eventsLocked(sk)
				ready++
				continue
			}
		} else if ev := s.eventsLocked(sk); ev&(want[i]|Error|Hangup) != 0 {
			out[i] = ev
			ready++
			continue
		}
		s.waitLocked(sk)
	}
	return ready
}

// touchLocked notes that sk's state may have changed in this poll: a
// sleeper on it is woken. A sleeper of another process sharing the stack
// is woken through that process's word (wakeRemotes, once the lock is
// let go), and it wakes its own threads (TakeRemoteWakes).
func (s *Stack) touchLocked(sk *sock) {
	s.edgeLocked(sk)
	s.logReadyLocked(sk)
	if sk.flags&sfWake == 0 && sk.waiters == 0 {
		return
	}
	local := sk.flags&sfWake != 0
	sk.flags &^= sfWake
	if w := sk.waiters; w != 0 {
		sk.waiters = 0
		if self := procBit(s.proc()); w&self != 0 {
			local, w = true, w&^self
		}
		if w != 0 {
			// Every process waiting is woken (a listener its workers
			// share wakes them all, and the first to accept takes the
			// connection).
			sk.remoteWakes |= w
			s.remote.Or(w)
		}
	}
	if !local {
		return
	}
	s.woken++
	if s.wake != nil {
		s.wake(s.idOf(sk))
	}
}

// edgeLocked counts an edge of sk, a change that wakes an edge-triggered
// waiter (EventsOf's edges): as the kernel's socket wakes an EPOLLET
// waiter for new data, a new connection, a datagram, a state change or an
// error, and not for a timer that only sent (a delayed ACK, a probe) or
// an ACK (write space is the caller's to report, after a write found the
// socket full, as the kernel's is).
func (s *Stack) edgeLocked(sk *sock) {
	if sk.kind != kindTCP || sk.state == tcpListen {
		sk.edges++
		return
	}
	if r := uint32(sk.rcvNxt); r != sk.edgeRcv || sk.state != sk.edgeState || sk.err != 0 {
		sk.edgeRcv, sk.edgeState = r, sk.state
		sk.edges++
	}
}

// TryPoll is the poll of a thread about to sleep: it polls only if
// nobody holds the stack lock (a holder polls again before it lets go),
// and reports whether it did, how many frames it took in and how many
// sleepers it woke.
func (s *Stack) TryPoll() (polled bool, frames, woken int) {
	if !s.img.hdr.lock.LockOrDefer(DeferPoll) {
		return false, 0, 0
	}
	s.lockedLocked()
	s.woken = 0
	frames = s.pollLocked()
	woken = s.woken
	s.unlockTried()
	return true, frames, woken
}

// Contended reports, without the lock, that a thread holds the stack
// lock or waits for it: someone is in the stack and will poll it.
func (s *Stack) Contended() bool {
	return atomic.LoadUint32(&s.img.hdr.lock.word)&(lockHeld|lockWaiters) != 0
}

// Idle reports, without the lock, that a poll would find nothing to do:
// no frame waits, the NIC needs no care and no timer can be due.
func (s *Stack) Idle() bool { return s.idle() }

// NextTimeout is how long until the earliest timer is due (0 if one is
// due now); ok is false when no timer is armed, so a sleeper may sleep
// until a frame arrives.
func (s *Stack) NextTimeout() (d time.Duration, ok bool) {
	s.lock()
	defer s.unlock()
	t, ok, err := s.img.wheel.NextDeadline()
	if err != nil {
		s.img.hdr.counters.ImageCorrupt++
		return 0, true // poll now: the poll counts and repairs
	}
	if !ok {
		return 0, false
	}
	ns := int64(t)*s.tickNs - s.fast.now()
	if ns < 0 {
		ns = 0
	}
	return time.Duration(ns), true
}

// EarliestTimer is, without the lock, a hint of when the earliest timer
// is due, in nanoseconds on the Clock: math.MaxInt64 when no timer is
// armed, 0 when the stack does not know without looking (NextTimeout
// looks). A sleeper that planned to wake later than this should look.
func (s *Stack) EarliestTimer() int64 {
	t, known, armed := s.img.wheel.Earliest()
	switch {
	case !armed:
		return math.MaxInt64
	case !known:
		return 0
	}
	return int64(t) * s.tickNs
}

// Clock is the stack's clock, in nanoseconds (CLOCK_MONOTONIC).
func (s *Stack) Clock() int64 { return nanotime() }

// Lingering counts the sockets the stack must keep serving although no
// user holds them: closed connections still sending their data or their
// FIN (TIME-WAIT excepted: it only absorbs stray segments). A process may
// tear the stack down once this is 0 and it holds no socket itself.
func (s *Stack) Lingering() int { return s.orphans(true) }

// Undelivered counts the connections closed by their user whose data or
// FIN the peer has not acknowledged yet: Lingering less those in
// FIN-WAIT-2, whose FIN the peer has, and which wait only for the peer's
// own, and those handed over to the kernel. A process that exits with nothing to finish its stack after it
// waits for this to reach 0 (sockets.Stack.Exit).
func (s *Stack) Undelivered() int { return s.orphans(false) }

// orphans counts the connections closed by their user and not yet in
// TIME-WAIT or closed; those in FIN-WAIT-2, and those handed over to the
// kernel (the kernel's to finish, in their short grace here), only if
// all.
func (s *Stack) orphans(all bool) int {
	s.lock()
	defer s.unlock()
	n := 0
	for i := range s.img.socks {
		if orphan(&s.img.socks[i], all) {
			n++
		}
	}
	return n
}

func orphan(sk *sock, all bool) bool {
	return sk.kind == kindTCP && sk.tflags&tfOrphan != 0 && sk.state != tcpTimeWait && sk.state != tcpClosed &&
		(all || sk.state != tcpFinWait2 && sk.state != tcpHandedOver && sk.state != tcpListen)
}

// UndeliveredSockets names the connections Undelivered counts: a
// process about to exit hands them over to the kernel, which goes on
// delivering after it is gone (sockets.Stack.Exit).
func (s *Stack) UndeliveredSockets() []SockID {
	s.lock()
	defer s.unlock()
	var ids []SockID
	for i := range s.img.socks {
		if sk := &s.img.socks[i]; orphan(sk, false) {
			ids = append(ids, s.idOf(sk))
		}
	}
	return ids
}

// TCPStates counts the stack's TCP sockets by state (RFC 9293's names:
// "ESTABLISHED", "TIME-WAIT"), those no user holds any longer included: a
// closed connection lingers in its closing states, and a test that closed
// one checks here that it went all the way.
func (s *Stack) TCPStates() map[string]int {
	s.lock()
	defer s.unlock()
	m := map[string]int{}
	for i := range s.img.socks {
		if sk := &s.img.socks[i]; sk.kind == kindTCP {
			m[stateName(sk.state)]++
		}
	}
	return m
}

// Capacity is the size of the socket table: every SockID's Slot is below
// it.
func (s *Stack) Capacity() int { return len(s.img.socks) }

// Wake-ups across processes. Processes that share a stack (onloadd's
// named stacks) each park their own threads; a poll by one process may
// change a socket another process's thread sleeps on. Each process that
// joins (JoinWakes) has a slot in the image: a futex word the others bump
// and wake, after they let the lock go, for every poll that touched one
// of its sockets; the process waits on its word (WaitRemote) and then
// wakes its threads whose sockets were touched (TakeRemoteWakes).

// JoinWakes gives this process a slot among the stack's sharers (a slot
// of a process that is gone is taken over). Until it leaves, its threads'
// sockets are woken by the other sharers' polls through the slot.
func (s *Stack) JoinWakes() error {
	s.lock()
	defer s.unlock()
	if s.proc() != 0 {
		return nil
	}
	pid := uint32(os.Getpid())
	for i := range s.img.hdr.procs {
		p := &s.img.hdr.procs[i]
		if old := atomic.LoadUint32(&p.pid); old == 0 || old == pid || !alive(int(old)) {
			atomic.StoreUint32(&p.key, 0)
			atomic.StoreUint32(&p.direct, 0)
			atomic.StoreUint32(&p.pid, pid)
			s.joined.Store(uint32(i + 1))
			return nil
		}
	}
	return fmt.Errorf("stack shared by %d processes already: the most that wake one another", maxProcs)
}

// LeaveWakes gives the slot back.
func (s *Stack) LeaveWakes() {
	s.lock()
	defer s.unlock()
	if p := s.proc(); p != 0 {
		atomic.StoreUint32(&s.img.hdr.procs[p-1].key, 0)
		atomic.StoreUint32(&s.img.hdr.procs[p-1].direct, 0)
		atomic.StoreUint32(&s.img.hdr.procs[p-1].pid, 0)
		s.joined.Store(0)
	}
	s.closeOwnWakeSocket()
}

// ParkedDirect adds d to the count of this process's threads blocked
// in the kernel on the stack's interrupt themselves, to poll when it
// fires (interrupts.Sleeper.ParkDirect): while it is not 0, a frame that
// arrives wakes one of them, and the other processes sharing the stack
// need not wait on the interrupt too (Elsewhere). A handle that has not
// joined the stack's wakes (JoinWakes) counts nothing.
func (s *Stack) ParkedDirect(d int32) {
	if p := s.proc(); p != 0 {
		atomic.AddUint32(&s.img.hdr.procs[p-1].direct, uint32(d))
	}
}

// Elsewhere says, without the lock, how another process sharing the
// stack attends its frames: parked, a thread of one blocks on the
// interrupt itself (ParkedDirect); polledAt, when one last polled (the
// image's AppPolledAt, if this process's handle was not the last to
// poll; 0 otherwise). The words are the other processes' to write and
// only advise: a process that died parked keeps its count until onloadd
// gives its slot back (CloseAbandonedBy), and the frames then wait for
// onloadd's watcher or for that.
func (s *Stack) Elsewhere() (parked bool, polledAt int64) {
	self := s.proc()
	if self == 0 {
		return false, 0
	}
	for i := range s.img.hdr.procs {
		p := &s.img.hdr.procs[i]
		if i != int(self)-1 && atomic.LoadUint32(&p.direct) != 0 && atomic.LoadUint32(&p.pid) != 0 {
			parked = true
			break
		}
	}
	if at := s.AppPolledAt(); at != s.polledAt.Load() {
		polledAt = at
	}
	return parked, polledAt
}

// closeOwnWakeSocket closes the handle's wake socket. The one it sends
// from stays until Destroy: a handle that left the wakes still polls, and
// its threads may be sending from it.
func (s *Stack) closeOwnWakeSocket() {
	if s.wakes.own >= 0 {
		fdbase.Close(s.wakes.own)
		s.wakes.own = -1
	}
}

// closeWakeSockets closes the handle's wake sockets.
func (s *Stack) closeWakeSockets() {
	s.closeOwnWakeSocket()
	if fd := s.wakes.send.Swap(-1); fd >= 0 {
		fdbase.Close(int(fd))
	}
}

// dgramSocket is a non-blocking unix datagram socket, for wake-ups, out
// of the program's numbers (fdbase): the one a handle sends from is made
// at its first wake-up, long after the stack.
func dgramSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	return fdbase.Move(fd), nil
}

// wakeSockets are a handle's wake sockets: its own (WakeSocket), and the
// one it sends from, made at its first wake-up.
type wakeSockets struct {
	own  int          // -1: none (newStack)
	send atomic.Int64 // -1: none yet
}

// wakeAddr writes into sa the abstract unix address of the wake socket
// of process pid with key ("\x00onload-wake-PID-KEY": per network
// namespace, as the stack's interface is), and returns its length for
// bind or sendto. It does not allocate: wakeRemotes calls it per wake.
func wakeAddr(sa *unix.RawSockaddrUnix, pid, key uint32) uint32 {
	sa.Family = unix.AF_UNIX
	var buf [40]byte
	n := copy(buf[:], "\x00onload-wake-")
	n += len(strconv.AppendUint(buf[n:n], uint64(pid), 10))
	buf[n] = '-'
	n++
	n += len(strconv.AppendUint(buf[n:n], uint64(key), 16))
	for i := 0; i < n; i++ {
		sa.Path[i] = int8(buf[i])
	}
	return uint32(2 + n)
}

// WakeSocket gives this process, which has joined the stack's wakes, a
// socket the other sharers' polls send a datagram to when they touch a
// socket one of its threads sleeps on, instead of bumping its futex word:
// for threads that block outside Go (the LD_PRELOAD shim's), each of which
// waits on it beside its own descriptors and, when it is readable,
// drains it and calls TakeRemoteWakes. The kernel then wakes one of them
// directly, where the word takes a goroutine's wake-up and an eventfd's.
// The socket is the handle's: LeaveWakes closes it.
func (s *Stack) WakeSocket() (int, error) {
	self := s.proc()
	if self == 0 {
		return -1, errors.New("stack: wake socket before JoinWakes")
	}
	if s.wakes.own >= 0 {
		return s.wakes.own, nil
	}
	fd, err := dgramSocket()
	if err != nil {
		return -1, fmt.Errorf("stack: wake socket: %w", err)
	}
	pid := uint32(os.Getpid())
	var kb [4]byte
	for range 8 {
		if _, err = rand.Read(kb[:]); err != nil {
			break
		}
		key := binary.LittleEndian.Uint32(kb[:]) | 1
		var sa unix.RawSockaddrUnix
		l := wakeAddr(&sa, pid, key)
		_, _, errno := unix.Syscall(unix.SYS_BIND, uintptr(fd), uintptr(unsafe.Pointer(&sa)), uintptr(l))
		if errno == 0 {
			atomic.StoreUint32(&s.img.hdr.procs[self-1].key, key)
			s.wakes.own = fd
			return fd, nil
		}
		err = errno
	}
	fdbase.Close(fd)
	return -1, fmt.Errorf("stack: bind wake socket: %w", err)
}

// sendWake sends process slot i's wake socket (key) a datagram. A full
// socket has a wake-up pending already; a gone one, nobody to wake.
func (s *Stack) sendWake(i int, key uint32) {
	fd := s.wakes.send.Load()
	if fd < 0 {
		nfd, err := dgramSocket()
		if err != nil {
			return
		}
		if !s.wakes.send.CompareAndSwap(-1, int64(nfd)) {
			fdbase.Close(nfd)
		}
		if fd = s.wakes.send.Load(); fd < 0 {
			return
		}
	}
	var sa unix.RawSockaddrUnix
	l := wakeAddr(&sa, atomic.LoadUint32(&s.img.hdr.procs[i].pid), key)
	unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(unsafe.Pointer(&wakeByte[0])), 1, unix.MSG_DONTWAIT,
		uintptr(unsafe.Pointer(&sa)), uintptr(l))
}

var wakeByte [1]byte

func alive(pid int) bool {
	return unix.Kill(pid, 0) != unix.ESRCH
}

// wakeRemotes bumps and wakes the word of every process whose threads
// this handle's polls touched.
func (s *Stack) wakeRemotes() {
	bits := s.remote.Swap(0)
	for i := 0; bits != 0; i, bits = i+1, bits>>1 {
		if bits&1 != 0 && i < maxProcs {
			if key := atomic.LoadUint32(&s.img.hdr.procs[i].key); key != 0 {
				s.sendWake(i, key)
				continue
			}
			w := &s.img.hdr.procs[i].wake
			atomic.AddUint32(w, 1)
			futexWake(w, 1)
		}
	}
}

// WaitRemote waits, for at most timeout, until another process bumps this
// process's word past seq, and returns the word. A process that has not
// joined returns seq at once.
func (s *Stack) WaitRemote(seq uint32, timeout time.Duration) uint32 {
	p := s.proc()
	if p == 0 {
		return seq
	}
	w := &s.img.hdr.procs[p-1].wake
	if v := atomic.LoadUint32(w); v != seq {
		return v
	}
	futexWait(w, seq, timeout)
	return atomic.LoadUint32(w)
}

// TakeRemoteWakes wakes (Options.Wake) this process's threads whose
// sockets other processes' polls touched.
func (s *Stack) TakeRemoteWakes() int {
	s.lock()
	defer s.unlock()
	self := procBit(s.proc())
	if self == 0 {
		return 0
	}
	n := 0
	// Only the slots ever used (sockHigh): a wake-up per request of a
	// busy server, under the lock, read the whole table.
	for i := range min(int(s.img.hdr.sockHigh), len(s.img.socks)) {
		sk := &s.img.socks[i]
		if sk.remoteWakes&self == 0 || sk.kind == kindFree {
			continue
		}
		sk.remoteWakes &^= self
		n++
		if s.wake != nil {
			s.wake(s.idOf(sk))
		}
	}
	return n
}
