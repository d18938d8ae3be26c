// Command core is the LD_PRELOAD shim's Go core, built with
// -buildmode=c-shared (bin/libonload-core.so). The C interposer
// (shim/*.c) loads it at a process's first socket operation that
// needs a stack and calls the functions exported here, which drive
// package sockets' descriptor API (sockets.Desc). shim/onload.h is the
// interface: every call is non-blocking, returns a value >= 0 or a
// negated errno, and names a socket by a handle (0: none).
package main

/*
#include <stdint.h>
#include "../onload.h"

// The interposer's note of the stack's own descriptors (fdbase.Notify).
typedef void (*onl_fd_note)(int fd, int open);
static void call_fd_note(onl_fd_note f, int fd, int open) { f(fd, open); }

// The interposer's log writer, where ONLOAD_LOG_FILE names a file.
typedef void (*onl_log_write)(const char *line, int n);
static void call_log_write(onl_log_write f, const char *line, int n) { f(line, n); }
*/
import "C"

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/xdp-onload/onload/internal/fdbase"
	"github.com/xdp-onload/onload/internal/tlock"
	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/stack"
)

func main() {}

// The core's callers are the program's threads, come in from C
// (stack.CallersAreThreads, tlock.SetThreads), and they block in C, each
// on its own descriptors (sockets.WakesToThreads).
func init() {
	stack.CallersAreThreads()
	tlock.SetThreads()
	sockets.WakesToThreads()
}

// maxHandles bounds the handle table: the sockets a process may have
// accelerated at once.
const maxHandles = 1 << 17

// The handle table: lock-free lookups, a free list under mu.
var (
	descs [maxHandles]atomic.Pointer[sockets.Desc]
	mu    sync.Mutex
	free  []int32
	next  int32 = 1

	stk     *sockets.Stack // the process's stack, held for its life
	stkErr  error
	stkOnce sync.Once
)

func theStack() (*sockets.Stack, error) {
	stkOnce.Do(func() {
		stk, stkErr = sockets.DefaultStack()
		if stk != nil {
			bySlot = make([]atomic.Int32, stk.Sockets())
			threadsMu.Lock()
			haveStack = true
			setThreadsLocked()
			threadsMu.Unlock()
		}
	})
	return stk, stkErr
}

// bySlot maps a slot of the stack's socket table to the handle of this
// process's socket there (0: none), for the ready log (onl_ready).
var bySlot []atomic.Int32

func put(d *sockets.Desc) C.int {
	mu.Lock()
	defer mu.Unlock()
	var h int32
	if n := len(free); n > 0 {
		h, free = free[n-1], free[:n-1]
	} else if next < maxHandles {
		h = next
		next++
	} else {
		d.Close()
		return -C.int(syscall.EMFILE)
	}
	descs[h].Store(d)
	if sl := d.ID().Slot(); sl < len(bySlot) {
		bySlot[sl].Store(h)
	}
	return C.int(h)
}

func get(h C.int) *sockets.Desc {
	if h <= 0 || h >= maxHandles {
		return nil
	}
	return descs[h].Load()
}

func errno(err error) C.int { return -C.int(sockets.Errno(err)) }

var errBadHandle = errors.New("bad handle")

// maxRW is the most one read or write moves, as the kernel's
// MAX_RW_COUNT (INT_MAX rounded down to a page).
const maxRW = 0x7ffff000

func ip4(a C.uint32_t) netip.Addr {
	// In network byte order, as in a sockaddr_in.
	v := uint32(a)
	return netip.AddrFrom4([4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})
}

