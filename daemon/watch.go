package daemon

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/eventfd"
	"github.com/xdp-onload/onload/internal/lookback"
	"github.com/xdp-onload/onload/stack"
)

// DefaultTakeover is how long a stack with work waiting may go unpolled
// by its processes before onloadd polls it (Config.Takeover).
const DefaultTakeover = time.Millisecond

// DefaultTakeoverPriority is the SCHED_FIFO priority of the watchers'
// threads (Config.TakeoverPriority): the lowest real-time one, above
// every normally scheduled thread (the applications among them) and
// below the kernel's own real-time threads.
const DefaultTakeoverPriority = 1

// minTakeover is the shortest grace period a watcher gives: it sleeps at
// least a quarter of it between polls, so that a real-time watcher
// never takes a processor for long.
const minTakeover = 100 * time.Microsecond

// maxIdleWait bounds one wait of the watcher of an idle stack, so that
// it looks at the stack's timers again now and then.
const maxIdleWait = time.Second

// lateLookEvery bounds a wait of the watcher of an idle stack while a
// handover's grace lasts (stack.InHandoverGrace): a late segment a
// process kept in the moment the wait began waits at most this for
// GiveLate, under the peer's retransmission timeout (200 ms and more).
// Each such wait costs onloadd some seven wake-ups of its threads (the
// runtime's poller and monitor among them): 200-270 in 1.5 s of the
// grace, where looking every grace period (1 ms) cost 1,100-1,300 and
// 20-35 ms of CPU at a real-time priority, and a bound of 10 ms 1,070
// (TestDaemonHandoverGraceCPU).
const lateLookEvery = 50 * time.Millisecond

// watcher polls one stack when its processes do not (seed 001's lazy
// interrupts, with onloadd as the interrupt handler). While a process
// polls it stays out of the way: it reads two words of shared memory
// every grace period, less often while the process keeps polling
// (lookAfter), and makes no system call the process would see.
// When the process has not polled for the grace period and has work
// waiting (frames in the ring, a timer due), the watcher takes the lock
// by trylock and runs the same poll: ACKs, retransmissions, timers,
// handshakes, data into receive queues; the process's sleepers are woken
// through their slots (stack.JoinWakes). A lock held by a process that
// is stopped stays held: the watcher leaves the work in the lock's
// deferred flags and looks again. When the stack is idle (nothing
// waiting, nobody polling), it sleeps on the AF_XDP socket's readiness
// and the next timer, costing nothing until a frame comes.
//
// The watcher runs on a thread of its own at a real-time priority
// (Config.TakeoverPriority), as the kernel's interrupt handling runs
// ahead of applications: a process busy on every processor it has, or
// many processes on few processors, would otherwise keep the watcher
// from polling for longer than the peer's tail loss probe waits (10ms
// or so), and the peer would retransmit. It never spins: it sleeps at
// least a quarter of the grace period between polls, and a poll's work
// is bounded.
type watcher struct {
	s     *dstack
	grace time.Duration
	stop  int // eventfd: written to end the watch
	// fds is sleepQuiet's poll set, kept here so that the raw system
	// call's pointer is to memory that does not move.
	fds [1]unix.PollFd
	// checked is when the watcher last looked over the socket table.
	checked time.Time
	// looks paces the looks at a stack its process keeps polling
	// (lookAfter).
	looks lookback.Backoff
	done  chan struct{}
	// ready is an epoll set the Go runtime's network poller waits on,
	// with the stack's AF_XDP socket in it while the watcher waits for
	// it (park); stopped and stopC end the parked waits as stop does the
	// raw ones; timer is park's timer.
	ready   *os.File
	stopped atomic.Bool
	stopC   chan struct{}
	timer   *time.Timer

	ended sync.Once

	polls atomic.Uint64 // polls the watcher made for the process
	since atomic.Int64  // when the current stall began (Clock), 0 if none
	err   atomic.Pointer[string]
}

