package interrupts

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// readiness is the kernel's own word that a frame is in an AF_XDP
// socket's RX ring: the socket is readable once the driver has flushed a
// frame into the ring, and the kernel wakes the socket's waiters at that
// flush (xsk_flush, then sk_data_ready). The steering program runs before
// the flush, so its wake event can come before the frame is visible;
// readiness cannot (docs/ARCHITECTURE.md, "No lost wake-ups").
//
// The sockets join a private epoll set with EPOLLONESHOT when armed
// (EPOLL_CTL_ADD), and the kernel checks the ring at that moment, so a
// frame flushed before arm is reported at once and one flushed after it
// by the flush's wake-up. The event taken, a socket leaves the set
// (EPOLL_CTL_DEL): while it is in no set, a flush finds nobody on the
// socket's wait queue and costs nothing, where a socket left in the set
// disabled cost each frame's flush the queue's lock and the epoll
// callback, in the context that received the frame (the peer's send, on
// veth). The set
// itself waits in the Go runtime's network poller: a goroutine blocked on
// it holds no OS thread.
//
// A Sleeper on a thread of its own (Policy.Thread) waits on the set
// itself instead (irqFD, takeIRQ), and the set never joins the poller.
type readiness struct {
	epfd    int
	fds     []int
	f       *os.File
	rc      syscall.RawConn
	c       chan struct{}
	done    chan struct{}
	started sync.Once
	once    sync.Once
	armed   atomic.Bool // the sockets are enabled in the set: an arm is pending
}

func newReadiness(fds []int) (*readiness, error) {
	if len(fds) == 0 {
		return nil, errors.New("interrupts: no socket to watch")
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("interrupts: epoll_create1: %w", err)
	}
	fail := func(what string, err error) (*readiness, error) {
		unix.Close(epfd)
		return nil, fmt.Errorf("interrupts: %s: %w", what, err)
	}
	for _, fd := range fds {
		// Tried once, so that a descriptor epoll refuses fails here; the
		// first arm adds it again.
		ev := unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: int32(fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return fail(fmt.Sprintf("watch socket fd %d", fd), err)
		}
		unix.EpollCtl(epfd, unix.EPOLL_CTL_DEL, fd, nil)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		return fail("set epoll non-blocking", err)
	}
	return &readiness{epfd: epfd, fds: fds, c: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// C is the channel the signals come on: the first call puts the set in
// the runtime's poller, read by a goroutine (run).
func (r *readiness) C() <-chan struct{} {
	r.started.Do(func() {
		// A non-blocking descriptor joins the runtime's poller.
		r.f = os.NewFile(uintptr(r.epfd), "xsk-readiness")
		var err error
		if r.rc, err = r.f.SyscallConn(); err != nil {
			// Only for a file that is not open: the set was made above.
			close(r.done)
			return
		}
		go r.run()
	})
	return r.c
}

// irqFD is the set itself, readable once a socket has fired, for a
// Sleeper that waits in the kernel (threadWaiter); takeIRQ takes the
// event, as run does.
func (r *readiness) irqFD() int { return r.epfd }

func (r *readiness) takeIRQ() {
	var evs [8]unix.EpollEvent
	if n, _ := unix.EpollWait(r.epfd, evs[:], 0); n > 0 {
		r.took(evs[:n])
	}
}

// took takes the sockets that fired out of the set, then says that no
// arm is pending: an arm made before that (a no-op, seeing one pending)
// is covered by the signal the event gives.
func (r *readiness) took(evs []unix.EpollEvent) {
	for _, ev := range evs {
		unix.EpollCtl(r.epfd, unix.EPOLL_CTL_DEL, int(ev.Fd), nil)
	}
	r.armed.Store(false)
}

// arm asks for one signal on c when a socket's RX ring has a frame: at
// once if one has now. While an earlier arm has not fired, the sockets are
// still in the set and the kernel will report the next flush: the system
// call is saved (a Sleeper woken by a timer or a nudge re-arms far more
// often than frames arrive), and the caller's own check of the rings
// (Stack.Idle) covers the frames already in them. A socket still in the
// set (of several, one fired) is enabled again.
func (r *readiness) arm() {
	if r.armed.Load() {
		return
	}
	r.armed.Store(true)
	for _, fd := range r.fds {
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(fd)}
		// Fails only once the set is closed.
		if unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, fd, &ev) == unix.EEXIST {
			unix.EpollCtl(r.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
		}
	}
}

// state says, for a dump, whether an arm is pending (the sockets are
// enabled in the set), whether the kernel has an event in the set that
// run has not taken (poll(2) on the set, which takes nothing), and
// whether a signal waits on c that the Sleeper has not taken.
func (r *readiness) state() string {
	fds := []unix.PollFd{{Fd: int32(r.epfd), Events: unix.POLLIN}}
	n, _ := unix.Poll(fds, 0)
	return fmt.Sprintf("enabled=%v kernel event=%v signal waiting=%v", r.armed.Load(), n > 0, len(r.c) > 0)
}

// run turns the set's readiness into signals on c.
func (r *readiness) run() {
	defer close(r.done)
	var evs [8]unix.EpollEvent
	for {
		n := 0
		err := r.rc.Read(func(fd uintptr) bool {
			var err error
			n, err = unix.EpollWait(int(fd), evs[:], 0)
			return n > 0 || (err != nil && err != unix.EINTR)
		})
		if err != nil {
			return // closed
		}
		// The event disabled the socket that reported it (one-shot); it
		// leaves the set, and the next arm adds it again. (With several
		// sockets, one that has not fired stays enabled.)
		r.took(evs[:max(n, 0)])
		select {
		case r.c <- struct{}{}:
		default:
		}
	}
}

func (r *readiness) close() error {
	var err error
	r.once.Do(func() {
		// Nobody can start the goroutine from here on.
		r.started.Do(func() { r.f = nil })
		if r.f == nil {
			err = unix.Close(r.epfd)
			return
		}
		err = r.f.Close()
		<-r.done
	})
	return err
}
