package interrupts

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdp-onload/onload/internal/lookback"
)

// Stack is what the Sleeper drives; *stack.Stack satisfies it.
type Stack interface {
	// TryPoll polls the stack unless another thread holds its lock (who
	// then polls before letting go), and says what the poll did.
	TryPoll() (polled bool, frames, woken int)
	// Contended reports that a thread holds the stack lock or waits for it.
	Contended() bool
	// Idle reports, cheaply, that a poll would find nothing to do.
	Idle() bool
	// NextTimeout is how long until the stack's earliest timer is due.
	NextTimeout() (d time.Duration, ok bool)
	// Clock is the clock timer deadlines are on, in nanoseconds.
	Clock() int64
	// PolledAt is when the stack was last polled (on the Clock).
	PolledAt() int64
	// ParkedDirect adds d to the count of this process's threads blocked
	// on the interrupt themselves (ParkDirect), for the other processes
	// sharing the stack.
	ParkedDirect(d int32)
	// KickOwed reports that sends left frames (or segments) waiting for
	// their sender's next wait, which a poll sends (SendMore, SendCorked).
	KickOwed() bool
	// Elsewhere says how other processes sharing the stack attend its
	// frames: a thread of one is blocked on the interrupt itself, and
	// when one last polled (0: none, or this process).
	Elsewhere() (parked bool, polledAt int64)
}

// Policy tunes the spin / arm / sleep cycle.
type Policy struct {
	// Spin is how long a goroutine with nothing to do polls the stack
	// before it parks (0: park at once). Spinners goroutines at a time
	// spin for the whole stack (TrySpin); the others park at once.
	Spin time.Duration
	// Spinners is how many may spin at once (default 1). One serves
	// every socket of the stack, and leaves the processors to the
	// goroutines that have work; threads of their own on processors of
	// their own (the shim's) each do better spinning, as a frame for
	// another thread's socket then wakes nobody.
	Spinners int
	// Watch is how often the Sleeper looks at a stack that goroutines
	// are polling, in case they all stop without parking (a spinner whose
	// socket became ready and that does not come back, say): the longest
	// a parked goroutine can wait for a frame that has arrived (default
	// 100µs).
	Watch time.Duration
	// Thread runs the Sleeper on an OS thread of its own, blocked in the
	// kernel on a timerfd, an eventfd and the interrupt line, instead of
	// in the Go scheduler on a channel and a runtime timer
	// (threadWaiter). For a process whose threads come into Go from C
	// (the LD_PRELOAD shim's), where the runtime's timers and wake-ups
	// come late more often (threadWaiter). It costs the process one
	// thread a stack. The Stack's Clock must be CLOCK_MONOTONIC, in
	// nanoseconds, as the engine's is.
	Thread bool
}

// Bounds of Policy.Spin and Policy.Watch.
const (
	MaxSpin     = 10 * time.Second
	MaxSpinners = 1024
	MinWatch    = 10 * time.Microsecond
	MaxWatch    = 10 * time.Millisecond
)

func (p *Policy) setDefaults() error {
	if p.Spin < 0 || p.Spin > MaxSpin {
		return fmt.Errorf("interrupts: spin %v: must be from 0 to %v", p.Spin, MaxSpin)
	}
	if p.Spinners == 0 {
		p.Spinners = 1
	}
	if p.Spinners < 1 || p.Spinners > MaxSpinners {
		return fmt.Errorf("interrupts: spinners %d: must be from 1 to %d", p.Spinners, MaxSpinners)
	}
	if p.Watch == 0 {
		p.Watch = 100 * time.Microsecond
	}
	if p.Watch < MinWatch || p.Watch > MaxWatch {
		return fmt.Errorf("interrupts: watch %v: must be from %v to %v", p.Watch, MinWatch, MaxWatch)
	}
	return nil
}

// Sleeper states.
const (
	stRunning  = iota // polling, deciding
	stWatching        // others poll the stack; waiting for a kick or Watch
	stArmed           // interrupt armed, asleep
)