// startWatch starts s's watcher, unless takeover is off.
func (d *Daemon) startWatch(s *dstack) error {
	if d.cfg.Takeover < 0 {
		return nil
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("watcher of stack %d: %w", s.id, err)
	}
	ready, err := readySet()
	if err != nil {
		unix.Close(efd)
		return fmt.Errorf("watcher of stack %d: %w", s.id, err)
	}
	w := &watcher{s: s, grace: max(d.cfg.Takeover, minTakeover), stop: efd, done: make(chan struct{}),
		ready: ready, stopC: make(chan struct{}), timer: time.NewTimer(time.Hour)}
	w.timer.Stop()
	s.watch = w
	// A watcher keeps its processor while it sleeps (sleepQuiet): the
	// runtime gets one more than the watchers.
	if n := int(d.watchers.Add(1)) + 1; n > runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
	}
	go w.run(d)
	return nil
}

// end stops the watcher and waits for it.
func (w *watcher) end() {
	if w == nil {
		return
	}
	w.ended.Do(func() {
		w.stopped.Store(true)
		close(w.stopC)
		w.ready.SetReadDeadline(time.Unix(1, 0))
		eventfd.Signal(w.stop)
		<-w.done
		unix.Close(w.stop)
		w.ready.Close()
	})
}

func (w *watcher) run(d *Daemon) {
	defer close(w.done)
	defer d.watchers.Add(-1)
	// The thread is never unlocked: it ends with the goroutine, and its
	// priority with it.
	runtime.LockOSThread()
	if p := d.cfg.TakeoverPriority; p > 0 {
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: uint32(p)}, 0); err != nil {
			d.prioWarned.Do(func() {
				d.log.Warn("onloadd polls stacks for their processes at normal priority: a busy machine may delay a takeover; give onloadd CAP_SYS_NICE, or -takeover-priority 0 to choose normal priority",
					"priority", p, "err", err)
			})
		}
	}
	st := w.s.st
	grace := int64(w.grace)
	ctl, ctlErr := w.s.ifc.steer.Control(w.s.id)
	for {
		if ctlErr == nil {
			// A stack nearly full of connections gives new ones to the
			// kernel (stack.Stack.Overflow): its processes cannot write
			// the steering's control word; onloadd mirrors it.
			ctl.SetFull(st.Overflow())
		}
		// Segments steered here before a handover ended, which a process
		// polled and could not give the kernel's socket.
		if st.LateWaiting() && !w.giveLate(d) {
			return
		}
		now := int64(stack.Now())
		last := st.AppPolledAt()
		switch {
		case now-last < grace:
			// The process polls: look again when a grace period has
			// passed since its last poll, or later while it keeps
			// polling (lookAfter).
			w.since.Store(0)
			if w.sleep(w.lookAfter(last, time.Duration(now-last)), false) {
				return
			}
			continue
		case !st.Waiting():
			// Nothing to do: wait for a frame or the next timer, then
			// give the process its grace period to take it.
			w.looks.Reset()
			w.since.Store(0)
			wait := maxIdleWait
			if st.InHandoverGrace() {
				// A frame steered here before a handover ended wakes us
				// as any frame does, and whichever handle polls it, a
				// process keeps its segment for us (GiveLate), which we
				// look for at the next turn. But the process may take
				// it between our look and our wait's start: then nothing
				// wakes us. lateLookEvery bounds that wait.
				wait = lateLookEvery
			}
			if t := st.EarliestTimer(); t != math.MaxInt64 {
				wait = min(wait, max(time.Duration(t-now), 0))
			}
			if w.sleep(wait, true) || w.sleep(w.grace, false) {
				return
			}
			continue
		}
		// Work has waited a grace period and nobody polled: take over.
		w.looks.Reset()
		w.since.CompareAndSwap(0, now)
		if !w.poll(d) {
			return
		}
		if w.sleep(w.grace/4, false) {
			return
		}
	}
}

