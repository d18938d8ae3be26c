package interrupts

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/monotime"
)

// monoStack is a Stack with nothing to do, on CLOCK_MONOTONIC.
type monoStack struct{ clockStack }

func (monoStack) Clock() int64 { return monotime.Now() }

// eachWaiter runs test with the goroutine's waiter (thread=false) and
// the thread's (thread=true).
func eachWaiter(t *testing.T, test func(t *testing.T, thread bool)) {
	for _, thread := range []bool{false, true} {
		t.Run(fmt.Sprintf("thread=%v", thread), func(t *testing.T) { test(t, thread) })
	}
}

// waiterFor makes a waiter of either kind, with no interrupt line.
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
	eachWaiter(t, func(t *testing.T, thread bool) {
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

// TestThreadWaiterOutOfFiles: a thread waiter that cannot get one of its
// descriptors says which, and leaves none of the others open.
func TestThreadWaiterOutOfFiles(t *testing.T) {
	open := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skipf("cannot count open files: %v", err)
		}
		return len(ents)
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	mem := memLine{make(chan struct{})} // a channel line: the bridge's eventfd is the fourth
	failed := 0
	for spare := 0; spare < 5; spare++ {
		before := open()
		// The lowest free numbers, which new descriptors take in turn: a
		// limit of free[spare] leaves spare of them.
		var free [5]int
		for i := range free {
			fd, err := unix.Dup(0)
			if err != nil {
				t.Fatal(err)
			}
			free[i] = fd
		}
		for _, fd := range free {
			unix.Close(fd)
		}
		low := lim
		low.Cur = uint64(free[spare])
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
			t.Fatal(err)
		}
		w, err := newThreadWaiter(mem, nil)
		unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
		t.Logf("%d spare: %v", spare, err)
		if err == nil {
			w.close()
		} else {
			failed++
			if !strings.Contains(err.Error(), "interrupts: ") {
				t.Errorf("with %d spare descriptors: %v: does not say where", spare, err)
			}
		}
		if after := open(); after != before {
			t.Errorf("with %d spare descriptors (%v): %d files open after, %d before", spare, err, after, before)
		}
	}
	if failed < 4 {
		t.Errorf("only %d of 5 limits failed: the test did not reach every descriptor", failed)
	}
}

// memLine is a Source that signals on a channel alone.
type memLine struct{ c chan struct{} }

func (m memLine) Arm()               {}
func (m memLine) Disarm()            {}
func (m memLine) C() <-chan struct{} { return m.c }
func (m memLine) Close() error       { return nil }
