package vnic_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/vnic/vnictest"
)

var (
	endA = pkt.Endpoint{Addr: netip.MustParseAddrPort("198.18.0.1:4000")}
	endB = pkt.Endpoint{Addr: netip.MustParseAddrPort("198.18.0.2:5000")}
)

func memPair(t *testing.T, cfg vnic.MemConfig) (*vnic.Mem, *vnic.Mem) {
	t.Helper()
	a, b, err := vnic.NewMemPair(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, b
}

func TestMemContract(t *testing.T) {
	vnictest.Run(t, func(t *testing.T) vnictest.Pair {
		a, b := memPair(t, vnic.MemConfig{FrameCount: 512})
		ea, eb := endA, endB
		ea.MAC, eb.MAC = a.Info().MAC, b.Info().MAC
		return vnictest.Pair{A: a, B: b, AEnd: ea, BEnd: eb}
	})
}

// sendN sends n numbered UDP frames from a and returns what b receives, in
// order, as sequence numbers (-1 for a frame that fails its checksum).
func sendN(t *testing.T, a, b *vnic.Mem, n int, advance func()) []int {
	t.Helper()
	var got []int
	hs := make([]vnic.Handle, 64)
	drain := func() {
		for {
			k := b.Receive(hs)
			if k == 0 {
				return
			}
			for _, h := range hs[:k] {
				f, err := pkt.Parse(b.Pool().Data(h))
				if err != nil {
					got = append(got, -1)
				} else {
					got = append(got, int(binary.BigEndian.Uint32(f.Payload)))
				}
				b.Pool().Free(h)
			}
		}
	}
	for i := range n {
		h := a.Pool().Alloc()
		var body [64]byte
		binary.BigEndian.PutUint32(body[:], uint32(i))
		l, _ := pkt.UDP(a.Pool().Buf(h), endA, endB, body[:])
		a.Pool().SetLen(h, l)
		if k, err := a.Transmit([]vnic.Handle{h}); k != 1 || err != nil {
			t.Fatalf("transmit %d: %d %v", i, k, err)
		}
		if advance != nil {
			advance()
		}
		drain()
	}
	if advance != nil {
		for range 1000 {
			advance()
		}
	}
	drain()
	return got
}

// manual is a clock a test moves by hand.
type manual struct{ t time.Duration }

func (m *manual) now() time.Duration { return m.t }

func TestMemLoss(t *testing.T) {
	a, b := memPair(t, vnic.MemConfig{Seed: 1, AtoB: vnic.Impairment{Loss: 0.1}})
	const n = 20000
	got := sendN(t, a, b, n, nil)
	lost := n - len(got)
	// 10% of 20000 is 2000, sd ~42: allow 5 sd.
	if math.Abs(float64(lost)-2000) > 210 {
		t.Errorf("lost %d of %d frames, want about 2000", lost, n)
	}
	if s := a.Stats(); s.Lost != uint64(lost) {
		t.Errorf("Stats.Lost = %d, want %d", s.Lost, lost)
	}
	for i := 1; i < len(got); i++ {
		if got[i] <= got[i-1] {
			t.Fatalf("loss alone reordered frames: %d after %d", got[i], got[i-1])
		}
	}
}

// TestMemImpair changes a clean wire into a lossless-then-lossy one, and
// rejects a probability out of range with an error naming it.
func TestMemImpair(t *testing.T) {
	a, b := memPair(t, vnic.MemConfig{Seed: 1})
	if got := sendN(t, a, b, 1000, nil); len(got) != 1000 {
		t.Fatalf("clean wire delivered %d of 1000", len(got))
	}
	if err := a.Impair(vnic.Impairment{Loss: 2}); err == nil || !strings.Contains(err.Error(), "loss probability 2") {
		t.Fatalf("Impair(Loss: 2): %v", err)
	}
	if err := a.Impair(vnic.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	if got := sendN(t, a, b, 100, nil); len(got) != 0 {
		t.Fatalf("a wire losing everything delivered %d frames", len(got))
	}
}

func TestMemDuplicate(t *testing.T) {
	a, b := memPair(t, vnic.MemConfig{Seed: 2, AtoB: vnic.Impairment{Duplicate: 0.05}})
	const n = 10000
	got := sendN(t, a, b, n, nil)
	dups := len(got) - n
	if math.Abs(float64(dups)-500) > 110 {
		t.Errorf("%d duplicates of %d frames, want about 500", dups, n)
	}
	if a.Stats().Duplicated != uint64(dups) {
		t.Errorf("Stats.Duplicated = %d, want %d", a.Stats().Duplicated, dups)
	}
}

func TestMemCorrupt(t *testing.T) {
	a, b := memPair(t, vnic.MemConfig{Seed: 3, AtoB: vnic.Impairment{Corrupt: 0.2}})
	const n = 5000
	got := sendN(t, a, b, n, nil)
	bad := 0
	for _, s := range got {
		if s < 0 {
			bad++
		}
	}
	c := int(a.Stats().Corrupted)
	if math.Abs(float64(c)-1000) > 150 {
		t.Errorf("%d corrupted of %d, want about 1000", c, n)
	}
	// Every flipped bit is caught by a checksum, bar flips in the MAC
	// addresses or in fields that do not reach the parser's checks: nearly
	// all of them.
	if bad < c*8/10 || bad > c {
		t.Errorf("%d frames failed their checksum, %d were corrupted", bad, c)
	}
}

func TestMemDelayAndReorder(t *testing.T) {
	clk := &manual{}
	a, b := memPair(t, vnic.MemConfig{Seed: 4, Now: clk.now,
		AtoB: vnic.Impairment{Delay: 5 * time.Millisecond, Reorder: 0.1, ReorderDelay: 3 * time.Millisecond}})
	h := a.Pool().Alloc()
	l, _ := pkt.UDP(a.Pool().Buf(h), endA, endB, make([]byte, 4))
	a.Pool().SetLen(h, l)
	a.Transmit([]vnic.Handle{h})
	hs := make([]vnic.Handle, 4)
	clk.t = 4 * time.Millisecond
	if b.Receive(hs) != 0 {
		t.Fatal("frame arrived before its delay")
	}
	clk.t = 9 * time.Millisecond // long enough even if it was held back
	if n := b.Receive(hs); n != 1 {
		t.Fatalf("frame did not arrive after its delay: %d", n)
	}
	b.Pool().Free(hs[0])

	got := sendN(t, a, b, 2000, func() { clk.t += 100 * time.Microsecond })
	if len(got) != 2000 {
		t.Fatalf("received %d of 2000", len(got))
	}
	out := 0
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			out++
		}
	}
	if out < 100 || out > 300 {
		t.Errorf("%d frames out of order, want about 200", out)
	}
}