func fromIP4(a netip.Addr) C.uint32_t {
	b := a.As4()
	return C.uint32_t(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
}

func port(p C.uint16_t) uint16 { return uint16(p)>>8 | uint16(p)<<8 }

func toPort(p uint16) C.uint16_t { return C.uint16_t(p>>8 | p<<8) }

// onl_listen accelerates kfd, a kernel TCP socket listening on ip (the
// wildcard or an address; network byte order): a handle, 0 if the stack
// does not serve ip or there is no stack (the kernel keeps the
// socket), or a negated errno. shared: another process made it listen
// (this one inherited it), so other processes may accept on it too.
//
//export onl_listen
func onl_listen(kfd C.int, ip C.uint32_t, shared C.int) C.int {
	s, err := theStack()
	if err != nil {
		sockets.LogFallback("listen", ip4(ip).String(), err.Error())
		return 0
	}
	if !s.ServesLocal(ip4(ip)) {
		sockets.LogFallback("listen", ip4(ip).String(), "not the stack's address")
		return 0
	}
	d, err := s.ListenDesc(int(kfd), ip4(ip), shared != 0)
	if err != nil {
		sockets.LogFallback("listen", ip4(ip).String(), err.Error())
		return 0
	}
	return put(d)
}

// onl_connect connects kfd's socket to ip:port through the stack: a
// handle (the handshake has begun), 0 if the stack does not reach the
// address (the kernel connects kfd), or a negated errno.
//
//export onl_connect
func onl_connect(kfd C.int, ip C.uint32_t, p C.uint16_t, tos, ttl C.int) C.int {
	dst := netip.AddrPortFrom(ip4(ip), port(p))
	s, err := theStack()
	if err != nil {
		sockets.LogFallback("connect", dst.String(), err.Error())
		return 0
	}
	if why := s.ConnectsKernel(dst); why != "" {
		sockets.LogFallback("connect", dst.String(), why)
		return 0
	}
	var pre []sockets.Preset
	if tos >= 0 {
		pre = append(pre, sockets.Preset{Opt: stack.TOS, Value: int(tos)})
	}
	if ttl >= 0 {
		pre = append(pre, sockets.Preset{Opt: stack.TTL, Value: int(ttl)})
	}
	d, err := s.ConnectDesc(int(kfd), dst, pre...)
	if err != nil {
		return errno(err)
	}
	return put(d)
}

//export onl_accept
func onl_accept(h, kfd C.int) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	c, err := d.Accept(int(kfd))
	if err != nil {
		return errno(err)
	}
	return put(c)
}

// onl_recv reads from handle h; *owed is set when the read left an ACK
// for the thread's next wait to kick (onl_kick), or its answer to carry
// (sockets.Desc.RecvCorked).
//
//export onl_recv
func onl_recv(h C.int, buf unsafe.Pointer, n C.size_t, peek C.int, owed *C.int) C.long {
	d := get(h)
	if d == nil {
		return C.long(errno(errBadHandle))
	}
	if n == 0 {
		return 0
	}
	if buf == nil {
		return C.long(errno(syscall.EFAULT)) // the C layer refuses it first
	}
	n = min(n, maxRW)
	r, held, err := d.RecvCorked(unsafe.Slice((*byte)(buf), int(n)), peek != 0)
	if held {
		*owed = 1
	}
	if err != nil {
		return C.long(errno(err))
	}
	return C.long(r)
}

//export onl_send
func onl_send(h C.int, buf unsafe.Pointer, n C.size_t, more C.int) C.long {
	d := get(h)
	if d == nil {
		return C.long(errno(errBadHandle))
	}
	if n == 0 {
		return 0
	}
	if buf == nil {
		return C.long(errno(syscall.EFAULT)) // the C layer refuses it first
	}
	n = min(n, maxRW)
	b := unsafe.Slice((*byte)(buf), int(n))
	var r int
	var err error
	if more != 0 {
		r, err = d.SendMore(b)
	} else {
		r, err = d.Send(b)
	}
	if r > 0 || err == nil {
		return C.long(r)
	}
	return C.long(errno(err))
}

// onl_kick gives the NIC the frames sends with more left waiting.
//
//export onl_kick
func onl_kick() {
	if stk != nil {
		stk.KickHeld()
	}
}

// batch is a call's view of n handles: their sockets (nil for a bad
// handle) and scratch. Batches are pooled, their slices kept: a wait
// takes one for every check, and allocating it each time would feed the
// garbage collector, whose work the waits then wait for.
type batch struct {
	ds    []*sockets.Desc
	ids   []stack.SockID
	evs   []stack.Events
	want  []stack.Events
	edges []uint32
	slots []uint32 // the ready log's (onl_ready)
}

var batches = sync.Pool{New: func() any { return new(batch) }}

func newBatch(hs *C.int, n int) *batch {
	b := batches.Get().(*batch)
	b.fill(hs, n)
	return b
}

// fill makes b the view of the n handles hs.
func (b *batch) fill(hs *C.int, n int) {
	if cap(b.ds) < n {
		c := max(n, 64)
		b.ds, b.ids = make([]*sockets.Desc, c), make([]stack.SockID, c)
		b.evs, b.want = make([]stack.Events, c), make([]stack.Events, c)
		b.edges = make([]uint32, c)
	}
	b.ds, b.ids, b.evs, b.want, b.edges = b.ds[:n], b.ids[:n], b.evs[:n], b.want[:n], b.edges[:n]
	for i, h := range unsafe.Slice(hs, n) {
		b.ds[i] = get(h)
	}
}