// lookAfter is how long the watcher sleeps before it looks again at a
// stack its process polled since ago (at, on the stack's clock): a grace
// period, doubling at each look that finds the stack polled since the
// last, up to maxLook (lookback); a look that finds the process away or
// the stack idle starts over. As the process's own Sleeper's looks back
// off from a thread that keeps polling: onloadd's look every grace
// period (1 ms) cost about 1,200 context switches and 30 ms of CPU a
// second, at a real-time priority, under pipelined redis.
func (w *watcher) lookAfter(at int64, since time.Duration) time.Duration {
	return w.looks.Next(at, since, w.grace, maxLook(w.grace))
}

// maxLook is the longest a watcher backs off from a process that keeps
// polling (lookAfter), and so how long a stall of that process may go
// unseen: four grace periods, and no more than lookback.Bound (the
// bound on the process's own Sleeper's looks too) unless the grace
// itself is longer. Within maxQuietSleep: the looks stay raw system
// calls.
func maxLook(grace time.Duration) time.Duration {
	return min(4*grace, max(grace, lookback.Bound))
}

// checkEvery is how often a watcher taking over a stack looks over its
// whole socket table (stack.TryCheck).
const checkEvery = 10 * time.Millisecond

// survive, deferred, turns a panic of the engine on the stack's image
// (one that broke its checks) into the end of the watch, logged: *ok is
// false then. The daemon goes on.
func (w *watcher) survive(d *Daemon, ok *bool) {
	if r := recover(); r != nil {
		msg := fmt.Sprintf("%v", r)
		w.err.Store(&msg)
		d.kickReaper()
		d.log.Error("stack watcher stopped: polling the stack's image failed", "stack", w.s.id, "panic", msg, "stack_trace", string(debug.Stack()))
		*ok = false
	}
}

// giveLate gives the kernel the segments of handed-over connections that
// a process kept (stack.GiveLate), under survive.
func (w *watcher) giveLate(d *Daemon) (ok bool) {
	defer w.survive(d, &ok)
	w.s.st.GiveLate()
	return true
}

// poll polls the stack for its process. A panic (an image that broke
// the engine's checks) ends the watch and is logged; the daemon goes on.
func (w *watcher) poll(d *Daemon) (ok bool) {
	defer w.survive(d, &ok)
	before := w.s.st.CorruptSeen()
	if polled, _, _ := w.s.st.TryPoll(); polled {
		w.polls.Add(1)
	}
	// The poll read what its frames and timers led to; the socket table
	// is looked over too, at most every checkEvery (it is the image's
	// largest part).
	if now := time.Now(); now.Sub(w.checked) >= checkEvery {
		if _, ok := w.s.st.TryCheck(); ok {
			w.checked = now
		}
	}
	if after := w.s.st.CorruptSeen(); after != before {
		msg := fmt.Sprintf("the engine found %d inconsistencies in the image while onloadd polled it", after-before)
		w.err.Store(&msg)
		d.kickReaper()
		d.log.Error("stack watcher stopped: its image is corrupt", "stack", w.s.id, "what", msg)
		return false
	}
	return true
}

// sleep waits for d (not at all if it is negative), and also for the
// AF_XDP socket's readiness if ready is set; it reports whether the
// watch was stopped. A wait of the timer alone up to maxQuietSleep (the
// grace periods) is a raw system call (sleepQuiet); the rest park the
// goroutine (park).
func (w *watcher) sleep(d time.Duration, ready bool) bool {
	if !ready && d <= maxQuietSleep {
		return w.sleepQuiet(d)
	}
	return w.park(d, ready)
}

