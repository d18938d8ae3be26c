package interrupts

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
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
}

// Policy tunes the spin / arm / sleep cycle.
type Policy struct {
	// Spin is how long a goroutine with nothing to do polls the stack
	// before it parks (0: park at once).
	Spin time.Duration
	// Watch is how often the Sleeper looks at a stack that other
	// goroutines are polling, in case they all stop without parking
	// (default: Spin, clamped to [1ms, 10ms]).
	Watch time.Duration
	// IRQSpin is how long the Sleeper polls after an interrupt that found
	// no frame yet: the steering program posts its wake event before the
	// kernel flushes the frame into the ring (default 100µs).
	IRQSpin time.Duration
}

// Bounds of Policy.Spin.
const MaxSpin = 10 * time.Second

func (p *Policy) setDefaults() error {
	if p.Spin < 0 || p.Spin > MaxSpin {
		return fmt.Errorf("interrupts: spin %v: must be from 0 to %v", p.Spin, MaxSpin)
	}
	if p.Watch == 0 {
		p.Watch = min(max(p.Spin, time.Millisecond), 10*time.Millisecond)
	}
	if p.IRQSpin == 0 {
		p.IRQSpin = 100 * time.Microsecond
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

	spinners atomic.Int32  // goroutines polling the stack now
	parked   atomic.Int32  // goroutines parked, relying on us
	events   atomic.Uint64 // parks and last-spinner exits: kick reasons
	state    atomic.Int32
	wakeAt   atomic.Int64 // when an armed Sleeper wakes for a timer (Clock)

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	once sync.Once

	stats struct {
		polls, arms, irqs, timeouts, kicks atomic.Uint64
	}
}

// Start runs a Sleeper for st with interrupt line src. Stop ends it.
func Start(st Stack, src Source, p Policy) (*Sleeper, error) {
	if err := p.setDefaults(); err != nil {
		return nil, err
	}
	s := &Sleeper{
		st: st, src: src, pol: p,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go s.run()
	return s, nil
}

// Policy is the policy in force, defaults filled in.
func (s *Sleeper) Policy() Policy { return s.pol }

// BeginSpin says a goroutine starts polling the stack (spinning on a
// socket that is not ready); EndSpin that it stopped.
func (s *Sleeper) BeginSpin() { s.spinners.Add(1) }

// EndSpin: see BeginSpin. The last spinner to stop while goroutines are
// parked hands the stack back to the Sleeper.
func (s *Sleeper) EndSpin() {
	if s.spinners.Add(-1) == 0 && s.parked.Load() > 0 {
		s.nudge()
	}
}

// Park says a goroutine is about to sleep until a poll wakes it; Unpark
// that it woke. A park makes sure the stack is attended: the Sleeper polls
// and arms if nobody else is polling.
func (s *Sleeper) Park() {
	s.parked.Add(1)
	s.nudge()
}

// Unpark: see Park.
func (s *Sleeper) Unpark() { s.parked.Add(-1) }

// nudge wakes a watching Sleeper. The event count closes the race with
// a Sleeper about to watch: it re-reads the count after announcing it
// watches, so either it sees this event or we see it watching.
func (s *Sleeper) nudge() {
	s.events.Add(1)
	if s.state.Load() == stWatching {
		select {
		case s.kick <- struct{}{}:
			s.stats.kicks.Add(1)
		default:
		}
	}
}

// TimerSet tells an armed Sleeper that a timer is due at `at` (on the
// stack's Clock): if that is before it planned to wake, it wakes now and
// sleeps again with the new deadline. Whoever arms a timer while the
// Sleeper sleeps calls it (a retransmission must fire while everyone
// sleeps).
func (s *Sleeper) TimerSet(at int64) {
	if s.state.Load() == stArmed && at < s.wakeAt.Load() {
		select {
		case s.kick <- struct{}{}:
			s.stats.kicks.Add(1)
		default:
		}
	}
}

// Armed reports that the stack's interrupt is armed: the Sleeper polled
// it just before and nothing has arrived since (the stack is up to date).
func (s *Sleeper) Armed() bool { return s.state.Load() == stArmed }

// Stats are the Sleeper's counters.
type Stats struct {
	Polls    uint64 // polls the Sleeper made
	Arms     uint64 // times it armed the interrupt and slept
	IRQs     uint64 // wake-ups by the interrupt
	Timeouts uint64 // wake-ups by a due timer (or a watch period)
	Kicks    uint64 // wake-ups by a parking goroutine
}

func (s *Sleeper) Stats() Stats {
	return Stats{
		Polls: s.stats.polls.Load(), Arms: s.stats.arms.Load(), IRQs: s.stats.irqs.Load(),
		Timeouts: s.stats.timeouts.Load(), Kicks: s.stats.kicks.Load(),
	}
}

// Stop ends the Sleeper and disarms the interrupt. The Source stays open.
func (s *Sleeper) Stop() {
	s.once.Do(func() {
		close(s.stop)
		<-s.done
		s.src.Disarm()
	})
}

func (s *Sleeper) run() {
	defer close(s.done)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	sleep := func(d time.Duration, irq <-chan struct{}) (irqFired, stop bool) {
		if d >= 0 {
			timer.Reset(d)
			defer timer.Stop()
		}
		select {
		case <-s.stop:
			return false, true
		case <-irq:
			s.stats.irqs.Add(1)
			return true, false
		case <-timer.C:
			s.stats.timeouts.Add(1)
		case <-s.kick:
		}
		return false, false
	}
	// watch waits for a nudge or the watch period, unless a nudge came
	// since ev0 was read.
	watch := func(ev0 uint64, d time.Duration) bool {
		s.state.Store(stWatching)
		if s.events.Load() != ev0 {
			return false
		}
		_, stop := sleep(d, nil)
		return stop
	}
	var irqSpinUntil time.Time // polling after an interrupt that found nothing yet
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		s.state.Store(stRunning)
		ev0 := s.events.Load()
		if s.spinners.Load() > 0 {
			// Somebody polls: no interrupts (seed 001).
			if watch(ev0, s.pol.Watch) {
				return
			}
			continue
		}
		polled, frames, woken := s.st.TryPoll()
		s.stats.polls.Add(1)
		switch {
		case !polled:
			// Another thread holds the lock: it polls before it lets go.
			// Look again shortly, in case it then leaves the stack alone.
			if watch(ev0, 50*time.Microsecond) {
				return
			}
			continue
		case frames > 0:
			irqSpinUntil = time.Time{}
			continue
		case woken > 0 || s.st.Contended():
			// The goroutines just woken, or the one waiting for the lock,
			// will be in the stack soon: do not arm (seed 001).
			if watch(ev0, s.pol.Watch) {
				return
			}
			continue
		case !irqSpinUntil.IsZero() && time.Now().Before(irqSpinUntil):
			continue // the frame the interrupt announced is on its way
		}
		// Arm, then look again: a frame that arrived before the flag was
		// set posted no event, but it is in the ring. Until the deadline
		// is known, any timer set wakes us (TimerSet).
		s.wakeAt.Store(math.MaxInt64)
		s.src.Arm()
		s.state.Store(stArmed)
		if s.spinners.Load() > 0 || !s.st.Idle() {
			s.src.Disarm()
			continue
		}
		d, ok := s.st.NextTimeout()
		if !ok {
			d = -1
		} else if d == 0 {
			s.src.Disarm()
			continue
		}
		if !irqSpinUntil.IsZero() {
			// An interrupt came and no frame followed within IRQSpin:
			// sleep in short stretches until one does.
			irqSpinUntil = time.Time{}
			if d < 0 || d > time.Millisecond {
				d = time.Millisecond
			}
		}
		if d >= 0 {
			s.wakeAt.Store(s.st.Clock() + int64(d))
		}
		s.stats.arms.Add(1)
		irq, stop := sleep(d, s.src.C())
		s.src.Disarm()
		if stop {
			return
		}
		if irq {
			irqSpinUntil = time.Now().Add(s.pol.IRQSpin)
		}
	}
}