func (b *batch) free() {
	clear(b.ds) // no sockets kept alive
	batches.Put(b)
}

// out writes the events, Error|Hangup for a bad handle.
func (b *batch) out(evs *C.int) {
	ev := unsafe.Slice(evs, len(b.ds))
	for i, d := range b.ds {
		if d == nil {
			ev[i] = C.ONL_ERROR | C.ONL_HANGUP
		} else {
			ev[i] = C.int(b.evs[i])
		}
	}
}

// onl_events reports the readiness of n sockets (hs; 0: none) into evs,
// after polling the stack once if poll is set (a spinner); edges, unless
// NULL, gets each socket's count of edges (stack.Stack.EventsOf: EPOLLET
// reports a socket again when it moved).
//
//export onl_events
func onl_events(hs *C.int, evs *C.int, edges *C.uint, n C.int, poll C.int) {
	if stk == nil {
		return
	}
	if poll != 0 {
		stk.Poll()
	}
	b := newBatch(hs, int(n))
	b.events(evs, edges)
	b.free()
}

// events reports the readiness of b's sockets into evs, and their edge
// counts into edges unless it is NULL (onl_events).
func (b *batch) events(evs *C.int, edges *C.uint) {
	var eb []uint32
	if edges != nil {
		eb = b.edges
	}
	stk.EventsOf(b.ds, b.ids, b.evs, eb)
	b.out(evs)
	if edges != nil {
		copy(unsafe.Slice((*uint32)(unsafe.Pointer(edges)), len(eb)), eb)
	}
}

// onl_ready is onl_events for an epoll instance that checks only some of
// its members: hs[0..n) are those it checks anyway (the ones it found
// ready, or waiting for write space, or new), and to them it appends the
// handles of this process's sockets that the stack's ready log names
// since *seq (stack.Stack.ReadySince), at most room of them (hs has room
// for n+room), before it reports the events of all. *seq moves to the
// log's head. It returns how many handles hs holds then, or -1 when the
// log cannot say which changed (it wrapped since *seq, or more than room
// changed): the caller checks all its members. A room < 0 is that check:
// hs holds every member, and *seq only moves to the head (first, so that
// what changes during the check is logged after it).
//
// Before it looks it does what *flags asks (ONL_READY_*: a kick, a
// poll), so that a busy caller's epoll_wait is one call into the core.
//
//export onl_ready
func onl_ready(hs, evs *C.int, edges *C.uint, n, room C.int, seq *C.uint, flags *C.int) C.int {
	if stk == nil { // no stack, so no socket of ours: nothing is ready
		clear(unsafe.Slice(evs, int(n)))
		return n
	}
	fl := *flags
	if fl&C.ONL_READY_KICK != 0 {
		stk.KickHeld()
	}
	if fl&C.ONL_READY_POLL != 0 {
		stk.Poll()
	} else if fl&C.ONL_READY_TRY_POLL != 0 {
		stk.TryPoll()
	}
	q := (*uint32)(unsafe.Pointer(seq))
	m := int(n)
	b := batches.Get().(*batch)
	if room < 0 {
		*q = stk.ReadyHead()
	} else {
		if cap(b.slots) < int(room) {
			b.slots = make([]uint32, max(int(room), 256))
		}
		k, ok := stk.ReadySince(q, b.slots[:room])
		if !ok {
			batches.Put(b)
			return -1
		}
		all := unsafe.Slice(hs, int(n)+int(room))
		prev := ^uint32(0)
		for _, sl := range b.slots[:k] {
			if sl == prev || int(sl) >= len(bySlot) {
				continue // the same socket again, in a burst of segments
			}
			prev = sl
			if h := bySlot[sl].Load(); h != 0 {
				all[m] = C.int(h)
				m++
			}
		}
	}
	b.fill(hs, m)
	b.events(evs, edges)
	b.free()
	return C.int(m)
}

