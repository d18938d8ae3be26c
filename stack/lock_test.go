package stack

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shared is what the lock tests put in shared memory: the lock, a counter
// that is only ever touched with the lock held, and the id of the holder.
type shared struct {
	lock    Lock
	_       uint32
	counter uint64
	holder  uint64
}

// sharedMemory maps a memfd holding a shared; the fd can be given to a
// child process.
func sharedMemory(t *testing.T) (*shared, *os.File) {
	t.Helper()
	fd, err := unix.MemfdCreate("lock-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "lock-test")
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(4096); err != nil {
		t.Fatal(err)
	}
	return mapShared(t, int(f.Fd())), f
}

func mapShared(t testing.TB, fd int) *shared {
	mem, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	return (*shared)(unsafe.Pointer(&mem[0]))
}

// critical runs one critical section as holder id: it checks nobody else
// is inside and bumps the counter non-atomically.
func (s *shared) critical(id uint64) error {
	if h := atomic.SwapUint64(&s.holder, id); h != 0 {
		return fmt.Errorf("holder %d found %d inside", id, h)
	}
	s.counter++
	if h := atomic.SwapUint64(&s.holder, 0); h != id {
		return fmt.Errorf("holder %d found %d inside on leaving", id, h)
	}
	return nil
}

func TestTryLock(t *testing.T) {
	var l Lock
	if !l.TryLock() {
		t.Fatal("TryLock on a free lock failed")
	}
	if l.TryLock() {
		t.Fatal("TryLock on a held lock succeeded")
	}
	if !l.Held() {
		t.Error("Held() false while held")
	}
	l.Unlock(nil)
	if l.Held() || !l.TryLock() {
		t.Fatal("lock not free after Unlock")
	}
	l.Unlock(nil)
}

func TestLockOrDefer(t *testing.T) {
	var l Lock
	// Free: the caller gets the lock and does the work itself.
	if !l.LockOrDefer(DeferPoll) {
		t.Fatal("LockOrDefer on a free lock did not take it")
	}
	if l.Pending() != 0 {
		t.Errorf("work deferred to ourselves: %b", l.Pending())
	}
	// Held: the work is left for the holder.
	done := make(chan bool)
	go func() { done <- l.LockOrDefer(DeferPoll | DeferWake) }()
	if <-done {
		t.Fatal("LockOrDefer took a held lock")
	}
	if l.Pending() != DeferPoll|DeferWake {
		t.Errorf("pending = %b, want poll|wake", l.Pending())
	}
	var got Deferred
	calls := 0
	l.Unlock(func(d Deferred) {
		got |= d
		calls++
		if calls == 1 {
			// Work may defer more work: Unlock must come back for it.
			go func() { done <- l.LockOrDefer(DeferTransmit) }()
			if <-done {
				t.Error("LockOrDefer took the lock during Unlock's work")
			}
		}
	})
	if got != DeferPoll|DeferWake|DeferTransmit || calls != 2 {
		t.Errorf("Unlock did %b in %d calls, want poll|wake|transmit in 2", got, calls)
	}
	if l.Held() || l.Pending() != 0 {
		t.Error("lock left held or with work pending")
	}
}

// TestMutualExclusion runs many goroutines through Lock, TryLock and
// LockOrDefer at once; and many threads, as the shim's (each goroutine
// locked to its thread, Lock spinning on the word rather than yielding:
// CallersAreThreads).
func TestMutualExclusion(t *testing.T) {
	t.Run("goroutines", func(t *testing.T) { mutualExclusion(t, false) })
	t.Run("threads", func(t *testing.T) {
		threadCallers.Store(true)
		defer threadCallers.Store(false)
		mutualExclusion(t, true)
	})
}

func mutualExclusion(t *testing.T, threads bool) {
	s, _ := sharedMemory(t)
	const goroutines, rounds = 8, 20000
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	var expected atomic.Uint64
	for g := range goroutines {
		wg.Add(1)
		go func(id uint64) {
			defer wg.Done()
			if threads {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			for i := range rounds {
				switch i % 3 {
				case 0:
					s.lock.Lock()
				case 1:
					if !s.lock.TryLock() {
						continue
					}
				case 2:
					if !s.lock.LockOrDefer(DeferPoll) {
						continue
					}
				}
				if err := s.critical(id); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
				expected.Add(1)
				s.lock.Unlock(func(Deferred) {})
			}
		}(uint64(g + 1))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if s.counter != expected.Load() {
		t.Fatalf("counter %d, want %d: a critical section overlapped", s.counter, expected.Load())
	}
}

// TestNoLostWork checks the deferred-work guarantee: every request made
// through LockOrDefer is served by a poll that starts after it.
func TestNoLostWork(t *testing.T) {
	var l Lock
	var requested, served atomic.Uint64
	poll := func() { served.Store(requested.Load()) } // runs with the lock held
	serve := func(d Deferred) {
		if d&DeferPoll != 0 {
			poll()
		}
	}
	// Requests made while the lock is held are the holder's to serve.
	for r := range 500 {
		l.Lock()
		var wg sync.WaitGroup
		for range 1 + r%4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				requested.Add(1)
				if l.LockOrDefer(DeferPoll) {
					t.Error("LockOrDefer took a held lock")
				}
			}()
		}
		wg.Wait()
		l.Unlock(serve)
		if served.Load() != requested.Load() {
			t.Fatalf("round %d: served %d of %d requests: deferred work was lost", r, served.Load(), requested.Load())
		}
	}
	// And under a free-for-all.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20000 {
				requested.Add(1)
				if l.LockOrDefer(DeferPoll) {
					poll()
					l.Unlock(serve)
				}
			}
		}()
	}
	wg.Wait()
	if served.Load() != requested.Load() {
		t.Fatalf("served %d of %d requests: deferred work was lost", served.Load(), requested.Load())
	}
}

