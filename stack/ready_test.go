package stack_test

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// readSlots is ReadySince into a fresh buffer of n; it fails the test if
// the log says to check everything.
func readSlots(t *testing.T, st *stack.Stack, seq *uint32, n int) []uint32 {
	t.Helper()
	slots := make([]uint32, n)
	k, ok := st.ReadySince(seq, slots)
	if !ok {
		t.Fatalf("ReadySince: check everything, want the log")
	}
	return slots[:k]
}

// sendArrive sends what on a's socket c and polls until a segment has
// come in at b.
func sendArrive(t *testing.T, a *stack.Stack, c stack.SockID, b *stack.Stack, poll func(), what string) {
	t.Helper()
	before := b.Counters().RxTCP
	if _, err := a.Send(c, []byte(what)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, what, 5*time.Second, poll, func() bool { return b.Counters().RxTCP > before })
}

func hasSlot(slots []uint32, id stack.SockID) bool {
	return slices.Contains(slots, uint32(id.Slot()))
}

// TestReadyLog checks the ready log: a socket whose readiness rises (data,
// a connection on a listener, a local shutdown) is named to every reader
// that has not read since, again after a reader read, and a reader that
// fell behind is told to check everything.
func TestReadyLog(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	early := b.ReadyHead() // a reader that has not read since before the connection
	c, s := connectPair(t, a, b, poll)
	l := listeners[b]
	if got := readSlots(t, b, &early, 64); !hasSlot(got, l) || !hasSlot(got, s) {
		t.Fatalf("log since before the connection: slots %v, want the listener's %d and the connection's %d", got, l.Slot(), s.Slot())
	}

	seq, other := b.ReadyHead(), b.ReadyHead()
	if got := readSlots(t, b, &seq, 64); len(got) != 0 {
		t.Fatalf("nothing happened, the log names %v", got)
	}
	arrive := func(what string) { t.Helper(); sendArrive(t, a, c, b, poll, what) }
	arrive("one")
	if got := readSlots(t, b, &seq, 64); !hasSlot(got, s) {
		t.Fatalf("data arrived, the log names %v, not the socket's slot %d", got, s.Slot())
	}
	// The same socket again, after a reader read: each reader hears of it,
	// the one that read and the one that has not.
	arrive("two")
	if got := readSlots(t, b, &seq, 64); !hasSlot(got, s) {
		t.Fatalf("more data after a read: the log names %v, not slot %d", got, s.Slot())
	}
	if got := readSlots(t, b, &other, 64); !hasSlot(got, s) {
		t.Fatalf("a reader that had not read: the log names %v, not slot %d", got, s.Slot())
	}

	// A shutdown by the socket's own user raises its readiness (reads end).
	if err := b.Shutdown(s, syscall.SHUT_RD); err != nil {
		t.Fatal(err)
	}
	if got := readSlots(t, b, &seq, 64); !hasSlot(got, s) {
		t.Fatalf("after shutdown, the log names %v, not slot %d", got, s.Slot())
	}

	// More than the caller has room for, or a position the log has
	// wrapped past: check everything, and read on from the head.
	arrive("three")
	if _, ok := b.ReadySince(&seq, nil); ok {
		t.Fatal("a change and no room: ReadySince said the log would do")
	}
	if got := readSlots(t, b, &seq, 64); len(got) != 0 {
		t.Fatalf("after a full check, the log names %v", got)
	}
	stale := seq - 1<<20
	if _, ok := b.ReadySince(&stale, make([]uint32, 1<<12)); ok {
		t.Fatal("a position far behind the head: ReadySince said the log would do")
	}
	if stale != seq {
		t.Fatalf("after a full check the reader is at %d, want the head %d", stale, seq)
	}
}

// TestArmReady checks the wait on the ready log: armed at the reader's
// position, the next entry calls ReadyWake once; a position the log has
// moved past says so at once and arms nothing.
func TestArmReady(t *testing.T) {
	a, na, nb := memPair(t, vnic.MemConfig{})
	wakes := 0
	b := peerStack(t, na, nb, stack.Config{}, stack.Options{ReadyWake: func() { wakes++ }})
	poll := pollBoth(a, b)
	c, _ := connectPair(t, a, b, poll)

	seq := b.ReadyHead()
	if moved, ok := b.ArmReady(seq); moved || !ok {
		t.Fatalf("ArmReady at the head: moved %v ok %v, want an armed wait", moved, ok)
	}
	poll()
	if wakes != 0 {
		t.Fatalf("nothing happened, and ReadyWake was called %d times", wakes)
	}
	send := func(what string) { t.Helper(); sendArrive(t, a, c, b, poll, what) }
	send("one")
	if wakes != 1 {
		t.Fatalf("data arrived on an armed wait: ReadyWake called %d times, want 1", wakes)
	}
	send("two")
	if wakes != 1 {
		t.Fatalf("data again, not armed again: ReadyWake called %d times, want still 1", wakes)
	}
	if moved, ok := b.ArmReady(seq); !moved || !ok {
		t.Fatalf("ArmReady at a position the log has passed: moved %v ok %v, want moved", moved, ok)
	}
	send("three")
	if wakes != 1 {
		t.Fatalf("ArmReady said moved but armed the wait: ReadyWake called %d times", wakes)
	}
}