// onl_arm arms n sockets (hs, each for the events in want; 0: none) to
// write eventfd efd at their next change, and returns how many are ready
// for what they want now (their events in evs): if any is, none stays
// armed. A want of ONL_EDGE is ready only if the socket's edge count is
// no longer edges[i] (edges may be NULL where no want is ONL_EDGE). If
// none is ready, the caller is about to block: park says how
// (ONL_PARK_*), and onl_disarm's unpark must match it.
//
//export onl_arm
func onl_arm(hs, want, evs *C.int, edges *C.uint, n C.int, efd C.int, park C.int) C.int {
	if stk == nil {
		return 0
	}
	b := newBatch(hs, int(n))
	for i, w := range unsafe.Slice(want, int(n)) {
		b.want[i] = stack.Events(w &^ C.ONL_EDGE)
		if w&C.ONL_EDGE != 0 {
			b.want[i] = stack.Edge
		}
	}
	var eb []uint32
	if edges != nil {
		eb = unsafe.Slice((*uint32)(unsafe.Pointer(edges)), int(n))
	}
	ready := stk.ArmAll(b.ds, b.want, b.evs, eb, int32(efd), b.ids)
	b.out(evs)
	b.free()
	if ready == 0 {
		parkAs(park)
	}
	return C.int(ready)
}

// parkAs parks the caller (ONL_PARK_*: onl_arm).
func parkAs(park C.int) {
	switch park {
	case C.ONL_PARK:
		stk.Park()
	case C.ONL_PARK_DIRECT:
		stk.ParkDirect()
	}
}

// unparkAs is onl_disarm's unpark.
func unparkAs(unpark C.int) {
	switch unpark {
	case C.ONL_PARK:
		stk.Unpark()
	case C.ONL_PARK_DIRECT:
		stk.UnparkDirect()
	case C.ONL_UNPARK_POLL:
		stk.UnparkDirect()
		stk.Poll()
	}
}

// onl_arm_ready is onl_arm for an epoll instance of many members: it asks
// for eventfd efd to be written at the stack's ready log's next entry
// (sockets.Stack.ArmReady) instead of arming each member. It returns 1 if
// the log has moved past seq (the instance's position: look again), 0 if
// armed (the caller parks as park says and blocks; onl_disarm_ready
// after), or -1 if the stack cannot (it is shared with other processes):
// the caller arms its members (onl_arm).
//
//export onl_arm_ready
func onl_arm_ready(efd C.int, seq C.uint, park C.int) C.int {
	if stk == nil {
		return -1
	}
	moved, ok := stk.ArmReady(int32(efd), uint32(seq))
	switch {
	case !ok:
		return -1
	case moved:
		return 1
	}
	parkAs(park)
	return 0
}

// onl_disarm_ready takes back what onl_arm_ready asked (unpark as in
// onl_disarm).
//
//export onl_disarm_ready
func onl_disarm_ready(efd C.int, unpark C.int) {
	if stk == nil {
		return
	}
	unparkAs(unpark)
	stk.DisarmReady(int32(efd))
}

// onl_disarm takes back what onl_arm asked, for a caller that woke
// (unpark: as it parked; ONL_UNPARK_POLL, parked direct, also polls the
// stack: the interrupt fd was readable).
//
//export onl_disarm
func onl_disarm(hs *C.int, n C.int, efd C.int, unpark C.int) {
	if stk == nil {
		return
	}
	unparkAs(unpark)
	b := newBatch(hs, int(n))
	stk.DisarmAll(b.ds, int32(efd))
	b.free()
}

// onl_irq_fd is the stack's interrupt file descriptor, readable while a
// frame waits in its RX ring: a thread about to block adds it to its
// poll set (parking with ONL_PARK_DIRECT) and polls the stack when it
// fires. -1: none (no stack, or a NIC without one).
//
//export onl_irq_fd
func onl_irq_fd() C.int {
	if stk == nil {
		return -1
	}
	return C.int(stk.InterruptFD())
}

// onl_remote_fd is the stack's wake socket, readable when another
// process sharing the stack made ready a socket that this process's
// threads wait on: a thread about to block adds it to its poll set and,
// when it fires, drains it and calls onl_take_remote. -1: none (the
// stack is not shared).
//
//export onl_remote_fd
func onl_remote_fd() C.int {
	if stk == nil {
		return -1
	}
	return C.int(stk.RemoteWakeFD())
}

// onl_take_remote wakes the threads whose sockets other processes made
// ready (onl_remote_fd).
//
//export onl_take_remote
func onl_take_remote() {
	if stk != nil {
		stk.TakeRemoteWakes()
	}
}

// onl_forget_efd is called before a thread closes its eventfd efd: no
// wake writes it after this returns (sockets.Stack.ForgetSignals).
//
//export onl_forget_efd
func onl_forget_efd(efd C.int) {
	if stk != nil {
		stk.ForgetSignals(int32(efd))
	}
}

