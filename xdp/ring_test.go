package xdp

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fakeRing lays a ring out in ordinary memory the way the kernel does, so
// the index arithmetic can be tested without a socket; the test plays the
// kernel's side by writing the shared words directly.
func fakeRing(size uint32, producer bool) (*Ring[uint64], *uint32, *uint32) {
	mem := make([]byte, 256+int(size)*8)
	off := unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 256}
	r := &Ring[uint64]{}
	r.setup(mem, off, size, producer)
	return r, (*uint32)(unsafe.Pointer(&mem[0])), (*uint32)(unsafe.Pointer(&mem[64]))
}

func TestProducerRing(t *testing.T) {
	r, prod, cons := fakeRing(8, true)
	idx, got := r.Reserve(5)
	if idx != 0 || got != 5 {
		t.Fatalf("Reserve(5) = %d, %d", idx, got)
	}
	for i := range got {
		r.Set(idx+i, uint64(100+i))
	}
	if *prod != 0 {
		t.Fatal("entries visible before Submit")
	}
	r.Submit()
	if *prod != 5 {
		t.Fatalf("producer = %d after Submit, want 5", *prod)
	}
	// Only 3 free until the consumer moves.
	if _, got = r.Reserve(5); got != 3 {
		t.Fatalf("Reserve on a ring with 3 free = %d", got)
	}
	r.Cancel(3)
	if _, got = r.Reserve(1); got != 1 {
		t.Fatalf("after Cancel, Reserve(1) = %d", got)
	}
	r.Cancel(1)
	// The consumer takes 4; indices wrap past the ring size.
	*cons = 4
	idx, got = r.Reserve(7)
	if idx != 5 || got != 7 {
		t.Fatalf("Reserve(7) after consumer moved = %d, %d; want 5, 7", idx, got)
	}
	for i := range got {
		r.Set(idx+i, uint64(200+i))
	}
	r.Submit()
	if *prod != 12 {
		t.Fatalf("producer = %d, want 12", *prod)
	}
	// Index 11 wrapped to slot 11&7 = 3.
	if r.entries[3] != 206 {
		t.Errorf("wrapped entry = %d, want 206", r.entries[3])
	}
	// Indices are free-running 32-bit counters: they wrap too.
	r2, p2, c2 := fakeRing(4, true)
	*p2, *c2 = 0xfffffffe, 0xfffffffe
	r2.init(r2.mem, unix.XDPRingOffset{Producer: 0, Consumer: 64, Flags: 128, Desc: 256}, 4, true)
	if _, got := r2.Reserve(4); got != 4 {
		t.Errorf("Reserve across the 32-bit wrap = %d, want 4", got)
	}
}

func TestConsumerRing(t *testing.T) {
	r, prod, cons := fakeRing(4, false)
	if _, got := r.Peek(4); got != 0 {
		t.Fatal("Peek on an empty ring returned entries")
	}
	// The kernel produces 3.
	for i := range uint32(3) {
		r.entries[i] = uint64(i + 1)
	}
	*prod = 3
	idx, got := r.Peek(2)
	if idx != 0 || got != 2 || r.Get(idx) != 1 || r.Get(idx+1) != 2 {
		t.Fatalf("Peek(2) = %d, %d", idx, got)
	}
	if *cons != 0 {
		t.Fatal("consumer moved before Release")
	}
	r.Release()
	if *cons != 2 {
		t.Fatalf("consumer = %d, want 2", *cons)
	}
	idx, got = r.Peek(8)
	if idx != 2 || got != 1 || r.Get(idx) != 3 {
		t.Fatalf("Peek(8) = %d, %d, want the last entry", idx, got)
	}
	r.Release()
	if r.Pending() != 0 {
		t.Errorf("Pending = %d, want 0", r.Pending())
	}
}