// TestLockAcrossProcesses runs critical sections in this process and in a
// child that maps the same memory, and checks that a child blocked in Lock
// is woken when this process unlocks.
func TestLockAcrossProcesses(t *testing.T) {
	s, f := sharedMemory(t)
	const rounds = 50000
	start := func(mode string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelperProcess$")
		cmd.Env = append(os.Environ(), "LOCK_HELPER="+mode, "LOCK_ROUNDS="+strconv.Itoa(rounds))
		cmd.ExtraFiles = []*os.File{f}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}

	child := start("count")
	for range rounds {
		s.lock.Lock()
		if err := s.critical(1); err != nil {
			t.Error(err)
		}
		s.lock.Unlock(nil)
	}
	if err := child.Wait(); err != nil {
		t.Fatalf("child: %v", err)
	}
	if s.counter != 2*rounds {
		t.Fatalf("counter %d, want %d: critical sections overlapped across processes", s.counter, 2*rounds)
	}

	// Hold the lock; the child blocks in Lock (in futex_wait once it has
	// spun) and must get it promptly when we let go.
	s.lock.Lock()
	child = start("block")
	time.Sleep(300 * time.Millisecond)
	if s.counter != 2*rounds {
		t.Fatal("child got in while the lock was held")
	}
	s.lock.Unlock(nil)
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("blocked child: %v", err)
		}
	case <-time.After(5 * time.Second):
		child.Process.Kill()
		t.Fatal("child blocked in Lock was not woken")
	}
	if s.counter != 2*rounds+1 {
		t.Fatalf("counter %d after the blocked child, want %d", s.counter, 2*rounds+1)
	}
}

// TestLockHolder: the lock word names the process that holds it, so that
// a lock whose holder died can be told from one a live process holds,
// and broken: a child takes the lock, leaves work deferred, and exits
// holding it; the parent's waiter, blocked in Lock, gets it once the
// lock is broken in the dead child's name (and not in another's), with
// the deferred work still to do.
func TestLockHolder(t *testing.T) {
	s, f := sharedMemory(t)
	if !s.lock.TryLock() {
		t.Fatal("TryLock on a free lock failed")
	}
	if h := s.lock.Holder(); h != os.Getpid() {
		t.Errorf("Holder() = %d while this process (%d) holds the lock", h, os.Getpid())
	}
	s.lock.Unlock(nil)
	if h := s.lock.Holder(); h != 0 {
		t.Errorf("Holder() = %d with the lock free", h)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelperProcess$")
	cmd.Env = append(os.Environ(), "LOCK_HELPER=die")
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("child: %v", err)
	}
	child := cmd.Process.Pid
	if h := s.lock.Holder(); h != child {
		t.Fatalf("Holder() = %d after child %d exited holding the lock", h, child)
	}
	if s.lock.Pending() != DeferTransmit {
		t.Errorf("deferred work %b, want the child's DeferTransmit", s.lock.Pending())
	}
	got := make(chan Deferred, 1)
	go func() {
		s.lock.Lock()
		var did Deferred
		s.lock.Unlock(func(w Deferred) { did |= w })
		got <- did
	}()
	time.Sleep(300 * time.Millisecond) // the waiter spins, then sleeps in futex_wait
	if s.lock.Break(child + 1) {
		t.Fatal("Break in another process's name broke the dead child's lock")
	}
	if !s.lock.Break(child) {
		t.Fatal("Break in the dead child's name failed")
	}
	select {
	case did := <-got:
		if did != DeferTransmit {
			t.Errorf("the next holder did %b, want the dead child's deferred DeferTransmit", did)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter blocked in Lock was not woken by Break")
	}
	if s.lock.Held() || s.lock.Break(0) {
		t.Error("the lock is held after the waiter let it go")
	}
}

// TestLockHelperProcess is the child of TestLockAcrossProcesses and
// TestLockHolder.
func TestLockHelperProcess(t *testing.T) {
	mode := os.Getenv("LOCK_HELPER")
	if mode == "" {
		t.Skip("helper process for TestLockAcrossProcesses and TestLockHolder")
	}
	s := mapShared(t, 3)
	switch mode {
	case "count":
		rounds, _ := strconv.Atoi(os.Getenv("LOCK_ROUNDS"))
		for range rounds {
			s.lock.Lock()
			if err := s.critical(2); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			s.lock.Unlock(nil)
		}
	case "block":
		s.lock.Lock()
		s.critical(3)
		s.lock.Unlock(nil)
	case "die":
		s.lock.Lock()
		s.lock.LockOrDefer(DeferTransmit)
	}
	os.Exit(0)
}

func BenchmarkLockUnlock(b *testing.B) {
	var l Lock
	for b.Loop() {
		l.Lock()
		l.Unlock(nil)
	}
}