// Processors for the program's threads. A thread come in from C keeps
// the processor (P) it ran Go on when it goes back to C: the runtime
// leaves it in the system-call state, to be taken again cheaply at the
// next call, and its monitor (sysmon) takes it back only when no other
// processor is idle, at its next tick. With as many such threads as
// processors (memcached -t 2 on two CPUs), every other thread's call,
// and every goroutine of the stack's (the Sleeper), waited for that
// tick, and the monitor ran every 20 µs taking processors back and
// signalling threads. So the core gives the program's live threads that
// have called it a processor each beyond the CPUs' (up to
// maxThreadProcs more), unless the user set GOMAXPROCS.
//
// Each change of GOMAXPROCS stops the world, so the extra processors go
// up in powers of two (a program that starts 40 threads changes it seven
// times, not 40) and come down only when the threads have fallen to an
// eighth of them, to twice the threads left, never below
// minThreadProcs: a thread-a-connection server whose threads come and go
// changes little once it has its processors (python's http.server
// with 20 connections, its threads between 8 and 17, went from 34
// processors to 18 and back three times in 4 s when they came down at a
// quarter). Before, they were never
// taken back: 41 threads one after another left 43 processors on two
// CPUs, a garbage collection then running 10 workers of its own.
const (
	maxThreadProcs = 64
	minThreadProcs = 4
)

var (
	threadsMu sync.Mutex
	threads   int  // live program threads that have called the core
	haveStack bool // the stack is made (theStack): setThreadsLocked tells it
	baseProcs = runtime.GOMAXPROCS(0)
	userProcs = os.Getenv("GOMAXPROCS") != ""
)

// threadProcs is the processors beyond the CPUs' that extra, the
// current number, should become for n live threads.
func threadProcs(n, extra int) int {
	if n > extra {
		p := 1
		for p < n {
			p *= 2
		}
		return min(p, maxThreadProcs)
	}
	if extra > minThreadProcs && 8*n <= extra {
		return max(2*n, minThreadProcs)
	}
	return extra
}

// setThreadProcsLocked sets GOMAXPROCS for the live threads, if that
// changes it.
func setThreadProcsLocked() {
	if userProcs {
		return
	}
	extra := runtime.GOMAXPROCS(0) - baseProcs
	if want := threadProcs(threads, extra); want != extra {
		runtime.GOMAXPROCS(baseProcs + want)
		sockets.LogDebug("%d threads of the program in the stack; GOMAXPROCS %d", threads, baseProcs+want)
	}
}

// onl_thread counts a program thread at its first call into the core.
// logw, where ONLOAD_LOG_FILE names a file, is the interposer's writer
// of the log: the core's lines go through it from the first (cLog).
//
//export onl_thread
func onl_thread(logw C.onl_log_write) {
	if logw != nil {
		logOnce.Do(func() { sockets.SetLogOutput(cLog{logw}) })
	}
	threadsMu.Lock()
	defer threadsMu.Unlock()
	threads++
	setThreadProcsLocked()
	setThreadsLocked()
}

// setThreadsLocked tells the stack, if there is one, how many threads
// use it (the Sleeper's allParked).
func setThreadsLocked() {
	if haveStack {
		stk.SetThreads(threads)
	}
}

// onl_thread_gone uncounts a thread onl_thread counted, as it ends.
//
//export onl_thread_gone
func onl_thread_gone() {
	threadsMu.Lock()
	defer threadsMu.Unlock()
	if threads > 0 {
		threads--
	}
	setThreadProcsLocked()
	setThreadsLocked()
}

// onl_resched gives the calling thread's Go processor a turn of the
// scheduler. The thread's goroutine is locked to it, so it runs again on
// the same thread once a runtime thread hands the processor back (two
// thread wake-ups, about 40 µs here). A thread
// that comes in from C never goes through the scheduler, so its
// processor's schedule tick stands still, and once it has stood 10 ms
// (forcePreemptNS) the runtime's monitor (sysmon) takes the processor
// back at every tick of its that finds the thread in C (retake's
// "sysretake"), not only after the thread has been in C 10 ms: the
// thread's next call takes a processor again, and wakes the monitor
// from its sleep. The interposer calls this from a thread's waits every
// few milliseconds (keep_p), which keeps the tick moving.
//
// Measured on this machine (2026-11-27, a C loop calling an empty
// exported function and sleeping 20 µs): 36 µs of CPU a call, against
// 19 µs for the same loop calling C, and 20 µs with this every 5 ms;
// under redis-server with redis-benchmark, sysmon's ticks fell from
// about 1,650 a second to 100.
//
//export onl_resched
func onl_resched() {
	runtime.Gosched()
}