// Sleeper keeps a stack progressing while the goroutines using it sleep:
// the interrupt service routine of the lazy scheme, as a goroutine.
type Sleeper struct {
	st  Stack
	src Source
	pol Policy

	spinning atomic.Int32 // the spin slots held (of Policy.Spinners)
	parked   atomic.Int32 // goroutines parked, relying on us
	// threads is how many threads of a program under the shim use the
	// stack (SetThreads; 0: not told, as in a Go program).
	threads atomic.Int32
	// direct counts the threads blocked in the kernel on the stack's
	// interrupt themselves (ParkDirect); directSeen is set at the first.
	direct     atomic.Int32
	directSeen atomic.Bool
	// deep is set while the Sleeper sleeps for the timers alone with no
	// bound, the stack idle and a thread blocked on the interrupt: the
	// last UnparkDirect wakes it (a kick).
	deep atomic.Bool
	// timersOnly is set while the Sleeper sleeps for the timers alone,
	// the frames left to threads (threadsAttend): a park wakes it
	// (nudge), since the parked thread leaves them to it.
	timersOnly atomic.Bool
	// looks paces the Sleeper's looks at a stack a thread keeps polling
	// (threadsAttend; the Sleeper's goroutine alone touches it).
	looks  lookback.Backoff
	events atomic.Uint64 // parks and last-spinner exits: kick reasons
	state  atomic.Int32
	wakeAt atomic.Int64 // when an armed Sleeper wakes for a timer (Clock)
	// w is how it sleeps, and its one timer: watch periods, timer
	// deadlines.
	w waiter

	stop chan struct{}
	done chan struct{}
	once sync.Once

	stats struct {
		polls, arms, irqs, timeouts, kicks, timerSets, timersOnly, overdue atomic.Uint64
		owed, late                                                         atomic.Uint64
		maxLate                                                            atomic.Int64
	}
}

// Start runs a Sleeper for st with interrupt line src. Stop ends it.
func Start(st Stack, src Source, p Policy) (*Sleeper, error) {
	if err := p.setDefaults(); err != nil {
		return nil, err
	}
	s := &Sleeper{st: st, src: src, pol: p, stop: make(chan struct{}), done: make(chan struct{})}
	if p.Thread {
		w, err := newThreadWaiter(src, s.stop)
		if err != nil {
			return nil, err
		}
		s.w = w
	} else {
		s.w = newChanWaiter(src, s.stop)
	}
	go s.run()
	return s, nil
}

// Policy is the policy in force, defaults filled in.
func (s *Sleeper) Policy() Policy { return s.pol }

