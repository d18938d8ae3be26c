// Package impair is one direction of a faulty link: frames go in, and come
// out lost, in bursts or alone, duplicated, corrupted, held back, delayed
// with jitter, or queued behind a rate limit, as decided by a seeded random
// source so that the same sequence of frames is impaired the same way on
// every run. The in-memory NIC (vnic.Mem) and the fault injector of the
// test hosts (test.Path) both use it.
//
// A Line copies each frame into one of a fixed number of slots and keeps
// the slots in a min-heap by delivery time: nothing is allocated per frame.
// A Line is not safe for concurrent use.
package impair

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Impairment is what a line does to frames. Each probability applies to
// each frame independently.
type Impairment struct {
	Loss float64 // probability a frame is lost
	// BurstLoss is the probability that a burst of losses starts at a
	// frame; the burst loses BurstLen frames in a row (default 10). A
	// burst is a short outage: it ends early when the line is quiet for
	// BurstGap (default 1ms), so that a sender backing off finds the line
	// working after it, as it would on a real link (one that waited for
	// the next ten frames however long they took would turn a burst into
	// minutes of exponential backoff, for any TCP).
	BurstLoss float64
	BurstLen  int
	BurstGap  time.Duration
	Duplicate float64 // probability a frame is delivered twice
	// Corrupt is the probability that one bit of the frame is flipped,
	// never in its first CorruptSkip bytes (an Ethernet header, say).
	Corrupt     float64
	CorruptSkip int
	// Reorder is the probability a frame is held back by ReorderDelay
	// (default 1ms), so that the frames sent after it overtake it.
	Reorder      float64
	ReorderDelay time.Duration
	// Delay is added to every frame, with a uniform extra in [0, Jitter).
	// Jitter does not reorder: a frame is never delivered before one sent
	// ahead of it (as on a path of FIFO queues); Reorder does that.
	Delay  time.Duration
	Jitter time.Duration
	// Rate limits the line to so many bits per second (0: no limit):
	// frames wait their turn in a queue of at most QueueBytes (default
	// 64 KiB) and are dropped when it is full (tail drop, counted as
	// Overflow), as a token bucket with a burst of one frame would.
	Rate       int64
	QueueBytes int
}

// Check validates the impairment and fills in defaults; dir names the
// direction in errors.
func (i *Impairment) Check(dir string) error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"loss", i.Loss}, {"burst loss", i.BurstLoss}, {"duplicate", i.Duplicate}, {"corrupt", i.Corrupt}, {"reorder", i.Reorder}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("%s %s probability %v: must be from 0 to 1", dir, p.name, p.v)
		}
	}
	if i.Delay < 0 || i.Jitter < 0 || i.ReorderDelay < 0 || i.BurstGap < 0 {
		return fmt.Errorf("%s delays must not be negative", dir)
	}
	if i.BurstLen < 0 || i.CorruptSkip < 0 || i.Rate < 0 || i.QueueBytes < 0 {
		return fmt.Errorf("%s burst length, corrupt skip, rate and queue must not be negative", dir)
	}
	if i.Reorder > 0 && i.ReorderDelay == 0 {
		i.ReorderDelay = time.Millisecond
	}
	if i.BurstLoss > 0 && i.BurstLen == 0 {
		i.BurstLen = 10
	}
	if i.BurstLoss > 0 && i.BurstGap == 0 {
		i.BurstGap = time.Millisecond
	}
	if i.Rate > 0 && i.QueueBytes == 0 {
		i.QueueBytes = 64 << 10
	}
	return nil
}

// Counters count what a line did.
type Counters struct {
	Sent, Delivered                   uint64
	Lost, BurstLost, Overflow, NoSlot uint64
	Duplicated, Reordered, Corrupted  uint64
	Delayed                           uint64
}

// Line is one direction of a link.
type Line struct {
	imp   Impairment
	rng   *rand.Rand
	slots []byte
	size  int
	lens  []uint16
	free  []uint32
	heap  []entry
	seq   uint64

	burstLeft int
	lastSent  time.Duration
	lastAt    time.Duration // delivery time of the last in-order frame
	busyUntil time.Duration // when the rate limiter's queue drains

	c Counters
}

type entry struct {
	at   time.Duration
	seq  uint64
	slot uint32
}

// NewLine makes a line that holds up to slots frames of up to size bytes.
// imp must have passed Check.
func NewLine(imp Impairment, slots, size int, seed1, seed2 uint64) *Line {
	l := &Line{
		imp: imp, rng: rand.New(rand.NewPCG(seed1, seed2)), size: size,
		slots: make([]byte, slots*size),
		lens:  make([]uint16, slots),
		free:  make([]uint32, slots),
		heap:  make([]entry, 0, slots),
	}
	for i := range l.free {
		l.free[i] = uint32(slots - 1 - i)
	}
	return l
}

