// Package timers is a hashed timer wheel that lives in shared memory: the
// stack image. Arming and cancelling a timer are a few plain memory writes,
// no system calls (seed 001: timers "managed … without requiring system
// calls to set and clear them"). The stack's poll loop collects due timers
// with Expire; a thread about to sleep asks NextDeadline how long it may.
//
// Timers are named by ID, an index into a fixed table sized at creation;
// the owner decides what each ID means (the stack gives every socket a few).
// The wheel holds no Go pointers, so a second process mapping the same
// memory (onloadd, running the timers of a stalled stack) sees the same
// timers. Every index read from the memory is checked, and every list walk
// is bounded, so a corrupt image yields ErrCorrupt, never a panic or a hang.
//
// Time is in ticks, whatever the owner makes them (the stack uses a fixed
// number of nanoseconds of CLOCK_MONOTONIC, the same in every process).
//
// A Wheel is not safe for concurrent use: its owner holds the stack lock.
package timers

import (
	"errors"
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// Tick is a point in time on the wheel's clock.
type Tick uint64

// ID names a timer: 0 to Capacity-1.
type ID uint32

// null ends a list.
const null = ^uint32(0)

// Timer states.
const (
	idle  = 0
	armed = 1
)

// header starts the wheel's memory.
type header struct {
	magic    uint32
	version  uint32
	capacity uint32
	slots    uint32 // a power of two
	cursor   Tick   // the next tick Expire will process; armed timers are due at or after it
	min      Tick   // the earliest deadline, when minValid
	minValid uint32
	armedN   uint32 // timers armed
	_        [4]uint64
}

// node is one timer.
type node struct {
	at    Tick // deadline
	next  uint32
	prev  uint32
	state uint32
	_     uint32
}

const (
	magic      = 0x544d5752 // "TMWR"
	version    = 1
	headerSize = int(unsafe.Sizeof(header{}))
	nodeSize   = int(unsafe.Sizeof(node{}))
)

// ErrCorrupt says the wheel's memory is inconsistent (a bad index, a list
// that loops). Nothing was changed past the point where it was found.
var ErrCorrupt = errors.New("timer wheel memory is corrupt")

// Wheel is a view of a timer wheel in some memory.
type Wheel struct {
	hdr    *header
	bitmap []uint64 // bit s set: slot s's list is not empty
	heads  []uint32
	nodes  []node
	mask   uint64
}

// Size is the number of bytes a wheel of capacity timers and slots slots
// needs.
func Size(capacity, slots int) int {
	return headerSize + (slots+63)/64*8 + align8(slots*4) + capacity*nodeSize
}

func align8(n int) int { return (n + 7) &^ 7 }

// Format lays a new, empty wheel out in mem (Size bytes, 8-byte aligned)
// with its clock at now. slots is a power of two: a timer due within slots
// ticks costs nothing until it fires; a later one is looked at once per lap.
func Format(mem []byte, capacity, slots int, now Tick) (*Wheel, error) {
	if capacity < 1 || capacity >= int(null) {
		return nil, fmt.Errorf("timer wheel capacity %d: must be from 1 to %d", capacity, null-1)
	}
	if slots < 64 || slots > 1<<24 || bits.OnesCount(uint(slots)) != 1 {
		return nil, fmt.Errorf("timer wheel slots %d: must be a power of two from 64 to %d", slots, 1<<24)
	}
	if len(mem) < Size(capacity, slots) {
		return nil, fmt.Errorf("timer wheel memory of %d bytes: %d timers in %d slots need %d", len(mem), capacity, slots, Size(capacity, slots))
	}
	if uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, errors.New("timer wheel memory is not 8-byte aligned")
	}
	clear(mem[:Size(capacity, slots)])
	w := view(mem, uint32(capacity), uint32(slots))
	*w.hdr = header{magic: magic, version: version, capacity: uint32(capacity), slots: uint32(slots), cursor: now}
	for i := range w.heads {
		w.heads[i] = null
	}
	for i := range w.nodes {
		w.nodes[i] = node{next: null, prev: null}
	}
	return w, nil
}

