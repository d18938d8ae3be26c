package bpf

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// EventReader reads wake events from the program's ring buffer. It maps
// the ring itself and waits for it in the Go runtime's network poller, so
// a goroutine blocked in Read holds no OS thread.
//
// Only one reader should exist (onloadd's, or a standalone process's),
// and only one goroutine may read at a time.
type EventReader struct {
	mu     sync.Mutex // held while the ring is read; Close unmaps under it
	closed atomic.Bool
	f      *os.File
	rc     syscall.RawConn
	cons   []byte // the consumer position page (ours to write)
	prod   []byte // the producer position page, then the data twice
	data   []byte
	mask   uint64

	pending []WakeEvent // read from the ring, not yet returned
}

// Ring buffer record header bits (kernel/bpf/ringbuf.c).
const (
	rbBusy    = 1 << 31
	rbDiscard = 1 << 30
	rbHdrLen  = 8
)

// Events opens a reader on the wake-event ring buffer.
func (s *Steering) Events() (*EventReader, error) {
	m := s.objs.Events
	size := int(m.MaxEntries())
	page := os.Getpagesize()
	// Close-on-exec, as every descriptor of the stack's: a plain dup was
	// inherited by every program the process exec'd.
	fd, err := unix.FcntlInt(uintptr(m.FD()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open wake event ring buffer: %w", err)
	}
	e := &EventReader{mask: uint64(size - 1)}
	fail := func(what string, err error) (*EventReader, error) {
		e.unmap()
		unix.Close(fd)
		return nil, fmt.Errorf("open wake event ring buffer: %s: %w", what, err)
	}
	if e.cons, err = unix.Mmap(fd, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return fail("map consumer page", err)
	}
	if e.prod, err = unix.Mmap(fd, int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return fail("map producer pages", err)
	}
	e.data = e.prod[page:]
	if err := unix.SetNonblock(fd, true); err != nil {
		return fail("set non-blocking", err)
	}
	// A non-blocking descriptor joins the runtime's poller.
	e.f = os.NewFile(uintptr(fd), "wake-events")
	if e.rc, err = e.f.SyscallConn(); err != nil {
		e.unmap()
		e.f.Close()
		return nil, fmt.Errorf("open wake event ring buffer: %w", err)
	}
	return e, nil
}

func (e *EventReader) unmap() {
	if e.cons != nil {
		unix.Munmap(e.cons)
		e.cons = nil
	}
	if e.prod != nil {
		unix.Munmap(e.prod)
		e.prod, e.data = nil, nil
	}
}

func (e *EventReader) consPos() *uint64 { return (*uint64)(unsafe.Pointer(&e.cons[0])) }
func (e *EventReader) prodPos() *uint64 { return (*uint64)(unsafe.Pointer(&e.prod[0])) }

// drain moves every committed record into pending and reports whether
// there were any. It re-reads the producer position after publishing
// the consumer's, so that a record the kernel posted without a wake-up
// (it wakes only a reader that had caught up) is not left behind.
func (e *EventReader) drain() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cons == nil {
		return true // closed: let the waiter see it
	}
	got := false
	for {
		cons := atomic.LoadUint64(e.consPos())
		prod := atomic.LoadUint64(e.prodPos())
		if cons == prod {
			return got
		}
		for cons < prod {
			off := cons & e.mask
			hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&e.data[off])))
			if hdr&rbBusy != 0 {
				break // reserved, not yet committed
			}
			n := uint64(hdr &^ (rbBusy | rbDiscard))
			if hdr&rbDiscard == 0 && n >= 8 && off+rbHdrLen+8 <= uint64(len(e.data)) {
				p := e.data[off+rbHdrLen:]
				e.pending = append(e.pending, WakeEvent{
					Stack: StackID(nativeU32(p[0:4])), Queue: nativeU32(p[4:8]),
				})
			}
			cons += (n + rbHdrLen + 7) &^ 7
			got = true
		}
		atomic.StoreUint64(e.consPos(), cons)
		if cons != prod {
			return got // a record still busy: its commit wakes us
		}
	}
}

// Read blocks for the next wake event.
func (e *EventReader) Read() (WakeEvent, error) {
	if len(e.pending) == 0 {
		if err := e.Wait(); err != nil {
			return WakeEvent{}, err
		}
	}
	ev := e.pending[0]
	e.pending = e.pending[:copy(e.pending, e.pending[1:])]
	return ev, nil
}

// Wait blocks until at least one event is pending and returns without
// consuming them (TakePending does).
func (e *EventReader) Wait() error {
	if len(e.pending) > 0 {
		return nil
	}
	err := e.rc.Read(func(uintptr) bool { return e.drain() })
	if err == nil && e.closed.Load() {
		err = os.ErrClosed
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return err
		}
		return fmt.Errorf("read wake event: %w", err)
	}
	return nil
}

// TakePending returns the events read so far and forgets them; the slice
// is valid until the next call.
func (e *EventReader) TakePending() []WakeEvent {
	p := e.pending
	e.pending = e.pending[:0]
	return p
}

// SetDeadline makes Read and Wait return os.ErrDeadlineExceeded after t
// (zero: block forever). It may be called from another goroutine to
// interrupt a wait.
func (e *EventReader) SetDeadline(t time.Time) error { return e.f.SetReadDeadline(t) }

// Close closes the reader, unblocking Read.
func (e *EventReader) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	err := e.f.Close()
	e.mu.Lock()
	e.unmap()
	e.mu.Unlock()
	return err
}