// park is sleep on the Go runtime's network poller and timers, with the
// thread given up meanwhile. A goroutine that blocks in a system call
// wakes the runtime's monitor (sysmon) from its deep sleep, which then
// looks every 20 µs and more for 10 ms until it takes the processor
// back: 30 wake-ups of onloadd each time an idle stack's watcher slept,
// 60 a second (TestDaemonIdleCPU). Parked, the watcher's locked thread
// costs a wake-up or two of another at the end, which is why the short
// waits are raw system calls instead.
func (w *watcher) park(d time.Duration, ready bool) bool {
	if w.stopped.Load() {
		return true
	}
	if !ready {
		w.timer.Reset(max(d, 0))
		select {
		case <-w.stopC:
			w.timer.Stop()
			return true
		case <-w.timer.C:
			return false
		}
	}
	if err := w.ready.SetReadDeadline(time.Now().Add(max(d, 0))); err != nil {
		return w.stopped.Load()
	}
	if w.stopped.Load() {
		return true
	}
	rc, err := w.ready.SyscallConn()
	if err != nil {
		return w.stopped.Load()
	}
	// The AF_XDP socket is in the set only while the watcher waits:
	// there, every frame that came would wake the runtime's poller.
	xsk := w.s.nic.RxFD()
	var ctlErr error
	rc.Control(func(fd uintptr) {
		ctlErr = unix.EpollCtl(int(fd), unix.EPOLL_CTL_ADD, xsk, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(xsk)})
	})
	if ctlErr != nil {
		return w.park(d, false)
	}
	defer rc.Control(func(fd uintptr) { unix.EpollCtl(int(fd), unix.EPOLL_CTL_DEL, xsk, nil) })
	var evs [1]unix.EpollEvent
	rc.Read(func(fd uintptr) bool {
		// Ready once the set has an event: the socket's readiness is
		// level-triggered in it, so a frame that came before the wait
		// is seen.
		n, _ := unix.EpollWait(int(fd), evs[:], 0)
		return n > 0
	})
	return w.stopped.Load()
}

// readySet makes an epoll set, empty, as a file the Go runtime's
// network poller can wait on (park puts the AF_XDP socket in it).
func readySet() (*os.File, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return nil, os.NewSyscallError("set non-blocking", err)
	}
	return os.NewFile(uintptr(ep), "watcher readiness"), nil
}

// maxQuietSleep is the longest sleep a watcher takes without telling the
// Go runtime (sleepQuiet): the runtime's stop-the-world phases wait for
// it to end. It covers a watcher's longest look at a process that polls
// (maxLook at the default grace).
const maxQuietSleep = lookback.Bound

// sleepQuiet is sleep for the short waits of a watcher, d up to
// maxQuietSleep: the looks at a process that polls (one a grace period
// at first, 1,000 a second by default, then fewer: lookAfter), and the
// grace a woken watcher gives the process. It is a raw system call,
// which the Go runtime does not see.
// As an ordinary one, each wait's end woke the runtime's monitor thread
// from its deep sleep (exitsyscall's notewakeup), which slept 20 µs and
// went back to sleep: three wake-ups of onloadd's threads a look instead
// of one, and 70-120 ms of CPU a second under a loaded nginx on this
// machine's two CPUs, at a real-time priority (half that now); parked
// (park), the watcher's locked thread needed another to wake it: 15,700
// wake-ups a second (TestDaemonBusyWatch). The watcher keeps its
// processor while it sleeps, as if it ran: the monitor preempts it
// every 10 ms (the signal ends the ppoll with EINTR, and the sleep goes
// on), and startWatch gives the runtime a processor beyond the watchers'
// so that the daemon's other goroutines do not wait for one.
func (w *watcher) sleepQuiet(d time.Duration) bool {
	w.fds[0] = unix.PollFd{Fd: int32(w.stop), Events: unix.POLLIN}
	end := time.Now().Add(d)
	for d > 0 {
		ts := unix.NsecToTimespec(int64(d))
		_, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&w.fds[0])), 1,
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		switch e {
		case 0:
			return w.fds[0].Revents != 0
		case unix.EINTR:
			d = time.Until(end)
		default:
			// Not seen (ENOMEM could come): park rather than look
			// again at once, at a real-time priority.
			return w.park(time.Until(end), false)
		}
	}
	return w.stopped.Load()
}
