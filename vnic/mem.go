package vnic

import (
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xdp-onload/onload/internal/impair"
)

// Impairment is what a Mem wire does to frames in one direction: loss
// (random and in bursts), duplication, corruption, reordering, delay with
// jitter and a rate limit (see internal/impair). Decisions come from a
// random source seeded by MemConfig.Seed, so the same sequence of
// transmits is impaired the same way on every run.
type Impairment = impair.Impairment

// MemConfig shapes an in-memory pair.
type MemConfig struct {
	Seed       uint64
	AtoB, BtoA Impairment
	FrameSize  int // each end's frame buffers (default 2048)
	FrameCount int // frames in each end's pool (default 4096)
	Headroom   int // default 256, as in a UMEM
	WireSlots  int // frames in flight per direction (default 4096)
	MTU        int // default 1500
	// Now is the clock that delays are measured on (default: monotonic
	// time). A test can drive it by hand.
	Now func() time.Duration
}

// Mem is one end of an in-memory wire. Each end has its own pool, as two
// hosts would; frames are copied across.
type Mem struct {
	pool  *Pool
	meta  []byte // the pool's metadata (PoolMeta)
	info  Info
	out   *wire // frames we send
	in    *wire // frames we receive
	stats Stats
	// closed is shared by both ends so that either end sees the pair shut.
	closed *atomic.Bool
	now    func() time.Duration
}

// NewMemPair returns two connected in-memory NICs.
func NewMemPair(cfg MemConfig) (a, b *Mem, err error) {
	if cfg.FrameSize == 0 {
		cfg.FrameSize = 2048
	}
	if cfg.FrameCount == 0 {
		cfg.FrameCount = 4096
	}
	if cfg.Headroom == 0 {
		cfg.Headroom = 256
	}
	if cfg.WireSlots == 0 {
		cfg.WireSlots = 4096
	}
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.WireSlots < 1 || cfg.WireSlots > 1<<20 {
		return nil, nil, fmt.Errorf("wire slots %d: must be from 1 to %d", cfg.WireSlots, 1<<20)
	}
	if cfg.MTU < 68 || cfg.MTU+14 > cfg.FrameSize-cfg.Headroom {
		return nil, nil, fmt.Errorf("mtu %d: must be from 68 to %d for %d-byte frames with %d bytes of headroom",
			cfg.MTU, cfg.FrameSize-cfg.Headroom-14, cfg.FrameSize, cfg.Headroom)
	}
	if err := cfg.AtoB.Check("a->b"); err != nil {
		return nil, nil, err
	}
	if err := cfg.BtoA.Check("b->a"); err != nil {
		return nil, nil, err
	}
	if cfg.Now == nil {
		start := time.Now()
		cfg.Now = func() time.Duration { return time.Since(start) }
	}
	closed := new(atomic.Bool)
	mk := func(name string, mac net.HardwareAddr) (*Mem, error) {
		if cfg.FrameCount < 1 || cfg.FrameCount > MaxFrames {
			return nil, fmt.Errorf("frame count %d: must be from 1 to %d", cfg.FrameCount, MaxFrames)
		}
		meta := make([]uint64, (PoolMetaSize(cfg.FrameCount)+7)/8)
		metaBytes := unsafeBytes(meta)
		p, err := NewPool(metaBytes, make([]byte, cfg.FrameSize*cfg.FrameCount), cfg.FrameSize, cfg.Headroom)
		if err != nil {
			return nil, err
		}
		return &Mem{pool: p, meta: metaBytes, info: Info{Name: "mem " + name, Mode: "memory", MTU: cfg.MTU, MAC: mac}, closed: closed, now: cfg.Now}, nil
	}
	if a, err = mk("a", net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0a}); err != nil {
		return nil, nil, err
	}
	if b, err = mk("b", net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0b}); err != nil {
		return nil, nil, err
	}
	ab := newWire(impair.NewLine(cfg.AtoB, cfg.WireSlots, cfg.FrameSize, cfg.Seed, 0xab))
	ba := newWire(impair.NewLine(cfg.BtoA, cfg.WireSlots, cfg.FrameSize, cfg.Seed, 0xba))
	a.out, a.in = ab, ba
	b.out, b.in = ba, ab
	return a, b, nil
}

var errClosed = errors.New("vnic: closed")

func (m *Mem) Pool() *Pool { return m.pool }

// Idle reports that no frame can be received now: the earliest frame on
// the wire (read without its lock) is not due yet.
func (m *Mem) Idle() bool { return m.in.nextAt.Load() > int64(m.now()) }

// Impair replaces the impairments of what this end sends from now on
// (frames already on the wire keep theirs): a test connects over a clean
// wire, then makes it lossy.
func (m *Mem) Impair(imp Impairment) error {
	if err := imp.Check("impair"); err != nil {
		return fmt.Errorf("vnic: %w", err)
	}
	m.out.mu.Lock()
	m.out.line.SetImpairment(imp)
	m.out.mu.Unlock()
	return nil
}

// Resync does nothing: a Mem pair lives in one process.
func (m *Mem) Resync()    {}
func (m *Mem) Info() Info { return m.info }