// onl_spin_ns is how long a waiter spins before it blocks (0: no
// stack, or no spinning).
//
//export onl_spin_ns
func onl_spin_ns() C.long {
	if stk == nil {
		return 0
	}
	return C.long(stk.SpinTime())
}

// onl_blocked_threads is ONLOAD_BLOCKED_THREADS: the threads blocked at
// once, each on one connection of its own, at which the process's
// sockets go to the kernel (0: never, or no stack).
//
//export onl_blocked_threads
func onl_blocked_threads() C.int {
	if stk == nil {
		return 0
	}
	return C.int(stk.Config().BlockedThreads)
}

//export onl_try_spin
func onl_try_spin() C.int {
	if stk == nil || !stk.TrySpin() {
		return 0
	}
	return 1
}

//export onl_end_spin
func onl_end_spin() {
	if stk != nil {
		stk.EndSpin()
	}
}

// onl_close closes the socket (the caller closes its kernel fd).
//
//export onl_close
func onl_close(h C.int) {
	d := get(h)
	if d == nil {
		return
	}
	descs[h].Store(nil)
	if sl := d.ID().Slot(); sl < len(bySlot) {
		bySlot[sl].CompareAndSwap(int32(h), 0)
	}
	d.Close()
	mu.Lock()
	free = append(free, int32(h))
	delete(childServed, d)
	mu.Unlock()
}

// onl_exit closes the process's sockets as the kernel does at exit and
// serves the stack until they have delivered what was written and their
// FIN, for at most exitLinger, when the stack is the process's own
// (sockets.Stack.Exit); the interposer calls it from an atexit handler.
//
//export onl_exit
func onl_exit() {
	if stk == nil {
		return
	}
	sockets.LogDebug("at exit: sleeper %+v", stk.Sleeper().Stats())
	threadsMu.Lock()
	sockets.LogDebug("at exit: %d threads of the program in the stack; GOMAXPROCS %d, the CPUs' %d", threads, runtime.GOMAXPROCS(0), baseProcs)
	threadsMu.Unlock()
	sockets.LogDebug("at exit: %s", stk.NICDump())
	if err := stk.Finish(exitLinger); err != nil {
		sockets.LogError("exit: %v", err)
	}
}

// onl_init makes the process's stack as the core loads, and the service
// that hands its connections over for children forked after (for a
// stack of its own): the interposer holds the fd numbers below base
// meanwhile, so that their fds stay out of the program's range, and what
// the stack opens later is moved above base (fdbase), and note hears of
// it (and of its close), so that the interposer refuses the program's
// close of it as it does those of the stack it found as the core loaded.
// A stack that cannot be made is told of by each call that needs it.
//
//export onl_init
func onl_init(base C.int, note C.onl_fd_note) {
	fdbase.Set(int(base))
	if note != nil {
		fdbase.Notify(func(fd int, open bool) {
			o := C.int(0)
			if open {
				o = 1
			}
			C.call_fd_note(note, C.int(fd), o)
		})
	}
	s, err := theStack()
	if err != nil {
		return
	}
	if _, _, viaDaemon := s.HandoverVia(); !viaDaemon {
		if _, err := handoverService(); err != nil {
			sockets.LogDebug("%v", err)
		}
	}
}

// cLog writes the core's log lines through the interposer (onl_thread's
// logw), which keeps the log file open from the process's start.
type cLog struct{ w C.onl_log_write }

var logOnce sync.Once

func (l cLog) Write(b []byte) (int, error) {
	if len(b) > 0 {
		C.call_log_write(l.w, (*C.char)(unsafe.Pointer(&b[0])), C.int(len(b)))
	}
	return len(b), nil
}

// onl_own_stack is 1 when the stack is the process's own (not onloadd's):
// the interposer hands a connection with data still to deliver over to
// the kernel at exit, where onloadd would otherwise finish it.
//
//export onl_own_stack
func onl_own_stack() C.int {
	if stk == nil {
		return 0
	}
	if _, _, viaDaemon := stk.HandoverVia(); viaDaemon {
		return 0
	}
	return 1
}

// onl_ifindex is the index of the stack's interface: a socket bound to
// another (SO_BINDTODEVICE) is the kernel's. 0 if it has none.
//
//export onl_ifindex
func onl_ifindex() C.int {
	if stk == nil {
		return 0
	}
	return C.int(stk.InterfaceIndex())
}

// exitLinger bounds how long a process's exit waits for its connections
// to finish (onl_exit). Over this path a peer acknowledges in
// microseconds; a peer that takes longer is likely gone.
const exitLinger = time.Second