// TestMemDeterministic checks that the same seed impairs the same way and
// another seed does not.
func TestMemDeterministic(t *testing.T) {
	run := func(seed uint64) [32]byte {
		imp := vnic.Impairment{Loss: 0.05, Duplicate: 0.05, Corrupt: 0.05, Reorder: 0.05}
		clk := &manual{}
		a, b := memPair(t, vnic.MemConfig{Seed: seed, AtoB: imp, Now: clk.now})
		got := sendN(t, a, b, 3000, func() { clk.t += 50 * time.Microsecond })
		var buf bytes.Buffer
		for _, g := range got {
			binary.Write(&buf, binary.BigEndian, int32(g))
		}
		return sha256.Sum256(buf.Bytes())
	}
	if run(7) != run(7) {
		t.Error("same seed, different outcome")
	}
	if run(7) == run(8) {
		t.Error("different seeds, same outcome")
	}
}

func TestMemConfigErrors(t *testing.T) {
	for name, cfg := range map[string]vnic.MemConfig{
		"loss 1.5":       {AtoB: vnic.Impairment{Loss: 1.5}},
		"negative delay": {BtoA: vnic.Impairment{Delay: -1}},
		"NaN reorder":    {AtoB: vnic.Impairment{Reorder: math.NaN()}},
		"mtu too big":    {MTU: 9000},
		"no frames":      {FrameCount: -1},
	} {
		if _, _, err := vnic.NewMemPair(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestMemRxNoBuffers checks that a receiver whose pool is empty drops and
// counts, and recovers when frames come back.
func TestMemRxNoBuffers(t *testing.T) {
	a, b := memPair(t, vnic.MemConfig{FrameCount: 16})
	held := make([]vnic.Handle, 16)
	if b.Pool().AllocBatch(held) != 16 {
		t.Fatal("could not take every frame")
	}
	if got := sendN(t, a, b, 3, nil); len(got) != 0 {
		t.Fatalf("received %d frames with no buffers", len(got))
	}
	if b.Stats().RxDropped != 3 {
		t.Errorf("RxDropped = %d, want 3", b.Stats().RxDropped)
	}
	for _, h := range held {
		b.Pool().Free(h)
	}
	if got := sendN(t, a, b, 3, nil); len(got) != 3 {
		t.Errorf("after frames returned: received %d of 3", len(got))
	}
}

// TestMemInterrupts checks the in-memory interrupt line: an armed end is
// signalled once when a frame arrives (at once, or when its delay ends),
// an unarmed one never.
func TestMemInterrupts(t *testing.T) {
	a, b := memPair(t, vnic.MemConfig{AtoB: vnic.Impairment{Delay: 30 * time.Millisecond}})
	send := func(from *vnic.Mem) {
		t.Helper()
		h := from.Pool().Alloc()
		l, _ := pkt.UDP(from.Pool().Buf(h), endA, endB, []byte("irq"))
		from.Pool().SetLen(h, l)
		if k, err := from.Transmit([]vnic.Handle{h}); k != 1 || err != nil {
			t.Fatalf("transmit: %d %v", k, err)
		}
	}
	quiet := func(m *vnic.Mem, d time.Duration) {
		t.Helper()
		select {
		case <-m.Interrupts():
			t.Fatal("interrupt without cause")
		case <-time.After(d):
		}
	}
	expect := func(m *vnic.Mem, within time.Duration) {
		t.Helper()
		select {
		case <-m.Interrupts():
		case <-time.After(within):
			t.Fatalf("no interrupt within %v", within)
		}
	}

	// b -> a has no delay: arming then sending signals at once.
	send(b)
	quiet(a, 20*time.Millisecond) // not armed
	a.Arm()                       // a frame is already waiting
	expect(a, time.Second)
	hs := make([]vnic.Handle, 4)
	for n := a.Receive(hs); n > 0; n = a.Receive(hs) {
		for _, h := range hs[:n] {
			a.Pool().Free(h)
		}
	}
	a.Arm()
	quiet(a, 10*time.Millisecond)
	send(b)
	expect(a, time.Second)
	a.Disarm()
	send(b)
	quiet(a, 20*time.Millisecond)

	// a -> b is delayed 30ms: the signal comes when the frame is due.
	b.Arm()
	start := time.Now()
	send(a)
	expect(b, time.Second)
	if d := time.Since(start); d < 25*time.Millisecond {
		t.Errorf("interrupt after %v, before the frame's 30ms delay ended", d)
	}
	if n := b.Receive(hs); n != 1 {
		t.Errorf("after the interrupt, Receive = %d frames, want 1", n)
	}
}