// Attach returns a view of a wheel that Format laid out in mem, perhaps in
// another process.
func Attach(mem []byte) (*Wheel, error) {
	if len(mem) < headerSize || uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, errors.New("attach timer wheel: memory too small or misaligned")
	}
	h := (*header)(unsafe.Pointer(&mem[0]))
	if h.magic != magic || h.version != version {
		return nil, fmt.Errorf("attach timer wheel: bad magic %#x or version %d", h.magic, h.version)
	}
	c, s := h.capacity, h.slots
	if c < 1 || c >= null || s < 64 || s > 1<<24 || bits.OnesCount32(s) != 1 || len(mem) < Size(int(c), int(s)) {
		return nil, fmt.Errorf("attach timer wheel: header (capacity %d, slots %d) does not fit %d bytes", c, s, len(mem))
	}
	return view(mem, c, s), nil
}

func view(mem []byte, capacity, slots uint32) *Wheel {
	off := headerSize
	bm := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[off])), (slots+63)/64)
	off += int((slots+63)/64) * 8
	heads := unsafe.Slice((*uint32)(unsafe.Pointer(&mem[off])), slots)
	off += align8(int(slots) * 4)
	nodes := unsafe.Slice((*node)(unsafe.Pointer(&mem[off])), capacity)
	return &Wheel{hdr: (*header)(unsafe.Pointer(&mem[0])), bitmap: bm, heads: heads, nodes: nodes, mask: uint64(slots - 1)}
}

// Capacity is the number of timers.
func (w *Wheel) Capacity() int { return int(w.hdr.capacity) }

// ArmedCount is the number of timers armed.
func (w *Wheel) ArmedCount() int { return int(w.hdr.armedN) }

// Now is the wheel's clock: the last tick Expire processed, plus one.
func (w *Wheel) Now() Tick { return w.hdr.cursor }

func (w *Wheel) slot(t Tick) uint32 { return uint32(uint64(t) & w.mask) }

func (w *Wheel) setBit(s uint32)   { w.bitmap[s/64] |= 1 << (s % 64) }
func (w *Wheel) clearBit(s uint32) { w.bitmap[s/64] &^= 1 << (s % 64) }

// link puts node i at the head of its deadline's slot.
func (w *Wheel) link(i uint32, at Tick) {
	n := &w.nodes[i]
	s := w.slot(at)
	n.at, n.state, n.prev = at, armed, null
	n.next = w.heads[s]
	if n.next < w.hdr.capacity {
		w.nodes[n.next].prev = i
	}
	w.heads[s] = i
	w.setBit(s)
	w.hdr.armedN++
}

// unlink takes armed node i off its slot's list.
func (w *Wheel) unlink(i uint32) {
	n := &w.nodes[i]
	s := w.slot(n.at)
	if n.prev < w.hdr.capacity {
		w.nodes[n.prev].next = n.next
	} else {
		w.heads[s] = n.next
	}
	if n.next < w.hdr.capacity {
		w.nodes[n.next].prev = n.prev
	}
	if w.heads[s] == null {
		w.clearBit(s)
	}
	if w.hdr.minValid != 0 && n.at == w.hdr.min {
		w.hdr.minValid = 0
	}
	n.next, n.prev, n.state = null, null, idle
	w.hdr.armedN--
}

// Set arms timer id to fire at tick at (re-arming it if it was armed). A
// deadline already passed fires at the next Expire.
func (w *Wheel) Set(id ID, at Tick) error {
	i := uint32(id)
	if i >= w.hdr.capacity {
		return fmt.Errorf("timer %d out of range: capacity %d", id, w.hdr.capacity)
	}
	if w.nodes[i].state == armed {
		w.unlink(i)
	}
	at = max(at, w.hdr.cursor)
	w.link(i, at)
	if w.hdr.minValid != 0 && at < w.hdr.min {
		w.hdr.min = at
	} else if w.hdr.armedN == 1 {
		w.hdr.min, w.hdr.minValid = at, 1
	}
	return nil
}