//export onl_shutdown
func onl_shutdown(h, how C.int) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	return errno(d.Shutdown(int(how)))
}

// onl_retire_listener gives listener h's port to the kernel: its
// socket goes to another process (SCM_RIGHTS). 0 or a negated errno.
//
//export onl_retire_listener
func onl_retire_listener(h C.int) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	return errno(d.RetireListener())
}

// childServed counts, by listener, the connections in a row it gave
// that a forked child served (onl_child_served); -1 once its port went
// to the kernel. Under mu.
var childServed = map[*sockets.Desc]int{}

// onl_child_served is told of connection h as the interposer hands it to
// the kernel at its close for a child forked since it was accepted
// (handover_for_close). A server of a process a connection (PostgreSQL's
// postmaster, sshd, inetd) accepts, forks a child, and closes its copy
// without reading or writing it, and each of its connections costs a
// handover (about 2 ms). Once ONLOAD_CHILD_SERVED connections of one
// listener in a row went so, the listener's port goes to the kernel
// (RetireListener): its later connections are the kernel's from their
// accept on, which is what the children need. A connection this process
// read or wrote (redis's, closed while its BGSAVE child lives) starts
// the count again. It returns 1 if it retired the listener now (the
// interposer logs it), 0 if not, or a negated errno.
//
//export onl_child_served
func onl_child_served(h C.int) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	l := d.AcceptedFrom()
	limit := stk.Config().ChildServed
	if l == nil || limit <= 0 {
		return 0
	}
	// A connection the child took already is the stack's no more (an
	// error, or HANDED-OVER, which reads 0 and 0): the child used it,
	// and its parent had not (or it would not be here with a child
	// alive).
	ti, err := d.TCPInfo()
	unused := err != nil || ti.Read == 0 && ti.Written == 0
	mu.Lock()
	n := childServed[l]
	switch {
	case n < 0:
	case !unused:
		delete(childServed, l)
	default:
		n++
		childServed[l] = n
	}
	mu.Unlock()
	if n < limit {
		return 0
	}
	if err := l.RetireListener(); err != nil {
		return errno(err)
	}
	mu.Lock()
	childServed[l] = -1
	mu.Unlock()
	return 1
}

//export onl_setopt
func onl_setopt(h, opt, v C.int) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	return errno(d.SetOption(stack.Option(opt), int(v)))
}

// onl_getopt reads an option the engine keeps (stack.Option opt): its
// value, or -errno.
//
//export onl_getopt
func onl_getopt(h, opt C.int) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	v, err := d.Option(stack.Option(opt))
	if err != nil {
		return errno(err)
	}
	return C.int(v)
}

//export onl_addrs
func onl_addrs(h C.int, lip *C.uint32_t, lport *C.uint16_t, rip *C.uint32_t, rport *C.uint16_t) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	la, ra, err := d.Addrs()
	if err != nil {
		return errno(err)
	}
	*lip, *lport = fromIP4(la.Addr()), toPort(la.Port())
	if ra.IsValid() {
		*rip, *rport = fromIP4(ra.Addr()), toPort(ra.Port())
	} else {
		*rip, *rport = 0, 0
	}
	return 0
}

// onl_sockerr takes the socket's pending error: an errno, 0 if none.
//
//export onl_sockerr
func onl_sockerr(h C.int) C.int {
	d := get(h)
	if d == nil {
		return C.int(syscall.EBADF)
	}
	return C.int(sockets.Errno(d.SockError()))
}

// onl_unread is how many bytes a read would return now (FIONREAD).
//
//export onl_unread
func onl_unread(h C.int) C.int {
	ti, e := tcpInfo(h)
	if e != 0 {
		return e
	}
	return C.int(ti.Unread)
}

func tcpInfo(h C.int) (stack.TCPInfo, C.int) {
	d := get(h)
	if d == nil {
		return stack.TCPInfo{}, errno(errBadHandle)
	}
	ti, err := d.TCPInfo()
	if err != nil {
		return ti, errno(err)
	}
	return ti, 0
}

// Linux's TCP states, as TCP_INFO reports them.
var linuxState = map[string]uint32{
	"ESTABLISHED": 1, "SYN-SENT": 2, "SYN-RECEIVED": 3, "FIN-WAIT-1": 4,
	"FIN-WAIT-2": 5, "TIME-WAIT": 6, "CLOSED": 7, "CLOSE-WAIT": 8,
	"LAST-ACK": 9, "LISTEN": 10, "CLOSING": 11,
}

