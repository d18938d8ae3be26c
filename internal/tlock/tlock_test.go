package tlock

import (
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// inMode runs f with the package in threads' mode or goroutines'.
func inMode(t *testing.T, threadsMode bool, f func(t *testing.T)) {
	threads.Store(threadsMode)
	defer threads.Store(false)
	f(t)
}

// TestMutualExclusion runs many OS threads (goroutines locked to them,
// as the shim's callers are) through Lock, TryLock and Unlock at once,
// in both modes: the count guarded by the mutex must come out exact.
func TestMutualExclusion(t *testing.T) {
	for _, mode := range []struct {
		name    string
		threads bool
	}{{"goroutines", false}, {"threads", true}} {
		t.Run(mode.name, func(t *testing.T) {
			inMode(t, mode.threads, func(t *testing.T) {
				const workers, rounds = 8, 20000
				var m Mutex
				var n int // plain: the mutex alone guards it
				var wg sync.WaitGroup
				for w := range workers {
					wg.Go(func() {
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
						for i := range rounds {
							if (w+i)%3 == 0 {
								for !m.TryLock() {
									runtime.Gosched()
								}
							} else {
								m.Lock()
							}
							v := n
							if i%64 == 0 {
								runtime.Gosched() // hold it a while: waiters sleep
							}
							n = v + 1
							m.Unlock()
						}
					})
				}
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(time.Minute):
					t.Fatal("workers still waiting after a minute: a wake-up was lost")
				}
				if n != workers*rounds {
					t.Fatalf("count %d, want %d: two holders at once", n, workers*rounds)
				}
			})
		})
	}
}

// TestThreadsSleepOnTheWord checks that, in threads' mode, a waiter for a
// mutex held long sleeps in a system call (the futex), its goroutine not
// parked in the runtime (which on a thread come in from C hands its
// processor away and back), and that the Unlock wakes it. In goroutines'
// mode the waiter parks as on a sync.Mutex.
func TestThreadsSleepOnTheWord(t *testing.T) {
	for _, mode := range []struct {
		name    string
		threads bool
		state   string // the waiter's goroutine's state in a traceback
	}{{"goroutines", false, "[sync.Mutex.Lock"}, {"threads", true, "[syscall"}} {
		t.Run(mode.name, func(t *testing.T) {
			inMode(t, mode.threads, func(t *testing.T) {
				var m Mutex
				m.Lock()
				got := make(chan struct{})
				go func() {
					runtime.LockOSThread()
					defer runtime.UnlockOSThread()
					waiterMarker(&m)
					close(got)
				}()
				deadline := time.Now().Add(5 * time.Second)
				var tb string
				for {
					buf := make([]byte, 1<<20)
					tb = waiterTraceback(string(buf[:runtime.Stack(buf, true)]))
					if strings.HasPrefix(tb, mode.state) || time.Now().After(deadline) {
						break
					}
					time.Sleep(time.Millisecond)
				}
				if !strings.HasPrefix(tb, mode.state) {
					m.Unlock()
					t.Fatalf("the waiter's goroutine is not in %s]:\n%s", mode.state, tb)
				}
				m.Unlock()
				select {
				case <-got:
				case <-time.After(5 * time.Second):
					t.Fatal("the waiter was not woken by Unlock")
				}
			})
		})
	}
}

//go:noinline
func waiterMarker(m *Mutex) {
	m.Lock()
	m.Unlock()
}

// waiterTraceback is the state and stack of the goroutine in
// waiterMarker, from an all-goroutines traceback ("" if none).
func waiterTraceback(all string) string {
	for g := range strings.SplitSeq(all, "\n\n") {
		if strings.Contains(g, "tlock.waiterMarker") {
			_, rest, _ := strings.Cut(g, " ")
			_, rest, _ = strings.Cut(rest, " ")
			return rest
		}
	}
	return ""
}
