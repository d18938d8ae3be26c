package test

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/impair"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/xdp"
)

// PathConfig shapes a faulty path.
type PathConfig struct {
	// AtoB and BtoA are the faults applied to IPv4 frames in each
	// direction (ARP and the rest go through untouched, so that the hosts
	// always find each other). CorruptSkip defaults to 14: the Ethernet
	// header is never corrupted.
	AtoB, BtoA vnic.Impairment
	Seed       uint64
	MTU        int // default 1500
	// Slots is how many frames each direction can hold in flight: delayed,
	// queued behind the rate limit, or held back to reorder (default
	// 32768).
	Slots int
}

// Path is three hosts in a line, A — M — B: A and B share one subnet (A is
// .1, B is .2) and M, which has no address, forwards every frame between
// them with AF_XDP (the steering object's forward program on both of its
// interfaces), applying the faults of each direction in user space: the
// netem this kernel does not have.
type Path struct {
	Net     *Net
	A, M, B *Host
	// IfA and IfB are A's and B's interfaces.
	IfA, IfB *Iface
	fwd      *forwarder
}

// FaultyPath makes a Path for a test and tears it down when the test ends.
// It skips the test when not root.
func FaultyPath(tb testing.TB, cfg PathConfig) *Path {
	tb.Helper()
	RequireRoot(tb)
	p, err := NewPath(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// NewPath makes the three hosts and starts M's forwarder.
func NewPath(cfg PathConfig) (*Path, error) {
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.Slots == 0 {
		cfg.Slots = 32768
	}
	if cfg.Slots < 64 || cfg.Slots > 1<<20 {
		return nil, fmt.Errorf("path: %d slots: must be from 64 to %d", cfg.Slots, 1<<20)
	}
	if cfg.MTU < 68 || cfg.MTU > 1500 {
		return nil, fmt.Errorf("path: mtu %d: must be from 68 to 1500 (one AF_XDP frame)", cfg.MTU)
	}
	if err := checkFaults(&cfg.AtoB, &cfg.BtoA); err != nil {
		return nil, err
	}
	n, err := NewNet()
	if err != nil {
		return nil, err
	}
	p := &Path{Net: n}
	fail := func(err error) (*Path, error) {
		p.Close()
		return nil, fmt.Errorf("path: %w", err)
	}
	for _, h := range []struct {
		h    **Host
		name string
	}{{&p.A, "a"}, {&p.M, "m"}, {&p.B, "b"}} {
		if *h.h, err = n.AddHost(h.name); err != nil {
			return fail(err)
		}
	}
	o := LinkOptions{MTU: cfg.MTU}
	n.mu.Lock()
	subnet, err := n.subnetLocked()
	var mA, mB *Iface
	if err == nil {
		p.IfA, mA, err = n.linkLocked(p.A, p.M, o, hostPrefix(subnet, 1), netip.Prefix{})
	}
	if err == nil {
		mB, p.IfB, err = n.linkLocked(p.M, p.B, o, netip.Prefix{}, hostPrefix(subnet, 2))
	}
	n.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	// A and B see each other's MAC on the link (for tests that build
	// frames), though the frames pass through M.
	p.IfA.Peer, p.IfB.Peer = p.IfB, p.IfA
	if p.fwd, err = newForwarder([2]*Iface{mA, mB}, cfg); err != nil {
		return fail(err)
	}
	return p, nil
}

// Impair replaces the faults of each direction for frames sent from now on.
func (p *Path) Impair(aToB, bToA vnic.Impairment) error {
	if err := checkFaults(&aToB, &bToA); err != nil {
		return err
	}
	f := p.fwd
	f.mu.Lock()
	f.lines[0].SetImpairment(aToB)
	f.lines[1].SetImpairment(bToA)
	f.mu.Unlock()
	return nil
}

// checkFaults validates both directions' faults and fills in defaults,
// among them CorruptSkip: the Ethernet header is never corrupted.
func checkFaults(aToB, bToA *vnic.Impairment) error {
	for _, d := range []struct {
		imp  *vnic.Impairment
		name string
	}{{aToB, "a->b"}, {bToA, "b->a"}} {
		if d.imp.CorruptSkip == 0 {
			d.imp.CorruptSkip = 14
		}
		if err := d.imp.Check(d.name); err != nil {
			return fmt.Errorf("path: %w", err)
		}
	}
	return nil
}

// Counters returns what each direction's faults did so far.
func (p *Path) Counters() (aToB, bToA impair.Counters) {
	f := p.fwd
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lines[0].Counters(), f.lines[1].Counters()
}

// Tap calls fn with every frame M receives (side 0: from A, 1: from B)
// until it is called with nil. fn runs on the forwarder's goroutine and
// must not keep the slice.
func (p *Path) Tap(fn func(side int, frame []byte)) {
	if fn == nil {
		p.fwd.tap.Store(nil)
	} else {
		p.fwd.tap.Store(&fn)
	}
}

// Drops counts frames the forwarder itself lost (no free frame on the far
// side): not a fault it was asked for, so a test wants it at 0.
func (p *Path) Drops() uint64 { return p.fwd.txDrops.Load() }

// Close stops the forwarder and deletes the hosts.
func (p *Path) Close() error {
	var errs []error
	if p.fwd != nil {
		errs = append(errs, p.fwd.close())
		p.fwd = nil
	}
	if p.Net != nil {
		errs = append(errs, p.Net.Close())
	}
	return errors.Join(errs...)
}

// forwarder is M's data path: per interface, the forward program and an
// AF_XDP socket on queue 0; per direction, an impair.Line. One goroutine
// on its own thread moves frames: it spins briefly when work stops, then
// sleeps in ppoll until a frame arrives or the next delayed one is due.
type forwarder struct {
	nics     [2]*vnic.XDP // 0 faces A, 1 faces B
	steering [2]*bpf.Steering
	attach   [2]*xdp.Attachment

	mu    sync.Mutex // guards lines
	lines [2]*impair.Line

	// Frames the NICs' TX rings had no room for, sent first next round.
	pending [2][]vnic.Handle
	// txDrops counts frames dropped because the far NIC had no frame or
	// refused one: the forwarder's own losses, which a test wants at 0.
	txDrops atomic.Uint64

	// tap, if set, sees every frame M receives, from A's side (0) or
	// B's (1), before faults: an on-path observer.
	tap atomic.Pointer[func(side int, frame []byte)]

	stop atomic.Bool
	done chan struct{}
}

func newForwarder(ifs [2]*Iface, cfg PathConfig) (*forwarder, error) {
	f := &forwarder{done: make(chan struct{})}
	for i := range f.pending {
		f.pending[i] = make([]vnic.Handle, 0, 4*fwdBatch)
	}
	for i, ifc := range ifs {
		err := ifc.Host.Do(func() error {
			s, err := bpf.Load()
			if err != nil {
				return err
			}
			f.steering[i] = s
			if f.attach[i], err = xdp.Attach(s.ForwardProgram(), ifc.Name, xdp.AttachNative); err != nil {
				return err
			}
			if f.nics[i], err = vnic.OpenXDP(vnic.XDPConfig{Interface: ifc.Name, FillDepth: 1024}); err != nil {
				return err
			}
			return s.SetSocket(0, 0, f.nics[i].FD())
		})
		if err != nil {
			f.closeNICs()
			return nil, fmt.Errorf("forwarder on %s: %w", ifc.Name, err)
		}
	}
	size := cfg.MTU + 14
	f.lines[0] = impair.NewLine(cfg.AtoB, cfg.Slots, size, cfg.Seed, 0xab)
	f.lines[1] = impair.NewLine(cfg.BtoA, cfg.Slots, size, cfg.Seed, 0xba)
	go f.run()
	return f, nil
}

func (f *forwarder) close() error {
	f.stop.Store(true)
	<-f.done
	return f.closeNICs()
}

func (f *forwarder) closeNICs() error {
	var errs []error
	for i := range 2 {
		if f.attach[i] != nil {
			errs = append(errs, f.attach[i].Close())
		}
		if f.nics[i] != nil {
			errs = append(errs, f.nics[i].Close())
		}
		if f.steering[i] != nil {
			errs = append(errs, f.steering[i].Close())
		}
	}
	return errors.Join(errs...)
}

const (
	fwdBatch = 64
	fwdSpin  = 50 * time.Microsecond
	fwdNap   = 5 * time.Millisecond // longest sleep, so that stop is seen
)

func (f *forwarder) run() {
	defer close(f.done)
	runtime.LockOSThread()
	// Sleep to the microsecond: a rate-limited line releases a frame
	// every few tens of them.
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	start := time.Now()
	hs := make([]vnic.Handle, fwdBatch)
	fds := []unix.PollFd{{Fd: int32(f.nics[0].FD()), Events: unix.POLLIN}, {Fd: int32(f.nics[1].FD()), Events: unix.POLLIN}}
	idleSince := time.Duration(-1)
	for !f.stop.Load() {
		now := time.Since(start)
		moved := 0
		f.mu.Lock()
		for d := range 2 {
			moved += f.step(d, now, hs)
		}
		next := min(f.lines[0].NextAt(), f.lines[1].NextAt())
		f.mu.Unlock()
		if moved > 0 || len(f.pending[0])+len(f.pending[1]) > 0 {
			idleSince = -1
			continue
		}
		if idleSince < 0 {
			idleSince = now
		}
		if now-idleSince < fwdSpin || next <= now {
			continue
		}
		wait := min(next-now, fwdNap)
		ts := unix.NsecToTimespec(int64(wait))
		unix.Ppoll(fds, &ts, nil)
		idleSince = -1
	}
}

// step moves frames received on NIC d onto line d (or straight through,
// for what is not IPv4), and line d's due frames out of NIC 1-d. It
// returns how many frames it moved. Called with f.mu held.
func (f *forwarder) step(d int, now time.Duration, hs []vnic.Handle) int {
	in, out, line := f.nics[d], f.nics[1-d], f.lines[d]
	inPool, outPool := in.Pool(), out.Pool()
	tx := f.pending[1-d]
	n := in.Receive(hs)
	tap := f.tap.Load()
	for _, h := range hs[:n] {
		data := inPool.Data(h)
		if tap != nil {
			(*tap)(d, data)
		}
		if len(data) >= 14 && data[12] == 0x08 && data[13] == 0x00 {
			line.Send(data, now)
		} else {
			tx = f.appendCopy(tx, outPool, data)
		}
		inPool.Free(h)
	}
	moved := n
	for len(tx) < fwdBatch {
		data := line.Receive(now)
		if data == nil {
			break
		}
		tx = f.appendCopy(tx, outPool, data)
		moved++
	}
	if len(tx) > 0 {
		sent, err := out.Transmit(tx)
		if err != nil {
			// A frame the NIC refused (too long): drop it, keep the rest.
			outPool.Free(tx[sent])
			f.txDrops.Add(1)
			sent++
		}
		tx = tx[:copy(tx, tx[sent:])]
	}
	f.pending[1-d] = tx
	return moved
}

func (f *forwarder) appendCopy(tx []vnic.Handle, pool *vnic.Pool, data []byte) []vnic.Handle {
	h := pool.Alloc()
	if h == vnic.Null {
		f.txDrops.Add(1)
		return tx
	}
	copy(pool.Buf(h), data)
	pool.SetLen(h, len(data))
	return append(tx, h)
}
