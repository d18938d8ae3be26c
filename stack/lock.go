package stack

import (
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Deferred is work a thread that could not take the stack lock leaves for
// the thread that holds it (Onload's ci_netif_lock_or_defer_work): the
// holder does it before it lets the lock go.
type Deferred uint32

const (
	// DeferPoll: frames may be waiting; poll the NIC.
	DeferPoll Deferred = 1 << (iota + 2)
	// DeferWake: sleepers may be able to make progress; wake them.
	DeferWake
	// DeferTransmit: sockets have queued data; push it out.
	DeferTransmit

	deferMask Deferred = 0xff << 2 // bits 2-9: room for more
)

const (
	lockHeld    = 1 << 0 // someone holds the lock
	lockWaiters = 1 << 1 // someone may sleep in futex_wait on the word

	// The holder's process id, as it sees itself (getpid), takes bits
	// 10-31 while the lock is held: 22 bits, the kernel's largest
	// pid_max (PID_MAX_LIMIT, 4194304).
	holderShift = 10
	holderMask  = uint32(1<<32 - 1<<holderShift)
)

// lockPid is this process's id in the lock word. A Go program does not
// fork without exec, so it stays true.
var lockPid = uint32(os.Getpid()) << holderShift

// Lock is the stack lock: one word in the stack image, shared by every
// process that maps the image (the application's threads, onloadd). The
// word holds the held bit, a bit saying someone sleeps on it, the
// deferred-work flags and, while it is held, the holder's process id, set
// in the same atomic step that takes it (as a robust mutex names its
// owner): onloadd, told that a process of a stack has died, knows whether
// the dead process held the lock (Holder) and can break it (Break).
//
// Contended waiters sleep on the word with a futex (not a private one:
// the word is in shared memory), so a lock held by another process wakes
// them too. The zero value is an unlocked lock.
type Lock struct {
	word uint32
}

// TryLock takes the lock if it is free, without waiting.
func (l *Lock) TryLock() bool {
	v := atomic.LoadUint32(&l.word)
	return v&lockHeld == 0 && atomic.CompareAndSwapUint32(&l.word, v, v|lockHeld|lockPid)
}

// lockSpins is how many times Lock retries before it sleeps: the lock is
// held for short stretches (one poll), so spinning usually wins. Between
// tries a goroutine yields its processor; a thread that came into Go
// from C (CallersAreThreads) reads the word lockReads times instead.
const (
	lockSpins = 200
	lockReads = 50
)

// threadCallers: see CallersAreThreads.
var threadCallers atomic.Bool

// CallersAreThreads says the package's callers are threads that came
// into Go from C (cgo callbacks: the LD_PRELOAD shim's core), each locked
// to its goroutine. Lock then spins on the word between tries instead of
// yielding: on such a thread runtime.Gosched hands the processor to
// another OS thread and waits to be handed it back (two futex wake-ups
// and two context switches a yield), where a goroutine's yield is a
// function call.
func CallersAreThreads() { threadCallers.Store(true) }

// Lock takes the lock, waiting for it if it is held.
func (l *Lock) Lock() {
	threads := threadCallers.Load()
	for range lockSpins {
		if l.TryLock() {
			return
		}
		if !threads {
			runtime.Gosched()
			continue
		}
		for range lockReads {
			if atomic.LoadUint32(&l.word)&lockHeld == 0 {
				break
			}
		}
	}
	slept := false
	for {
		v := atomic.LoadUint32(&l.word)
		if v&lockHeld == 0 {
			// Having slept, we cannot know whether others sleep too:
			// keep the waiters bit so that our Unlock wakes one.
			nv := v | lockHeld | lockPid
			if slept {
				nv |= lockWaiters
			}
			if atomic.CompareAndSwapUint32(&l.word, v, nv) {
				return
			}
			continue
		}
		if v&lockWaiters == 0 {
			if !atomic.CompareAndSwapUint32(&l.word, v, v|lockWaiters) {
				continue
			}
			v |= lockWaiters
		}
		futexWait(&l.word, v, 100*time.Millisecond)
		slept = true
	}
}

// LockOrDefer takes the lock if it is free and returns true: the caller
// then does the work itself. If the lock is held it leaves work for the
// holder, who will do it before unlocking, and returns false.
func (l *Lock) LockOrDefer(work Deferred) bool {
	work &= deferMask
	for {
		v := atomic.LoadUint32(&l.word)
		if v&lockHeld == 0 {
			if atomic.CompareAndSwapUint32(&l.word, v, v|lockHeld|lockPid) {
				return true
			}
			continue
		}
		if v&uint32(work) == uint32(work) {
			return false // already asked for
		}
		if atomic.CompareAndSwapUint32(&l.word, v, v|uint32(work)) {
			return false
		}
	}
}

// Unlock lets the lock go. First, still holding it, it hands any work
// deferred by LockOrDefer to do (which may defer more: Unlock loops until
// none is left), so that no deferred work is ever lost.
func (l *Lock) Unlock(do func(Deferred)) {
	for {
		v := atomic.LoadUint32(&l.word)
		if w := Deferred(v) & deferMask; w != 0 {
			if atomic.CompareAndSwapUint32(&l.word, v, v&^uint32(deferMask)) && do != nil {
				do(w)
			}
			continue
		}
		if atomic.CompareAndSwapUint32(&l.word, v, 0) {
			if v&lockWaiters != 0 {
				futexWake(&l.word, 1)
			}
			return
		}
	}
}

// UnlockLeaving lets the lock go without doing the work deferred to the
// holder: the flags stay in the word, and the next holder's Unlock does
// the work. For a holder that only looked (an inspector) and must not
// poll a stack that is not its own.
func (l *Lock) UnlockLeaving() {
	for {
		v := atomic.LoadUint32(&l.word)
		if atomic.CompareAndSwapUint32(&l.word, v, v&^(lockHeld|lockWaiters|holderMask)) {
			if v&lockWaiters != 0 {
				futexWake(&l.word, 1)
			}
			return
		}
	}
}

// Break lets go a lock whose holder is dead, keeping the work deferred
// to it for the next holder, and wakes every waiter; false if the lock
// was free or is held by another process than holder (0: any). Only a
// caller that knows the holder is gone, none of its threads running, may
// call it: onloadd, once the process's control connection has closed (a
// thread killed in its critical section leaves the lock held for ever
// otherwise).
func (l *Lock) Break(holder int) bool {
	for {
		v := atomic.LoadUint32(&l.word)
		if v&lockHeld == 0 || (holder != 0 && v>>holderShift != uint32(holder)) {
			return false
		}
		if atomic.CompareAndSwapUint32(&l.word, v, v&^(lockHeld|lockWaiters|holderMask)) {
			if v&lockWaiters != 0 {
				futexWake(&l.word, math.MaxInt32)
			}
			return true
		}
	}
}

// Held reports whether someone holds the lock (for diagnostics: the
// answer may be stale at once).
func (l *Lock) Held() bool { return atomic.LoadUint32(&l.word)&lockHeld != 0 }

// Holder is the process id (as that process sees itself) of the lock's
// holder, 0 if the lock is free. The answer may be stale at once.
func (l *Lock) Holder() int {
	v := atomic.LoadUint32(&l.word)
	if v&lockHeld == 0 {
		return 0
	}
	return int(v >> holderShift)
}

// Pending reports the deferred work waiting for the holder.
func (l *Lock) Pending() Deferred { return Deferred(atomic.LoadUint32(&l.word)) & deferMask }

// futex operations (linux/futex.h). Not the _PRIVATE variants: the word
// is shared between processes.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *addr == val, for at most timeout (a holder in
// another process that dies must not leave us asleep forever; the caller
// looks again).
func futexWait(addr *uint32, val uint32, timeout time.Duration) {
	ts := unix.NsecToTimespec(int64(timeout))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(val),
		uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32, n int) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, uintptr(n), 0, 0, 0)
}
