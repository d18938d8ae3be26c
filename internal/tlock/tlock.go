// Package tlock is a mutex for code that OS threads come into from C
// (the LD_PRELOAD shim's core) as well as goroutines.
//
// A sync.Mutex that is contended parks the goroutine that waits. A
// goroutine come in from C is locked to its thread, so parking it hands
// the thread's processor to another runtime thread, and its wake-up
// readies it on a run queue from which a runtime thread must hand the
// processor back (wakep, startm, startlockedm): about six futex calls and
// two thread switches, where the critical section was a few hundred
// nanoseconds. sync.Mutex does not spin first either when processors are
// idle (runtime_canSpin), as they are when the core has given each thread
// one. Under memcached -t 2, whose two workers share the stack's wake-up
// queues, those hand-offs were most of the runtime's futex calls.
//
// So, once SetThreads is called, a Mutex is a word of its own: the waiter
// spins on it a little, then sleeps on it with a private futex, which
// blocks the thread and nothing else (Drepper's "Futexes Are Tricky",
// mutex 2). Before, and in programs that never set it, it is a
// sync.Mutex, which suits goroutines and the race detector.
package tlock

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

var threads atomic.Bool

// SetThreads says the package's callers are threads come in from C. Call
// it before any Mutex is used: a Mutex locked in one mode must be
// unlocked in the same.
func SetThreads() { threads.Store(true) }

// Mutex is a mutual exclusion lock; the zero value is unlocked. It must
// not be copied after first use.
type Mutex struct {
	mu   sync.Mutex    // goroutines' mode
	word atomic.Uint32 // threads' mode: free, held, or held with sleepers
}

const (
	free     = 0
	held     = 1
	sleepers = 2

	// spins tries, each after reading the word up to reads times, before
	// the waiter sleeps: the sections it guards are short.
	spins = 20
	reads = 50
)

// Lock takes m, waiting if another holds it.
func (m *Mutex) Lock() {
	if !threads.Load() {
		m.mu.Lock()
		return
	}
	if m.word.CompareAndSwap(free, held) {
		return
	}
	for range spins {
		for range reads {
			if m.word.Load() == free {
				break
			}
		}
		if m.word.CompareAndSwap(free, held) {
			return
		}
	}
	// From here the word says sleepers whenever we hold it: we cannot
	// know whether others sleep too, so our Unlock wakes one.
	for m.word.Swap(sleepers) != free {
		futex(&m.word, futexWaitPrivate, sleepers)
	}
}

// TryLock takes m if it is free, without waiting.
func (m *Mutex) TryLock() bool {
	if !threads.Load() {
		return m.mu.TryLock()
	}
	return m.word.CompareAndSwap(free, held)
}

// Unlock lets m go, waking a sleeper if there is one.
func (m *Mutex) Unlock() {
	if !threads.Load() {
		m.mu.Unlock()
		return
	}
	switch m.word.Swap(free) {
	case sleepers:
		futex(&m.word, futexWakePrivate, 1)
	case free:
		panic("tlock: unlock of unlocked mutex")
	}
}

// futex operations (linux/futex.h): FUTEX_WAIT and FUTEX_WAKE with
// FUTEX_PRIVATE_FLAG, the word being in this process's memory only.
const (
	futexWaitPrivate = 0 | 128
	futexWakePrivate = 1 | 128
)

func futex(addr *atomic.Uint32, op, val uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val), 0, 0, 0)
}