// SetImpairment replaces the impairment for frames sent from now on;
// frames on the line keep theirs. imp must have passed Check.
func (l *Line) SetImpairment(imp Impairment) { l.imp = imp }

// Counters returns what the line has done so far.
func (l *Line) Counters() Counters { return l.c }

// Len is the number of frames on the line.
func (l *Line) Len() int { return len(l.heap) }

// NextAt is the delivery time of the earliest frame, or MaxInt64 when the
// line is empty.
func (l *Line) NextAt() time.Duration {
	if len(l.heap) == 0 {
		return math.MaxInt64
	}
	return l.heap[0].at
}

// Send impairs one frame sent at now and queues the copies that survive.
// Frames longer than the slots are counted as NoSlot and dropped.
func (l *Line) Send(data []byte, now time.Duration) {
	imp := &l.imp
	l.c.Sent++
	if l.burstLeft > 0 && now-l.lastSent > imp.BurstGap {
		l.burstLeft = 0
	}
	l.lastSent = now
	if l.burstLeft > 0 {
		l.burstLeft--
		l.c.BurstLost++
		return
	}
	if imp.BurstLoss > 0 && l.rng.Float64() < imp.BurstLoss {
		l.burstLeft = imp.BurstLen - 1
		l.c.BurstLost++
		return
	}
	if imp.Loss > 0 && l.rng.Float64() < imp.Loss {
		l.c.Lost++
		return
	}
	depart := now
	if imp.Rate > 0 {
		start := max(now, l.busyUntil)
		queued := int64(start-now) * imp.Rate / 8 / int64(time.Second)
		if queued+int64(len(data)) > int64(imp.QueueBytes) {
			l.c.Overflow++
			return
		}
		l.busyUntil = start + time.Duration(int64(len(data))*8*int64(time.Second)/imp.Rate)
		depart = l.busyUntil
	}
	copies := 1
	if imp.Duplicate > 0 && l.rng.Float64() < imp.Duplicate {
		copies = 2
		l.c.Duplicated++
	}
	for range copies {
		if len(l.free) == 0 || len(data) > l.size {
			l.c.NoSlot++
			return
		}
		slot := l.free[len(l.free)-1]
		l.free = l.free[:len(l.free)-1]
		b := l.buf(slot)
		copy(b, data)
		l.lens[slot] = uint16(len(data))
		if imp.Corrupt > 0 && len(data) > imp.CorruptSkip && l.rng.Float64() < imp.Corrupt {
			bit := imp.CorruptSkip*8 + l.rng.IntN((len(data)-imp.CorruptSkip)*8)
			b[bit/8] ^= 1 << (bit % 8)
			l.c.Corrupted++
		}
		at := depart + imp.Delay
		if imp.Jitter > 0 {
			at += time.Duration(l.rng.Int64N(int64(imp.Jitter)))
		}
		if imp.Reorder > 0 && l.rng.Float64() < imp.Reorder {
			at += imp.ReorderDelay
			l.c.Reordered++
		} else {
			at = max(at, l.lastAt)
			l.lastAt = at
		}
		if at > now {
			l.c.Delayed++
		}
		l.push(entry{at: at, seq: l.seq, slot: slot})
		l.seq++
	}
}

// Receive returns the earliest frame due at now, or nil. The bytes stay
// valid until the next call to Send or Receive.
func (l *Line) Receive(now time.Duration) []byte {
	if len(l.heap) == 0 || l.heap[0].at > now {
		return nil
	}
	e := l.pop()
	l.free = append(l.free, e.slot)
	l.c.Delivered++
	return l.buf(e.slot)[:l.lens[e.slot]]
}

func (l *Line) buf(slot uint32) []byte {
	off := int(slot) * l.size
	return l.slots[off : off+l.size]
}

func (a entry) less(b entry) bool {
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (l *Line) push(e entry) {
	l.heap = append(l.heap, e)
	i := len(l.heap) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !l.heap[i].less(l.heap[p]) {
			break
		}
		l.heap[i], l.heap[p] = l.heap[p], l.heap[i]
		i = p
	}
}

func (l *Line) pop() entry {
	top := l.heap[0]
	last := len(l.heap) - 1
	l.heap[0] = l.heap[last]
	l.heap = l.heap[:last]
	i := 0
	for {
		a, b, m := 2*i+1, 2*i+2, i
		if a < last && l.heap[a].less(l.heap[m]) {
			m = a
		}
		if b < last && l.heap[b].less(l.heap[m]) {
			m = b
		}
		if m == i {
			return top
		}
		l.heap[i], l.heap[m] = l.heap[m], l.heap[i]
		i = m
	}
}
