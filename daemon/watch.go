package daemon

import (
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/stack"
)

// DefaultTakeover is how long a stack with work waiting may go unpolled
// by its processes before onloadd polls it (Config.Takeover).
const DefaultTakeover = time.Millisecond

// maxIdleWait bounds one wait of the watcher of an idle stack, so that
// it looks at the stack's timers again now and then.
const maxIdleWait = time.Second

// watcher polls one stack when its processes do not (seed 001's lazy
// interrupts, with onloadd as the interrupt handler). While a process
// polls it stays out of the way: it reads two words of shared memory
// every grace period and makes no system call the process would see.
// When the process has not polled for the grace period and has work
// waiting (frames in the ring, a timer due), the watcher takes the lock
// by trylock and runs the same poll: ACKs, retransmissions, timers,
// handshakes, data into receive queues; the process's sleepers are woken
// through their slots (stack.JoinWakes). A lock held by a process that
// is stopped stays held: the watcher leaves the work in the lock's
// deferred flags and looks again. When the stack is idle (nothing
// waiting, nobody polling), it sleeps on the AF_XDP socket's readiness
// and the next timer, costing nothing until a frame comes.
type watcher struct {
	s     *dstack
	grace time.Duration
	stop  int // eventfd: written to end the watch
	done  chan struct{}

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
	w := &watcher{s: s, grace: d.cfg.Takeover, stop: efd, done: make(chan struct{})}
	s.watch = w
	go w.run(d)
	return nil
}

// end stops the watcher and waits for it.
func (w *watcher) end() {
	if w == nil {
		return
	}
	w.ended.Do(func() {
		var one = [8]byte{1}
		unix.Write(w.stop, one[:])
		<-w.done
		unix.Close(w.stop)
	})
}

func (w *watcher) run(d *Daemon) {
	defer close(w.done)
	st := w.s.st
	grace := int64(w.grace)
	for {
		now := int64(stack.Now())
		last := st.AppPolledAt()
		switch {
		case now-last < grace:
			// The process polls: look again when a grace period has
			// passed since its last poll.
			w.since.Store(0)
			if w.sleep(time.Duration(grace-(now-last)), false) {
				return
			}
			continue
		case !st.Waiting():
			// Nothing to do: wait for a frame or the next timer, then
			// give the process its grace period to take it.
			w.since.Store(0)
			wait := maxIdleWait
			if t := st.EarliestTimer(); t != math.MaxInt64 {
				wait = min(wait, max(time.Duration(t-now), 0))
			}
			if w.sleep(wait, true) || w.sleep(w.grace, false) {
				return
			}
			continue
		}
		// Work has waited a grace period and nobody polled: take over.
		w.since.CompareAndSwap(0, now)
		if !w.poll(d) {
			return
		}
		if w.sleep(w.grace/4, false) {
			return
		}
	}
}

// poll polls the stack for its process. A panic (an image that broke
// the engine's checks) ends the watch and is logged; the daemon goes on.
func (w *watcher) poll(d *Daemon) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			msg := fmt.Sprintf("%v", r)
			w.err.Store(&msg)
			d.log.Error("stack watcher stopped: polling the stack's image failed", "stack", w.s.id, "panic", msg, "stack_trace", string(debug.Stack()))
			ok = false
		}
	}()
	before := w.s.st.CorruptSeen()
	if polled, _, _ := w.s.st.TryPoll(); polled {
		w.polls.Add(1)
	}
	if after := w.s.st.CorruptSeen(); after != before {
		msg := fmt.Sprintf("the engine found %d inconsistencies in the image while onloadd polled it", after-before)
		w.err.Store(&msg)
		d.log.Error("stack watcher stopped: its image is corrupt", "stack", w.s.id, "what", msg)
		return false
	}
	return true
}

// sleep waits for d (not at all if it is negative), and also for the AF_XDP
// socket's readiness if ready is set; it reports whether the watch was
// stopped.
func (w *watcher) sleep(d time.Duration, ready bool) bool {
	fds := []unix.PollFd{{Fd: int32(w.stop), Events: unix.POLLIN}}
	if ready {
		fds = append(fds, unix.PollFd{Fd: int32(w.s.nic.FD()), Events: unix.POLLIN})
	}
	ts := unix.NsecToTimespec(int64(max(d, 0)))
	for {
		_, err := unix.Ppoll(fds, &ts, nil)
		if err == unix.EINTR {
			continue
		}
		return fds[0].Revents != 0
	}
}