// Cancel disarms timer id; cancelling an idle timer does nothing.
func (w *Wheel) Cancel(id ID) {
	i := uint32(id)
	if i < w.hdr.capacity && w.nodes[i].state == armed {
		w.unlink(i)
	}
}

// MayBeDue reports whether a timer might be due at now. It reads two
// words without taking the owner's lock (another process may be changing
// them): false is only a hint that a poll can skip the timers, true means
// look properly.
func (w *Wheel) MayBeDue(now Tick) bool {
	h := w.hdr
	if atomic.LoadUint32(&h.armedN) == 0 {
		return false
	}
	// Read without the owner's lock, each word atomically: a hint, but
	// never a torn one.
	min, cursor := Tick(atomic.LoadUint64((*uint64)(&h.min))), Tick(atomic.LoadUint64((*uint64)(&h.cursor)))
	return atomic.LoadUint32(&h.minValid) == 0 || min <= now || cursor <= now && min < cursor
}

// Earliest reads the earliest deadline without the owner's lock, as a
// hint (as MayBeDue): armed is false when no timer is armed; known is
// false when the wheel has forgotten its earliest deadline (the earliest
// timer was cancelled or fired) and only NextDeadline can tell.
func (w *Wheel) Earliest() (t Tick, known, armed bool) {
	h := w.hdr
	if atomic.LoadUint32(&h.armedN) == 0 {
		return 0, true, false
	}
	if atomic.LoadUint32(&h.minValid) == 0 {
		return 0, false, true
	}
	return Tick(atomic.LoadUint64((*uint64)(&h.min))), true, true
}

// Deadline reports when timer id fires, if it is armed.
func (w *Wheel) Deadline(id ID) (Tick, bool) {
	i := uint32(id)
	if i >= w.hdr.capacity || w.nodes[i].state != armed {
		return 0, false
	}
	return w.nodes[i].at, true
}

// NextDeadline is the earliest deadline of any armed timer: how long a
// thread with nothing else to do may sleep. ok is false when no timer is
// armed.
func (w *Wheel) NextDeadline() (t Tick, ok bool, err error) {
	if w.hdr.armedN == 0 {
		return 0, false, nil
	}
	if w.hdr.minValid != 0 && w.hdr.min >= w.hdr.cursor {
		return w.hdr.min, true, nil
	}
	t, err = w.earliest()
	if err != nil {
		return 0, false, err
	}
	w.hdr.min, w.hdr.minValid = t, 1
	return t, true, nil
}

// earliest finds the earliest deadline: first among the slots of the
// coming lap, in time order, else by looking at every armed timer.
func (w *Wheel) earliest() (Tick, error) {
	cur := w.hdr.cursor
	slots := uint64(w.mask + 1)
	for d := uint64(0); d < slots; {
		s := w.slot(cur + Tick(d))
		// Skip to the next non-empty slot.
		word := w.bitmap[s/64] >> (s % 64)
		if word == 0 {
			d += uint64(64 - s%64)
			continue
		}
		skip := uint64(bits.TrailingZeros64(word))
		if skip > 0 {
			d += skip
			continue
		}
		due := cur + Tick(d)
		found := false
		err := w.walk(s, func(i uint32) bool {
			if w.nodes[i].at == due {
				found = true
				return false
			}
			return true
		})
		if err != nil {
			return 0, err
		}
		if found {
			return due, nil
		}
		d++
	}
	// Nothing due within a lap: the minimum over every armed timer.
	best := ^Tick(0)
	for s := range w.heads {
		if w.heads[s] == null {
			continue
		}
		if err := w.walk(uint32(s), func(i uint32) bool { best = min(best, w.nodes[i].at); return true }); err != nil {
			return 0, err
		}
	}
	if best < cur {
		return 0, ErrCorrupt // armed timers are never due before the clock
	}
	return best, nil
}

