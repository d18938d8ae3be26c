package interrupts

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/internal/eventfd"
	"github.com/xdp-onload/onload/internal/monotime"
)

// threadWaiter sleeps on an OS thread of its own (Policy.Thread), blocked
// in the kernel in epoll_wait on a timerfd (the timer), an eventfd (kicks,
// and Stop) and the interrupt line's descriptor. Its wake-ups and timers
// are the kernel's alone. In a process whose threads come into Go from C
// and go back to C keeping their processors (the LD_PRELOAD shim's) the
// Go runtime's came later: under two CPU hogs, in the conformance
// program's signal tests, the goroutine woke more than 1 ms late 427-445
// times a minute (12 ms at the latest), the thread 146-157 (8 ms).
type threadWaiter struct {
	ep, tfd, kfd int
	line         fdLine
	stop         <-chan struct{}

	pending atomic.Bool // a kick is written to kfd and not yet taken
	timerOn atomic.Bool // the timerfd is set, as far as we know
	// held is set when the line fired during a wait that did not ask for
	// it: the next wait that does returns at once (the Sleeper's thread
	// alone touches it).
	held bool
	evs  [4]unix.EpollEvent
	turn int64 // when the thread last gave its processor a turn (monotime.Now)
}

// turnEvery is how often the Sleeper's thread gives its Go processor a
// turn of the scheduler before it blocks (runtime.Gosched). A goroutine
// locked to its thread that blocks in system calls never goes through
// the scheduler, so its processor's schedule tick stands still; once it
// has stood 10 ms the runtime's monitor takes the processor back at every
// one of its ticks that finds the thread in the kernel, and ticks every
// 20 µs: under redis-server the monitor took 3.9% of the samples, and
// the runtime's threads together 6.4% against 3.7% with the goroutine.
// The shim's own threads do the same (onl_resched).
const turnEvery = 5 * time.Millisecond

// fdLine is an interrupt line whose signal is a descriptor: readable once
// the line has fired, until takeIRQ consumes the signal.
type fdLine interface {
	irqFD() int
	takeIRQ()
}

func newThreadWaiter(src Source, stop <-chan struct{}) (_ *threadWaiter, err error) {
	w := &threadWaiter{ep: -1, tfd: -1, kfd: -1, stop: stop}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if w.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("interrupts: epoll_create1: %w", err)
	}
	if w.tfd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("interrupts: timerfd_create: %w", err)
	}
	if w.kfd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("interrupts: eventfd: %w", err)
	}
	switch l := src.(type) {
	case nil:
	case fdLine:
		w.line = l
	default:
		b, err := bridge(src.C())
		if err != nil {
			return nil, err
		}
		w.line = b
	}
	fds := []int{w.tfd, w.kfd}
	if w.line != nil {
		fds = append(fds, w.line.irqFD())
	}
	for _, fd := range fds {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err = unix.EpollCtl(w.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return nil, fmt.Errorf("interrupts: watch fd %d: %w", fd, err)
		}
	}
	return w, nil
}

// setTimer sets the timerfd to the absolute time `at`: the stack's Clock
// is CLOCK_MONOTONIC (Policy.Thread). A relative time would be late by
// however long the caller was held between reading the clock and the
// system call (preempted, or running a signal's handler).
func (w *threadWaiter) setTimer(at, now int64) {
	// A zero it_value disarms a timerfd.
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(max(at, 1))}
	w.timerOn.Store(true)
	unix.TimerfdSettime(w.tfd, unix.TFD_TIMER_ABSTIME, &spec, nil)
}

func (w *threadWaiter) stopTimer() {
	if w.timerOn.Swap(false) {
		unix.TimerfdSettime(w.tfd, 0, &unix.ItimerSpec{}, nil)
	}
}

func (w *threadWaiter) kick() bool {
	if w.pending.Swap(true) {
		return false
	}
	eventfd.Signal(w.kfd)
	return true
}

func (w *threadWaiter) wait(irq bool) wakeReason {
	if irq && w.held {
		w.held = false
		return wokeIRQ
	}
	if now := monotime.Now(); now-w.turn >= int64(turnEvery) {
		w.turn = now
		runtime.Gosched()
	}
	for {
		n, err := unix.EpollWait(w.ep, w.evs[:], -1)
		if err != nil {
			if err != unix.EINTR {
				// Not expected while the descriptors are open; do not
				// spin on it.
				time.Sleep(time.Millisecond)
				return wokeTimer
			}
			continue
		}
		var fired, timer, kicked bool
		for _, ev := range w.evs[:n] {
			switch fd := int(ev.Fd); {
			case fd == w.kfd:
				// Cleared before it is read: a kick written after the
				// read is seen by the next wait.
				w.pending.Store(false)
				eventfd.Drain(w.kfd)
				kicked = true
			case fd == w.tfd:
				w.timerOn.Store(false)
				eventfd.Drain(w.tfd)
				timer = true
			case w.line != nil && fd == w.line.irqFD():
				w.line.takeIRQ()
				fired = true
			}
		}
		if kicked {
			select {
			case <-w.stop:
				return wokeStop
			default:
			}
		}
		switch {
		case fired && irq:
			return wokeIRQ
		case fired:
			w.held = true
		}
		switch {
		case timer:
			return wokeTimer
		case kicked:
			return wokeKick
		}
	}
}

func (w *threadWaiter) close() {
	for _, fd := range []int{w.ep, w.tfd, w.kfd} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	if b, ok := w.line.(*chanLine); ok {
		b.close()
	}
}

// chanLine turns an interrupt line that signals on a channel (the
// in-memory NIC's) into a descriptor, through a goroutine.
type chanLine struct {
	efd  int
	quit chan struct{}
	done chan struct{}
}

func bridge(c <-chan struct{}) (*chanLine, error) {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("interrupts: eventfd for the interrupt line: %w", err)
	}
	b := &chanLine{efd: efd, quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for {
			select {
			case <-c:
				eventfd.Signal(b.efd)
			case <-b.quit:
				return
			}
		}
	}()
	return b, nil
}

func (b *chanLine) irqFD() int { return b.efd }
func (b *chanLine) takeIRQ()   { eventfd.Drain(b.efd) }

func (b *chanLine) close() {
	close(b.quit)
	<-b.done
	unix.Close(b.efd)
}