// TrySpin claims one of the stack's spin slots (Policy.Spinners) for a
// goroutine about to poll the stack while it waits: false if they are
// all taken, by spinners whose polls wake this one's socket too (it
// should park at once). A poll serves every socket of the stack, and one
// spinner per stack leaves the processor to the goroutines that have
// work.
func (s *Sleeper) TrySpin() bool {
	for {
		n := s.spinning.Load()
		if n >= int32(s.pol.Spinners) {
			return false
		}
		if s.spinning.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// EndSpin gives a spin slot back. If the spinner now parks, its Park
// hands the stack to the Sleeper; if it goes back to its work, the
// Sleeper's watch finds the stack unattended within Policy.Watch.
func (s *Sleeper) EndSpin() {
	for {
		n := s.spinning.Load()
		if n <= 0 || s.spinning.CompareAndSwap(n, n-1) {
			return
		}
	}
}

// Spinning reports that a goroutine holds a spin slot.
func (s *Sleeper) Spinning() bool { return s.spinning.Load() != 0 }

// Park says a goroutine is about to sleep until a poll wakes it; Unpark
// that it woke. Unless the stack is attended (a goroutine spins, or
// attended says others will be in the stack soon: goroutines its polls
// woke that have not run yet), a park makes sure the Sleeper attends it:
// it polls and arms. (Park and EndSpin each write their word before
// reading the other's, so one of them sees the other: a parked goroutine
// is never left with neither a spinner nor a nudged Sleeper.)
func (s *Sleeper) Park(attended bool) {
	s.parked.Add(1)
	if !attended && s.spinning.Load() == 0 {
		s.nudge()
	}
}

// Unpark: see Park.
func (s *Sleeper) Unpark() { s.parked.Add(-1) }

// ParkDirect says a thread is about to block in the kernel on the
// stack's interrupt itself (the AF_XDP socket's readiness, beside its
// own file descriptors) and to poll the stack when it fires: a thread of
// the LD_PRELOAD shim, which waits outside Go. UnparkDirect when it
// wakes. The kernel then wakes that thread at a frame's arrival, as it
// wakes a thread blocked on a kernel socket, where the Sleeper's wake-up
// takes the Go runtime's poller, the Sleeper's goroutine and an eventfd
// (three threads' wake-ups, each a context switch). While a thread
// blocks so, or has polled within DirectGrace, the Sleeper leaves the
// interrupt to the threads and attends only the timers; no nudge is
// needed (a frame's arrival wakes the blocked thread at once, being
// level-triggered, even one that came before it blocked).
func (s *Sleeper) ParkDirect() {
	if !s.directSeen.Load() {
		s.directSeen.Store(true)
	}
	s.direct.Add(1)
	s.st.ParkedDirect(1)
}

// UnparkDirect: see ParkDirect. The last thread to leave wakes a
// Sleeper that sleeps for the timers alone on an idle stack, which
// watches it again from here (ParkDirect's grace counts from the
// thread's last poll).
func (s *Sleeper) UnparkDirect() {
	s.st.ParkedDirect(-1)
	if s.direct.Add(-1) == 0 && s.deep.Load() {
		s.wake()
	}
}

// beforeTimersOnly, in tests, runs as the Sleeper is about to sleep for
// the timers alone, before it says it sleeps (TestSleeperSendMoreRacesArm).
var beforeTimersOnly atomic.Pointer[func()]

// DirectGrace is how long after its last poll of the stack a thread that
// blocks on the interrupt itself (ParkDirect) is trusted to come back to
// it: until then the Sleeper leaves the stack's frames to it. A thread
// that stays away longer (busy, or blocked on something else) leaves the
// stack to the Sleeper, which polls and arms the interrupt as usual at
// its next look: frames wait at most this long, or MaxLook after a
// thread that kept polling (threadsAttend). It is onloadd's takeover
// grace too.
const DirectGrace = time.Millisecond

// elsewhereBound is how long a Sleeper that leaves the frames to a
// thread of another process blocked on the interrupt (Stack.Elsewhere)
// sleeps at most, when no timer is due sooner, before it looks again.
// That thread's own Sleeper attends the stack if the thread goes away.
const elsewhereBound = 10 * time.Millisecond

// threadsAttend reports whether threads that block on the interrupt
// themselves, this process's or another's, attend the stack's frames
// now, and for how long at most
// the Sleeper may leave them to it before it looks again (-1: until
// UnparkDirect; the Sleeper then sleeps deep). polling says a thread of
// ours that polled lately attends them, and its timers too: its polls
// run them; the Sleeper then looks again less and less often while the
// thread keeps polling (s.looks: from DirectGrace up to MaxLook; any
// other answer starts the pace over, in run). Under pipelined redis,
// looking every grace period woke the Sleeper's thread 1,100 times a
// second, and each wake-up preempted redis-server's thread on its
// processor: the Sleeper's thread and the runtime's took 4-5% of the
// main thread's CPU. idle says nobody polled the stack while the Sleeper
// last slept for the timers alone.
func (s *Sleeper) threadsAttend(idle bool) (attend bool, d time.Duration, polling bool) {
	if s.spinning.Load() != 0 {
		return false, 0, false
	}
	if s.directSeen.Load() {
		if s.direct.Load() > 0 {
			if idle {
				// A thread blocks and nothing happens: no need to look
				// every grace period (an idle process costs nothing)
				// while it blocks; its UnparkDirect wakes us.
				s.deep.Store(true)
				if s.direct.Load() > 0 {
					return true, -1, false
				}
				s.deep.Store(false)
			}
			return true, DirectGrace, false
		}
		// A thread that polled lately comes back to the stack, unless
		// every thread is parked (blocked without the interrupt, as a
		// thread whose epoll set holds a listener alone): redis
		// between connections parked so just after its last poll, and
		// each new connection's SYN waited out the grace (a client
		// that connected every 0.3 ms was answered in 0.76 ms at the
		// median, against the kernel's 0.05).
		at := s.st.PolledAt()
		if since := time.Duration(s.st.Clock() - at); since < DirectGrace && !s.allParked() {
			return true, s.looks.Next(at, since, DirectGrace, MaxLook), true
		}
	}
	// None of our threads attends. On a stack shared with other
	// processes, a frame wakes a thread of theirs blocked on the interrupt
	// (or one that polled lately comes back to it, or its process's
	// Sleeper attends it within the grace): ours need not wake for it
	// too, and then wake the thread that owns the socket. An nginx
	// worker without a connection woke so for every frame of the other
	// worker's.
	parked, at := s.st.Elsewhere()
	if parked {
		return true, elsewhereBound, false
	}
	if at != 0 {
		if since := time.Duration(s.st.Clock() - at); since < DirectGrace {
			return true, DirectGrace - since, false
		}
	}
	return false, 0, false
}

// MaxLook bounds the backoff of the Sleeper's looks at a thread that
// keeps polling (threadsAttend), and so how long frames wait when that
// thread goes away (busy outside the stack) without blocking. It bounds
// the wait of frames a corked send left for its sender's next wait too
// (KickOwed), should the sender not come back.
const MaxLook = lookback.Bound

// SetThreads says how many threads use the stack: those of a program
// under the shim (each counted at its first call into the core).
func (s *Sleeper) SetThreads(n int) { s.threads.Store(int32(n)) }

// allParked reports that each of the threads SetThreads counted is
// parked (Park), none of them coming back to the stack by itself.
func (s *Sleeper) allParked() bool {
	n := s.threads.Load()
	return n > 0 && s.parked.Load() >= n
}

// nudge wakes a watching Sleeper. The event count closes the race with
// a Sleeper about to watch: it re-reads the count after announcing it
// watches, so either it sees this event or we see it watching.
func (s *Sleeper) nudge() {
	s.events.Add(1)
	if s.state.Load() == stWatching || s.timersOnly.Load() {
		s.wake()
	}
}

// wake kicks the Sleeper out of its wait, unless a kick is pending.
func (s *Sleeper) wake() {
	if s.w.kick() {
		s.stats.kicks.Add(1)
	}
}

// TimerSet tells an armed Sleeper that a timer is due at `at` (on the
// stack's Clock): if that is before it planned to wake, its wake-up moves
// to `at`. Whoever arms a timer while the Sleeper sleeps calls it (a
// retransmission must fire while everyone sleeps). The Sleeper is not
// woken for it: its timer is reset, from here, so that a Write that arms
// a retransmission timer costs no goroutine switch. An `at` of 0 is a
// timer whose time the stack does not know without a scan of its wheel
// (stack.EarliestTimer): the Sleeper wakes at once, and every TimerSet
// until it has woken kicks it (see wakeOverdue).
func (s *Sleeper) TimerSet(at int64) {
	if s.state.Load() != stArmed {
		return
	}
	for {
		cur := s.wakeAt.Load()
		if at >= cur {
			// The last poll stands for now: a clock read here, on every
			// socket call's way out, took 5.7% of redis-server's samples
			// under the shim (this PVM guest's clock is dear), and under
			// load, when a Sleeper can be overdue, threads poll all the
			// time.
			if cur != math.MaxInt64 && cur < s.st.PolledAt()-int64(overdue) {
				s.wakeOverdue()
			}
			return
		}
		if s.wakeAt.CompareAndSwap(cur, at) {
			break
		}
	}
	s.stats.timerSets.Add(1)
	if h := afterTimerCAS.Load(); h != nil {
		(*h)()
	}
	s.resetTimer(at)
	if w := s.wakeAt.Load(); w < at {
		// Another TimerSet lowered the wake-up further meanwhile, and
		// may have set the timer before us: set it again, or the
		// Sleeper sleeps to our later time while every TimerSet since
		// sees the earlier one and sets nothing. A send's 1 ms bound
		// set under a retransmission timer's was lost so, the
		// Sleeper overdue by 10 ms and more thousands of times a minute
		// in the conformance program's signal tests; with a timer
		// seconds away, that is the stall wakeOverdue was made for.
		s.resetTimer(w)
	}
}

// afterTimerCAS, in tests, runs in TimerSet between lowering wakeAt and
// setting the timer (TestTimerSetsRace).
var afterTimerCAS atomic.Pointer[func()]

// overdue is how late past its wake-up an armed Sleeper must be for
// TimerSet to wake it another way (wakeOverdue).
const overdue = 10 * time.Millisecond

// wakeOverdue wakes a Sleeper that should have woken for its timer
// overdue ago and has not. Under the LD_PRELOAD shim the Sleeper slept
// on 5 to 47 s past a held kick's bound (its frames waited as long),
// and every TimerSet since saw an earlier wake-up than its own and
// changed nothing: two TimerSets had set the timer in the opposite
// order to the one they lowered wakeAt in (see TimerSet's second look,
// which ends it). This kick stays as a bound on any other way to miss a
// wake-up. Overdue counts them: 900 to 430,000 a minute in a loop of
// the conformance program's signal tests before the second look; since,
// none in 8 runs of 9, and 6,118 in one (the goroutine waiter's, under
// two CPU hogs, the latest wake-up 12 ms past its time).
func (s *Sleeper) wakeOverdue() {
	s.stats.overdue.Add(1)
	s.wake()
}

// resetTimer sets the Sleeper's timer to fire at `at` (on the Clock), or
// stops it for math.MaxInt64. Safe from any goroutine or thread.
func (s *Sleeper) resetTimer(at int64) {
	if at == math.MaxInt64 {
		s.w.stopTimer()
		return
	}
	s.w.setTimer(at, s.st.Clock())
}

// sleepUntil sets the timer of a Sleeper about to sleep in state
// stArmed (wakeAt set to math.MaxInt64 before the state, so that any
// timer armed since counts): to the stack's next timer, d from now as
// NextTimeout gave it (ok false: none), or within bound if that is not
// negative, unless a TimerSet meanwhile made it earlier. The timer is
// set, and set again if a TimerSet lowers it while we set it (both reset
// the timer, in either order).
func (s *Sleeper) sleepUntil(d time.Duration, ok bool, bound time.Duration) {
	if !ok {
		d = -1
	}
	if bound >= 0 && (d < 0 || bound < d) {
		d = bound
	}
	deadline := int64(math.MaxInt64)
	if d >= 0 {
		deadline = s.st.Clock() + int64(d)
	}
	for {
		cur := s.wakeAt.Load()
		if cur <= deadline {
			deadline = cur
			break
		}
		if s.wakeAt.CompareAndSwap(cur, deadline) {
			break
		}
	}
	s.resetTimer(deadline)
	if w := s.wakeAt.Load(); w < deadline {
		s.resetTimer(w)
	}
}

// Armed reports that the stack's interrupt is armed: the Sleeper polled
// it just before and nothing has arrived since (the stack is up to date).
func (s *Sleeper) Armed() bool { return s.state.Load() == stArmed }

// Line describes the interrupt line and the Sleeper's state, for a dump:
// whether it is armed, how long since the stack was last polled, and
// what the line says of itself (an AF_XDP stack's: whether its readiness
// is enabled in the kernel, whether the kernel holds an event not yet
// taken, and whether a signal waits to be taken). Frames in the RX ring
// long after the last poll, with the line armed and enabled and neither
// an event nor a signal waiting, are a lost interrupt.
func (s *Sleeper) Line() string {
	d := fmt.Sprintf("armed=%v spinning=%v polled %v ago", s.Armed(), s.Spinning(),
		time.Duration(s.st.Clock()-s.st.PolledAt()).Round(time.Microsecond))
	if st, ok := s.src.(interface{ State() string }); ok {
		d += " line " + st.State()
	}
	return d
}

// poll polls the stack, counted, and counts a kick found owed (Owed).
func (s *Sleeper) poll() (polled bool, frames, woken int) {
	if s.st.KickOwed() {
		s.stats.owed.Add(1)
	}
	s.stats.polls.Add(1)
	return s.st.TryPoll()
}

// Stats are the Sleeper's counters.
type Stats struct {
	Polls     uint64 // polls the Sleeper made
	Arms      uint64 // times it armed the interrupt and slept
	IRQs      uint64 // wake-ups by the interrupt
	Timeouts  uint64 // wake-ups by a due timer (or a watch period)
	Kicks     uint64 // wake-ups by a parking goroutine
	TimerSets uint64 // wake-ups moved earlier by a timer armed meanwhile
	// TimersOnly counts the sleeps that left the interrupt to threads
	// blocked on it themselves (ParkDirect).
	TimersOnly uint64
	// Overdue counts the Sleepers found asleep overdue past their wake-up
	// by a TimerSet, and woken (see overdue).
	Overdue uint64
	// Owed counts the polls that found frames a send had left for its
	// sender's next wait (KickOwed), and sent them: the sender had not
	// come back to a wait, nor ended, by then. Woken by nothing else, the
	// Sleeper comes at the bound the send set (sockets.heldKickWait).
	Owed uint64
	// Late counts the wake-ups of an armed Sleeper, by whatever cause,
	// that came more than lateBound past the stack timer (or the bound) it
	// slept for; MaxLate is the latest of all.
	Late    uint64
	MaxLate time.Duration
}

// lateBound: see Stats.Late.
const lateBound = time.Millisecond

// woke records how late past its deadline an armed Sleeper woke.
func (s *Sleeper) woke() {
	at := s.wakeAt.Load()
	if at == math.MaxInt64 || at <= 0 {
		// No wake-up planned, or "at once" for a timer whose time was
		// not known (TimerSet(0)): no time to be late past. Counted, it
		// read as the clock's whole reading (MaxLate 16h28m in a shim's
		// exit log).
		return
	}
	late := s.st.Clock() - at
	if late <= 0 {
		return
	}
	if late > int64(lateBound) {
		s.stats.late.Add(1)
	}
	for {
		m := s.stats.maxLate.Load()
		if late <= m || s.stats.maxLate.CompareAndSwap(m, late) {
			return
		}
	}
}

func (s *Sleeper) Stats() Stats {
	return Stats{
		Polls: s.stats.polls.Load(), Arms: s.stats.arms.Load(), IRQs: s.stats.irqs.Load(),
		Timeouts: s.stats.timeouts.Load(), Kicks: s.stats.kicks.Load(), TimerSets: s.stats.timerSets.Load(),
		TimersOnly: s.stats.timersOnly.Load(), Overdue: s.stats.overdue.Load(), Owed: s.stats.owed.Load(),
		Late: s.stats.late.Load(), MaxLate: time.Duration(s.stats.maxLate.Load()),
	}
}

// Stop ends the Sleeper and disarms the interrupt. The Source stays open.
func (s *Sleeper) Stop() {
	s.once.Do(func() {
		close(s.stop)
		s.w.kick()
		<-s.done
		s.w.close()
		s.src.Disarm()
	})
}

func (s *Sleeper) run() {
	defer close(s.done)
	if s.pol.Thread {
		// The thread ends with the goroutine.
		runtime.LockOSThread()
	}
	// wait sleeps until the timer, the interrupt (irq), a kick or Stop.
	// Every wait sets or stops the timer first (sleep, sleepUntil), so a
	// timer left from an earlier one does not matter.
	wait := func(irq bool) (irqFired, stop bool) {
		why := s.w.wait(irq)
		if why != wokeStop && s.state.Load() == stArmed {
			s.woke()
		}
		switch why {
		case wokeStop:
			return false, true
		case wokeIRQ:
			s.stats.irqs.Add(1)
			return true, false
		case wokeTimer:
			s.stats.timeouts.Add(1)
		}
		return false, false
	}
	sleep := func(d time.Duration) (stop bool) {
		now := s.st.Clock()
		s.w.setTimer(now+int64(d), now)
		_, stop = wait(false)
		return stop
	}
	// watch waits for a nudge or the watch period, unless a nudge came
	// since ev0 was read.
	watch := func(ev0 uint64, d time.Duration) bool {
		s.state.Store(stWatching)
		if s.events.Load() != ev0 {
			return false
		}
		return sleep(d)
	}
	// directIdle: nobody polled the stack while the Sleeper last slept for
	// the timers alone (threadsAttend).
	directIdle := false
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		s.state.Store(stRunning)
		ev0 := s.events.Load()
		ok, d, polling := s.threadsAttend(directIdle)
		if polling {
			// A thread of ours keeps polling the stack: its polls take
			// the frames in, run the timers and send what its corked
			// sends left. Look again at d, or at a park's nudge. Waking
			// for each timer instead (the stack's retransmission timers
			// come due every few milliseconds on each busy connection,
			// re-armed lazily), and being set earlier by the thread's
			// sends (TimerSet), woke the Sleeper 600 times a second
			// under pipelined redis, and cost redis-server's thread a
			// system call at every TimerSet. A timer that comes due
			// while the thread is away, or blocked on the interrupt,
			// waits for the next look: up to MaxLook.
			directIdle = false
			if watch(ev0, d) {
				return
			}
			continue
		}
		s.looks.Reset()
		if ok {
			// Threads block on the interrupt themselves: the timers only.
			nt, due := s.st.NextTimeout()
			if due && nt == 0 {
				s.deep.Store(false)
				s.poll()
				continue
			}
			polled := s.st.PolledAt()
			if h := beforeTimersOnly.Load(); h != nil {
				(*h)()
			}
			s.wakeAt.Store(math.MaxInt64)
			s.state.Store(stArmed)
			if s.st.KickOwed() && (d < 0 || d > MaxLook) {
				// A send that left its frames for its sender's next wait
				// sets our timer only if it finds us armed (TimerSet, from
				// sockets.Desc.SendMore): one that looked just before the
				// store above set none, and asleep without a bound we
				// would have left its frames until the blocked thread
				// next came back (5s in the shim's conformance program,
				// whose sender thread then exited). It set the owed flag
				// before it looked, and we look after the store: one of
				// the two sees the other. Wake within the bound it would
				// have set.
				d = MaxLook
			}
			// A park (nudge) since ev0 was read may leave the frames to
			// us: look again rather than sleep. One after the store
			// below wakes us.
			s.timersOnly.Store(true)
			if s.events.Load() != ev0 {
				s.timersOnly.Store(false)
				s.deep.Store(false)
				continue
			}
			s.sleepUntil(nt, due, d)
			s.stats.timersOnly.Add(1)
			_, stop := wait(false)
			s.timersOnly.Store(false)
			s.deep.Store(false)
			if stop {
				return
			}
			if s.st.KickOwed() {
				// A send's frames still wait for their sender's next wait
				// (TimerSet's bound on it has come, or a timer): send
				// them, as the poll of a Sleeper that arms does.
				s.poll()
			}
			directIdle = s.st.PolledAt() == polled
			continue
		}
		directIdle = false
		if s.spinning.Load() != 0 {
			// Somebody polls: no interrupts (seed 001). But a spinner
			// yields the processor after every poll, and one that waits
			// long for it to come back (a busy scheduler serves the
			// global run queue one goroutine in 61) polls nothing
			// meanwhile: if nobody has polled for Watch, poll for it.
			if since := time.Duration(s.st.Clock() - s.st.PolledAt()); since < s.pol.Watch {
				if watch(ev0, s.pol.Watch-since) {
					return
				}
				continue
			}
			if _, frames, _ := s.poll(); frames > 0 {
				continue
			}
			if watch(ev0, s.pol.Watch) {
				return
			}
			continue
		}
		polled, frames, woken := s.poll()
		switch {
		case !polled:
			// Another thread holds the lock: it polls before it lets go.
			// Look again shortly, in case it then leaves the stack alone.
			if watch(ev0, min(s.pol.Watch, 50*time.Microsecond)) {
				return
			}
			continue
		case frames > 0:
			continue
		case woken > 0 || s.st.Contended():
			// The goroutines just woken, or the one waiting for the lock,
			// will be in the stack soon: do not arm (seed 001).
			if watch(ev0, s.pol.Watch) {
				return
			}
			continue
		}
		if !s.st.Idle() {
			// Work came in since the poll (or a kick is owed): poll again
			// before arming anything.
			continue
		}
		// Arm, then look again: a frame that arrived before the interrupt
		// was armed is in the ring (the Source's arm sees it too). Until
		// the deadline is known, any timer set wakes us (TimerSet).
		s.wakeAt.Store(math.MaxInt64)
		s.src.Arm()
		s.state.Store(stArmed)
		if s.spinning.Load() != 0 || !s.st.Idle() {
			s.src.Disarm()
			continue
		}
		nt, due := s.st.NextTimeout()
		if due && nt == 0 {
			s.src.Disarm()
			continue
		}
		s.sleepUntil(nt, due, -1)
		s.stats.arms.Add(1)
		_, stop := wait(true)
		s.src.Disarm()
		if stop {
			return
		}
	}
}
