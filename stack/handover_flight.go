package stack

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/internal/repair"
)

// One handover of a connection at a time. Two at once, on one kernel
// socket, wrecked each other: the second's repair.Prepare found the
// socket unbound and bound it after the first had (EINVAL), and its
// repair.Abandon took the socket out of repair mode in the middle of the
// first's Restore, whose connection then failed and was reset. The
// shim's pre-fork servers start two so: the parent closes a connection
// (handed over at close, for its child) as the child first uses it
// (handed over at the child's request, by the parent's service or by
// onloadd), both on the same socket, the child's inherited copy of the
// parent's. The second now waits for the first; if the first gave the
// connection to that same socket, the second's work is done.

// flights are a handle's handovers under way, by connection.
type flights struct {
	mu sync.Mutex
	m  map[SockID]*flight
}

// flight is one handover under way; err and st are its outcome, set
// before done closes.
type flight struct {
	done chan struct{}
	sock uint64 // the kernel socket's inode
	st   HandoverStats
	err  error
}

// errHandedOverElsewhere is returned to a handover that waited for
// another of the same connection, which gave it to another socket.
var errHandedOverElsewhere = fmt.Errorf("%w: the connection was handed over to the kernel on another socket as this handover began", ErrInvalid)

// errHandoverUnderWay is returned to a handover that waited too long for
// another of the same connection.
var errHandoverUnderWay = &Errno{"another handover of the connection is still under way", syscall.EBUSY}

// handoverClaim makes the calling handover of id, on kernel socket fd,
// the connection's only one under way, and returns land, which the
// handover calls with its outcome. A handover of id already under way is
// waited for, up to wait: if it gave the connection to fd's socket, its
// outcome is returned (land nil); if it failed and left the connection
// in the stack, the claim is tried again.
func (s *Stack) handoverClaim(id SockID, fd int, wait time.Duration) (land func(HandoverStats, error), st HandoverStats, err error) {
	ino, err := sockInode(fd)
	if err != nil {
		return nil, st, err
	}
	deadline := time.Now().Add(wait)
	f := &s.flights
	for {
		f.mu.Lock()
		if f.m[id] == nil {
			mine := &flight{done: make(chan struct{}), sock: ino}
			if f.m == nil {
				f.m = make(map[SockID]*flight)
			}
			f.m[id] = mine
			f.mu.Unlock()
			return func(st HandoverStats, err error) {
				mine.st, mine.err = st, err
				f.mu.Lock()
				delete(f.m, id)
				f.mu.Unlock()
				close(mine.done)
			}, st, nil
		}
		f.mu.Unlock()
		if st, done, err := s.awaitFlight(id, ino, deadline); done || err != nil {
			return nil, st, err
		}
	}
}

// AwaitHandover waits for a handover of connection id that this handle
// has under way (for as long as one with write timeout writeTimeout may
// take), for a caller whose kernel socket is fd
// (onloadd, asked for a connection another request is handing over):
// done, with that handover's figures, if it gave the connection to fd's
// socket; an error if it gave it to another or lost it; neither if none
// was under way, or it failed and left the connection in the stack.
func (s *Stack) AwaitHandover(id SockID, fd int, writeTimeout time.Duration) (st HandoverStats, done bool, err error) {
	ino, err := sockInode(fd)
	if err != nil {
		return st, false, err
	}
	return s.awaitFlight(id, ino, time.Now().Add(writeTimeout+handoverClaimSlack))
}

// awaitFlight waits until deadline for the handover of id under way, if
// any, for a caller whose kernel socket is inode ino: see AwaitHandover.
func (s *Stack) awaitFlight(id SockID, ino uint64, deadline time.Time) (st HandoverStats, done bool, err error) {
	f := &s.flights
	f.mu.Lock()
	other := f.m[id]
	f.mu.Unlock()
	if other == nil {
		return st, false, nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-other.done:
	case <-t.C:
		return st, false, errHandoverUnderWay
	}
	switch {
	case other.err == nil && other.sock == ino:
		return other.st, true, nil
	case other.err == nil:
		return st, false, errHandedOverElsewhere
	case errors.Is(other.err, ErrHandoverLost):
		return st, false, other.err
	}
	return st, false, nil
}

// sockInode is repair.SocketInode, its error said of the handover.
func sockInode(fd int) (uint64, error) {
	ino, err := repair.SocketInode(fd)
	if err != nil {
		return 0, fmt.Errorf("handover: the kernel socket: %w", err)
	}
	return ino, nil
}
