package interrupts

import (
	"fmt"
	"math"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// monoStack is a Stack with nothing to do, on CLOCK_MONOTONIC.
type monoStack struct{ clockStack }

func (monoStack) Clock() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// waiterFor makes a waiter of either kind for s.
func waiterFor(t *testing.T, thread bool) waiter {
	if !thread {
		return newChanWaiter(nil, nil)
	}
	w, err := newThreadWaiter(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestTimerSetsRace: two TimerSets on an armed Sleeper, the first for a
// later time, the second for an earlier one, where the first sets the
// timer last: the Sleeper must still wake at the earlier time. Without
// TimerSet's second look at wakeAt it slept to the later one, and every
// TimerSet meanwhile saw the earlier wake-up and set nothing.
func TestTimerSetsRace(t *testing.T) {
	for _, thread := range []bool{false, true} {
		t.Run(fmt.Sprintf("thread=%v", thread), func(t *testing.T) {
			st := &monoStack{}
			s := &Sleeper{st: st, w: waiterFor(t, thread)}
			defer s.w.close()
			s.wakeAt.Store(math.MaxInt64)
			s.state.Store(stArmed)

			now := st.Clock()
			early, late := now+int64(20*time.Millisecond), now+int64(2*time.Second)
			// The first TimerSet lowers wakeAt to late, then waits for
			// the second to finish before it sets the timer.
			cas, resume := make(chan struct{}), make(chan struct{})
			first := func() {
				afterTimerCAS.Store(nil)
				close(cas)
				<-resume
			}
			afterTimerCAS.Store(&first)
			defer afterTimerCAS.Store(nil)
			done := make(chan struct{})
			go func() {
				s.TimerSet(late)
				close(done)
			}()
			<-cas
			s.TimerSet(early)
			close(resume)
			<-done

			if why := s.w.wait(false); why != wokeTimer {
				t.Fatalf("woke for %d, not the timer", why)
			}
			if woke := st.Clock(); woke > early+int64(500*time.Millisecond) {
				t.Errorf("woke %v after the earlier timer, %v before the later", time.Duration(woke-early), time.Duration(late-woke))
			}
		})
	}
}

// TestThreadTimerAbsolute: the thread waiter's timer is set to an
// absolute time, so a caller held between reading the clock and setting
// the timer does not push the wake-up back by the time it was held.
func TestThreadTimerAbsolute(t *testing.T) {
	st := &monoStack{}
	w := waiterFor(t, true)
	defer w.close()
	now := st.Clock()
	at := now + int64(50*time.Millisecond)
	time.Sleep(100 * time.Millisecond) // held past at
	set := st.Clock()
	w.setTimer(at, now)
	if why := w.wait(false); why != wokeTimer {
		t.Fatalf("woke for %d, not the timer", why)
	}
	// Due already: at once, where a relative timer waits 50 ms more.
	if after := time.Duration(st.Clock() - set); after > 25*time.Millisecond {
		t.Errorf("woke %v after a timer due %v before it was set", after, time.Duration(set-at))
	}
}