//export onl_tcpinfo
func onl_tcpinfo(h C.int, out *C.struct_onl_tcpinfo) C.int {
	ti, e := tcpInfo(h)
	if e != 0 {
		return e
	}
	mss := uint32(max(ti.MSS, 1))
	us := func(v interface{ Microseconds() int64 }) C.uint32_t { return C.uint32_t(v.Microseconds()) }
	*out = C.struct_onl_tcpinfo{
		state:  C.uint32_t(linuxState[ti.State]),
		rto_us: us(ti.RTO), rtt_us: us(ti.RTT), rttvar_us: us(ti.RTTVar),
		snd_mss: C.uint32_t(mss), rcv_mss: C.uint32_t(mss),
		snd_cwnd: C.uint32_t(ti.Cwnd / mss), snd_ssthresh: C.uint32_t(ti.Ssthresh / mss),
		unacked: C.uint32_t((ti.Unacked + mss - 1) / mss), lost: C.uint32_t(ti.Lost / mss),
		retrans: C.uint32_t(ti.Retrans / mss), sacked: C.uint32_t(ti.Sacked / mss),
		backoff: C.uint32_t(ti.Backoff), snd_wnd: C.uint32_t(ti.SndWnd),
		notsent: C.uint32_t(ti.Queued - min(ti.Queued, ti.Unacked)),
		queued:  C.uint32_t(ti.Queued),
	}
	if ti.Timestamps {
		out.options |= 1 // TCPI_OPT_TIMESTAMPS
	}
	if ti.SACK {
		out.options |= 2 // TCPI_OPT_SACK
	}
	if ti.SndWScale >= 0 {
		out.options |= 4 // TCPI_OPT_WSCALE
		out.snd_wscale, out.rcv_wscale = C.uint32_t(ti.SndWScale), C.uint32_t(ti.RcvWScale)
	}
	return 0
}

// onl_dump describes socket h (or the stack, for h 0) into buf, for
// ONLOAD_LOG=debug; it returns the length written.
//
//export onl_dump
func onl_dump(h C.int, buf *C.char, n C.int) C.int {
	var s string
	if d := get(h); d != nil {
		s = d.Dump()
	} else if stk != nil {
		s = stk.Dump()
	} else {
		s = fmt.Sprint("no stack: ", stkErr)
	}
	return C.int(copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n)), s))
}

// onl_handover_info gives what a child forked after the core loaded
// needs to have handle h's connection handed over, which it asks for
// itself (it cannot run Go; handover.go): the stack's number and the
// socket's, and where to ask in path (n bytes, NUL-terminated): onloadd's
// control socket, or this process's own service ("@name", abstract) for
// a stack it made. -EOPNOTSUPP when there is nowhere.
//
//export onl_handover_info
func onl_handover_info(h C.int, stackID, sock *C.uint32_t, path *C.char, n C.int) C.int {
	d := get(h)
	if d == nil || stk == nil {
		return errno(errBadHandle)
	}
	p, id, ok := stk.HandoverVia()
	if !ok {
		// Our own stack: this process serves its children's requests.
		var err error
		if p, err = handoverService(); err != nil {
			sockets.LogDebug("%v", err)
			return -C.int(syscall.EOPNOTSUPP)
		}
	}
	if len(p)+1 > int(n) {
		return -C.int(syscall.ENAMETOOLONG)
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(path)), int(n))
	b[copy(b, p)] = 0
	*stackID, *sock = C.uint32_t(id), C.uint32_t(d.SockID())
	return 0
}

// onl_handover hands handle h's connection over to the kernel on kfd,
// its kernel socket, and closes the handle (0), or fails with an errno:
// -EBADMSG when the connection was lost doing it (the peer was reset),
// any other with the connection still the stack's.
//
//export onl_handover
func onl_handover(h, kfd C.int) C.int {
	d := get(h)
	if d == nil {
		return errno(errBadHandle)
	}
	if err := d.Handover(int(kfd)); err != nil {
		sockets.LogDebug("handover of fd %d: %v", int(kfd), err)
		if errors.Is(err, stack.ErrHandoverLost) {
			return -C.int(syscall.EBADMSG)
		}
		return errno(err)
	}
	return 0
}

// onl_handed_over is 1 if a handover took handle h's socket (under way,
// or ended moments ago): the caller found it gone and waits for the
// kernel's connection on its kernel socket (fdtable.c, kernel_took).
//
//export onl_handed_over
func onl_handed_over(h C.int) C.int {
	if d := get(h); d != nil && d.HandedOver() {
		return 1
	}
	return 0
}
