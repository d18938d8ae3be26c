package xdp

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Desc is one RX or TX descriptor: a frame's address in the UMEM and its
// length.
type Desc = unix.XDPDesc

// ring is the part common to the four AF_XDP rings: a single-producer
// single-consumer queue shared with the kernel through an mmap of the socket.
//
// The shared producer and consumer words are read and written with atomics;
// each side keeps a cached copy of the other side's word and only reloads it
// when the cache says there is not enough room (producer) or nothing to read
// (consumer), so a batch costs one atomic load and one release store.
type ring struct {
	producer *uint32
	consumer *uint32
	flags    *uint32
	mask     uint32
	size     uint32
	// cachedProd and cachedCons are this process's private view. For a
	// producer ring cachedCons is consumer+size, so free = cachedCons-cachedProd.
	cachedProd uint32
	cachedCons uint32
	mem        []byte
}

func (r *ring) init(mem []byte, off unix.XDPRingOffset, size uint32, producer bool) {
	base := unsafe.Pointer(&mem[0])
	r.mem = mem
	r.producer = (*uint32)(unsafe.Add(base, off.Producer))
	r.consumer = (*uint32)(unsafe.Add(base, off.Consumer))
	r.flags = (*uint32)(unsafe.Add(base, off.Flags))
	r.size = size
	r.mask = size - 1
	r.cachedProd = atomic.LoadUint32(r.producer)
	r.cachedCons = atomic.LoadUint32(r.consumer)
	if producer {
		r.cachedCons += size
	}
}

// free returns how many entries a producer may reserve, reloading the
// consumer index only if the cached view has fewer than n.
func (r *ring) free(n uint32) uint32 {
	f := r.cachedCons - r.cachedProd
	if f >= n {
		return f
	}
	r.cachedCons = atomic.LoadUint32(r.consumer) + r.size
	return r.cachedCons - r.cachedProd
}

// reserve claims up to n entries for the producer and returns the index of
// the first and how many were claimed.
func (r *ring) reserve(n uint32) (idx, got uint32) {
	got = min(r.free(n), n)
	idx = r.cachedProd
	r.cachedProd += got
	return idx, got
}

// cancel gives back the last n reserved entries, unpublished.
func (r *ring) cancel(n uint32) { r.cachedProd -= n }

// submit publishes every reserved entry to the consumer. The release store
// orders the descriptor writes before the index the kernel reads.
func (r *ring) submit() {
	storeRelease(r.producer, r.cachedProd)
}

// available returns how many entries a consumer can read, reloading the
// producer index only when the cached view is empty.
func (r *ring) available() uint32 {
	e := r.cachedProd - r.cachedCons
	if e == 0 {
		r.cachedProd = atomic.LoadUint32(r.producer)
		e = r.cachedProd - r.cachedCons
	}
	return e
}

// peek claims up to n readable entries and returns the first index and the
// count.
func (r *ring) peek(n uint32) (idx, got uint32) {
	got = min(r.available(), n)
	idx = r.cachedCons
	r.cachedCons += got
	return idx, got
}

// release hands every peeked entry back to the producer.
func (r *ring) release() {
	storeRelease(r.consumer, r.cachedCons)
}

// needsWakeup reports whether the kernel asked to be kicked (the
// XDP_USE_NEED_WAKEUP protocol).
func (r *ring) needsWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// Pending reports how many entries the producer has published that the
// consumer has not yet released, as seen in shared memory.
func (r *ring) Pending() uint32 {
	return atomic.LoadUint32(r.producer) - atomic.LoadUint32(r.consumer)
}

// Size is the ring's capacity in entries.
func (r *ring) Size() uint32 { return r.size }

// Ring is one AF_XDP ring of entries of type T.
type Ring[T uint64 | Desc] struct {
	ring
	entries []T
}

// AddrRing is the fill ring (we produce frame addresses for the kernel to
// receive into) or the completion ring (the kernel returns the addresses of
// transmitted frames).
type AddrRing = Ring[uint64]

// DescRing is the RX ring (the kernel produces received frames) or the TX
// ring (we produce frames to send).
type DescRing = Ring[Desc]

func (r *Ring[T]) setup(mem []byte, off unix.XDPRingOffset, size uint32, producer bool) {
	r.init(mem, off, size, producer)
	r.entries = unsafe.Slice((*T)(unsafe.Pointer(&mem[off.Desc])), size)
}

// Reserve claims up to n entries on a producer ring (fill, TX). Write them
// with Set and publish them with Submit.
func (r *Ring[T]) Reserve(n uint32) (idx, got uint32) { return r.reserve(n) }

// Set writes entry idx (from Reserve).
func (r *Ring[T]) Set(idx uint32, v T) { r.entries[idx&r.mask] = v }

// Cancel gives back the last n reserved entries, unwritten.
func (r *Ring[T]) Cancel(n uint32) { r.cancel(n) }

// Submit publishes every reserved entry.
func (r *Ring[T]) Submit() { r.submit() }

// Peek claims up to n entries on a consumer ring (RX, completion). Read
// them with Get and hand them back with Release.
func (r *Ring[T]) Peek(n uint32) (idx, got uint32) { return r.peek(n) }

// Get reads entry idx (from Peek).
func (r *Ring[T]) Get(idx uint32) T { return r.entries[idx&r.mask] }

// Release hands every peeked entry back to the producer.
func (r *Ring[T]) Release() { r.release() }

// NeedsWakeup reports whether the kernel wants a system call to notice new
// entries.
func (r *Ring[T]) NeedsWakeup() bool { return r.needsWakeup() }
