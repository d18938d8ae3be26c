package interrupts

import (
	"math"
	"testing"
	"time"
)

// clockStack is a Stack with nothing to do and a clock the test sets.
type clockStack struct{ now int64 }

func (c *clockStack) TryPoll() (bool, int, int)          { return true, 0, 0 }
func (c *clockStack) Contended() bool                    { return false }
func (c *clockStack) Idle() bool                         { return true }
func (c *clockStack) NextTimeout() (time.Duration, bool) { return 0, false }
func (c *clockStack) Clock() int64                       { return c.now }
func (c *clockStack) PolledAt() int64                    { return c.now }
func (c *clockStack) ParkedDirect(int32)                 {}
func (c *clockStack) KickOwed() bool                     { return false }
func (c *clockStack) Elsewhere() (bool, int64)           { return false, 0 }

// TestTimerSetWakesOverdueSleeper: a TimerSet that finds the armed
// Sleeper past its wake-up by more than overdue kicks it (the runtime's
// timer it slept on did not fire: see wakeOverdue), where it used to see
// an earlier wake-up than its own and change nothing. A Sleeper about to
// wake, or waking later than asked, is left to its timer.
func TestTimerSetWakesOverdueSleeper(t *testing.T) {
	eachWaiter(t, testTimerSetWakesOverdue)
}

func testTimerSetWakesOverdue(t *testing.T, thread bool) {
	st := &clockStack{now: int64(time.Hour)}
	s := &Sleeper{st: st, w: waiterFor(t, thread)}
	defer s.w.close()
	// pending reports a kick not yet taken, and takes it.
	pending := func() bool {
		switch w := s.w.(type) {
		case *threadWaiter:
			return w.pending.Swap(false)
		case *chanWaiter:
			select {
			case <-w.kicks:
				return true
			default:
			}
		}
		return false
	}
	s.state.Store(stArmed)
	ms := int64(time.Millisecond)
	for _, c := range []struct {
		name   string
		wakeAt int64 // relative to now; MaxInt64: none
		kicked bool
	}{
		{"due a moment ago", -5 * ms, false},
		{"due later than asked", 50 * ms, false},
		{"asleep with no wake-up", math.MaxInt64, false},
		{"overdue", -20 * ms, true},
	} {
		at := c.wakeAt
		if at != math.MaxInt64 {
			at += st.now
		}
		s.wakeAt.Store(at)
		pending()
		before := s.Stats().Overdue
		s.TimerSet(st.now + ms)
		kicked := pending()
		if kicked != c.kicked || (s.Stats().Overdue-before == 1) != c.kicked {
			t.Errorf("%s: kicked %v (Overdue +%d), want %v", c.name, kicked, s.Stats().Overdue-before, c.kicked)
		}
	}
}

// TestWokeForUnknownTime: a Sleeper woken for a timer whose time the
// stack did not know (TimerSet(0), from stack.EarliestTimer) is not
// counted late: it had no time to be late past. It was counted as late
// as the clock's whole reading (MaxLate 16h28m in a shim's exit log).
func TestWokeForUnknownTime(t *testing.T) {
	eachWaiter(t, func(t *testing.T, thread bool) {
		st := &clockStack{now: int64(time.Hour)}
		s := &Sleeper{st: st, w: waiterFor(t, thread)}
		defer s.w.close()
		s.state.Store(stArmed)
		s.wakeAt.Store(math.MaxInt64)
		s.TimerSet(0)
		st.now += int64(100 * time.Microsecond)
		s.woke()
		if late, n := s.Stats().MaxLate, s.Stats().Late; late != 0 || n != 0 {
			t.Errorf("woken for TimerSet(0) 100µs after it: MaxLate %v, Late %d; want none", late, n)
		}
	})
}