// Stats returns the end's counters, including the impairments the wire
// applied to what this end sent.
func (m *Mem) Stats() Stats {
	s := m.stats
	m.out.mu.Lock()
	c := m.out.line.Counters()
	s.Lost, s.Duplicated, s.Reordered, s.Corrupted, s.Delayed = c.Lost+c.BurstLost+c.Overflow, c.Duplicated, c.Reordered, c.Corrupted, c.Delayed
	s.TxErrors += c.NoSlot
	m.out.mu.Unlock()
	return s
}

// Close shuts both ends of the pair.
func (m *Mem) Close() error {
	m.closed.Store(true)
	return nil
}

// Transmit copies each frame onto the wire (where it may be impaired) and
// frees it.
func (m *Mem) Transmit(hs []Handle) (int, error) { return m.transmit(hs, false) }

// TransmitKeep copies each frame onto the wire; the caller keeps it. A Mem
// frame is never busy: the copy is made at once.
func (m *Mem) TransmitKeep(hs []Handle) (int, error) { return m.transmit(hs, true) }

func (m *Mem) transmit(hs []Handle, keep bool) (int, error) {
	w := m.out
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.closed.Load() {
		return 0, errClosed
	}
	now := m.now()
	var n uint32
	var err error
	for i, h := range hs {
		data := m.pool.Data(h)
		var ferr error
		switch {
		case data == nil:
			ferr = ErrStale
		case len(data) > m.info.MTU+14:
			ferr = fmt.Errorf("vnic: %d-byte frame exceeds mtu %d: %w", len(data), m.info.MTU, ErrTooLong)
		}
		if ferr != nil {
			// Refused alone: the frames after it still go.
			m.stats.TxErrors++
			if err == nil {
				err = ferr
			}
			continue
		}
		takeFront(hs, n, uint32(i))
		n++
		w.line.Send(data, now)
		w.sent(now)
		m.stats.TxFrames++
		m.stats.TxBytes += uint64(len(data))
		if !keep {
			m.pool.Free(h)
		}
	}
	return int(n), err
}

// Receive delivers the frames whose time has come, in arrival order, into
// frames of this end's pool. Frames that find the pool empty are dropped
// and counted, as a NIC with an empty fill ring would.
func (m *Mem) Receive(hs []Handle) int {
	w := m.in
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.closed.Load() {
		return 0
	}
	now := m.now()
	n := 0
	defer w.updateNext()
	for n < len(hs) {
		data := w.line.Receive(now)
		if data == nil {
			break
		}
		h := m.pool.Alloc()
		if h != Null {
			copy(m.pool.Buf(h), data)
			m.pool.SetLen(h, len(data))
			hs[n] = h
			n++
			m.stats.RxFrames++
			m.stats.RxBytes += uint64(len(data))
		} else {
			m.stats.RxDropped++
		}
	}
	return n
}

// PoolMeta is the pool's metadata (the frame descriptors with their links
// and owner words, the free stack): what another process holding the
// memory could write. Tests of hostile or broken writers use it.
func (m *Mem) PoolMeta() []byte { return m.meta }

// Interrupts is the channel on which an armed Mem signals, once, that a
// frame can be received: the in-memory NIC's interrupt line.
func (m *Mem) Interrupts() <-chan struct{} { return m.in.irq }

// Arm asks for one signal on Interrupts when a frame can be received: at
// once if one can now, else when the next one arrives or its delay ends.
func (m *Mem) Arm() {
	w := m.in
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = true
	if w.line.Len() > 0 {
		w.interruptAt(w.line.NextAt(), m.now())
	}
}

// Disarm withdraws the request; a signal already sent stays in the
// channel.
func (m *Mem) Disarm() {
	w := m.in
	w.mu.Lock()
	w.armed = false
	w.mu.Unlock()
}

// wire is one direction: an impair.Line under a lock, and the receiving
// end's interrupt.
type wire struct {
	mu   sync.Mutex
	line *impair.Line

	// nextAt is the delivery time of the earliest frame (MaxInt64: none),
	// for Idle to read without the lock.
	nextAt atomic.Int64

	// The receiving end's interrupt: armed asks for one signal on irq
	// when a frame can be received; timer delivers it for a delayed one.
	armed bool
	irq   chan struct{}
	timer *time.Timer
}

func newWire(l *impair.Line) *wire {
	w := &wire{line: l, irq: make(chan struct{}, 1)}
	w.nextAt.Store(math.MaxInt64)
	return w
}

func (w *wire) updateNext() { w.nextAt.Store(int64(w.line.NextAt())) }

// sent follows a frame onto the line. Called with w.mu held.
func (w *wire) sent(now time.Duration) {
	w.updateNext()
	if w.armed && w.line.Len() > 0 {
		w.interruptAt(w.line.NextAt(), now)
	}
}

// interruptAt signals the receiving end when the frame due at `at`
// can be received. Called with w.mu held.
func (w *wire) interruptAt(at, now time.Duration) {
	if at <= now {
		w.signalLocked()
		return
	}
	if w.timer == nil {
		w.timer = time.AfterFunc(at-now, func() {
			w.mu.Lock()
			if w.armed {
				w.signalLocked()
			}
			w.mu.Unlock()
		})
	} else {
		w.timer.Reset(at - now)
	}
}

func (w *wire) signalLocked() {
	w.armed = false
	select {
	case w.irq <- struct{}{}:
	default:
	}
}
