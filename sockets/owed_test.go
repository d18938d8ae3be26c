package sockets

import (
	"encoding/binary"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOwedSignals: the eventfd writes that wakes under the stack lock
// leave for after it are each made once per flush that follows them
// (an eventfd owed twice before it is written once), and none is lost
// when many threads add and flush at once, one flushing while others
// find it busy.
func TestOwedSignals(t *testing.T) {
	efd := func() int {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	count := func(fd int) uint64 {
		var b [8]byte
		if n, err := unix.Read(fd, b[:]); n != 8 || err != nil {
			return 0
		}
		return binary.NativeEndian.Uint64(b[:])
	}

	var o owedSignals
	a, b := efd(), efd()
	o.add([]int32{int32(a), int32(b)})
	o.add([]int32{int32(a)})
	if count(a) != 0 {
		t.Fatal("an eventfd written before the flush")
	}
	o.flush()
	if ca, cb := count(a), count(b); ca != 1 || cb != 1 {
		t.Fatalf("after a flush the eventfds read %d and %d, want 1 each", ca, cb)
	}
	o.flush()
	if ca := count(a); ca != 0 {
		t.Fatalf("a second flush wrote again (%d)", ca)
	}

	// A forgotten eventfd is not written, though owed.
	o.add([]int32{int32(a), int32(b)})
	o.forget(int32(a))
	o.flush()
	if ca, cb := count(a), count(b); ca != 0 || cb != 1 {
		t.Fatalf("after forget(a) and a flush the eventfds read %d and %d, want 0 and 1", ca, cb)
	}

	const workers, rounds = 8, 5000
	var wg sync.WaitGroup
	lost := make(chan int, workers)
	for range workers {
		fd := efd()
		wg.Go(func() {
			for i := range rounds {
				o.add([]int32{int32(fd)})
				o.flush()
				p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				n, err := unix.Poll(p, 5000)
				for err == unix.EINTR { // the runtime's preemption signals
					n, err = unix.Poll(p, 5000)
				}
				if n != 1 {
					lost <- i
					return
				}
				count(fd)
			}
		})
	}
	wg.Wait()
	close(lost)
	for i := range lost {
		t.Errorf("round %d: the owed write never came (5 s)", i)
	}
}