// walk calls fn for each node of slot s's list until fn returns false. It
// checks every index and stops a list that is longer than the table.
func (w *Wheel) walk(s uint32, fn func(i uint32) bool) error {
	i := w.heads[s]
	for steps := uint32(0); i != null; steps++ {
		if i >= w.hdr.capacity || steps >= w.hdr.capacity || w.nodes[i].state != armed || w.slot(w.nodes[i].at) != s {
			return ErrCorrupt
		}
		next := w.nodes[i].next
		if !fn(i) {
			return nil
		}
		i = next
	}
	return nil
}

// Expire collects timers due at or before now into out, earliest first,
// disarming them, and returns how many. When out fills up before every
// due timer is collected, the next call carries on where this one stopped.
// It allocates nothing.
func (w *Wheel) Expire(now Tick, out []ID) (int, error) {
	n := 0
	h := w.hdr
	slots := Tick(w.mask + 1)
	for h.cursor <= now && n < len(out) {
		if h.armedN == 0 {
			h.cursor = now + 1
			break
		}
		// Far behind (a process that slept for laps): jump straight to the
		// earliest deadline instead of visiting every lap.
		if now-h.cursor >= slots {
			next, _, err := w.NextDeadline()
			if err != nil {
				return n, err
			}
			if next > now {
				h.cursor = now + 1
				break
			}
			h.cursor = next
		}
		s := w.slot(h.cursor)
		if w.bitmap[s/64]&(1<<(s%64)) == 0 {
			// Skip empty slots, up to now or the end of this bitmap word.
			word := w.bitmap[s/64] >> (s % 64)
			skip := Tick(64 - s%64)
			if word != 0 {
				skip = Tick(bits.TrailingZeros64(word))
			}
			h.cursor = min(h.cursor+skip, now+1)
			continue
		}
		due := h.cursor
		i := w.heads[s]
		for steps := uint32(0); i != null && n < len(out); steps++ {
			if i >= h.capacity || steps >= h.capacity || w.nodes[i].state != armed || w.slot(w.nodes[i].at) != s {
				return n, ErrCorrupt
			}
			next := w.nodes[i].next
			if w.nodes[i].at <= due {
				w.unlink(i)
				out[n] = ID(i)
				n++
			}
			i = next
		}
		if i == null {
			h.cursor++
		}
	}
	return n, nil
}

// Check walks the whole wheel and reports the first inconsistency: for
// tests and for the stack inspector.
func (w *Wheel) Check() error {
	h := w.hdr
	count := uint32(0)
	for s := range w.heads {
		bit := w.bitmap[s/64]&(1<<(uint(s)%64)) != 0
		if bit != (w.heads[s] != null) {
			return fmt.Errorf("%w: slot %d bitmap bit %v, head %d", ErrCorrupt, s, bit, w.heads[s])
		}
		prev := null
		for i, steps := w.heads[s], uint32(0); i != null; i, steps = w.nodes[i].next, steps+1 {
			if i >= h.capacity || steps >= h.capacity {
				return fmt.Errorf("%w: slot %d: bad index %d or a loop", ErrCorrupt, s, i)
			}
			n := &w.nodes[i]
			switch {
			case n.state != armed:
				return fmt.Errorf("%w: slot %d: timer %d linked but not armed", ErrCorrupt, s, i)
			case w.slot(n.at) != uint32(s):
				return fmt.Errorf("%w: timer %d due at %d is in slot %d", ErrCorrupt, i, n.at, s)
			case n.prev != prev:
				return fmt.Errorf("%w: timer %d: back link %d, want %d", ErrCorrupt, i, n.prev, prev)
			case n.at < h.cursor:
				return fmt.Errorf("%w: timer %d due at %d, before the clock %d", ErrCorrupt, i, n.at, h.cursor)
			}
			prev = i
			count++
		}
	}
	if count != h.armedN {
		return fmt.Errorf("%w: %d timers linked, header says %d armed", ErrCorrupt, count, h.armedN)
	}
	return nil
}
