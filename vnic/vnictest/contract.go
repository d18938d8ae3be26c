// Package vnictest is the contract every vnic.NIC implementation must meet.
// An implementation's tests call Run with a function that makes a fresh
// connected pair.
package vnictest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/vnic"
)

// Pair is two NICs joined by a wire, with the endpoints frames between them
// must carry for the wire to deliver them (an XDP pair delivers only what
// its steering program redirects).
type Pair struct {
	A, B       vnic.NIC
	AEnd, BEnd pkt.Endpoint
}

// Run runs the contract against pairs made by newPair, one per subtest.
// newPair should register cleanup with t.
func Run(t *testing.T, newPair func(t *testing.T) Pair) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, Pair)
	}{
		{"RoundTrip", testRoundTrip},
		{"BothWays", testBothWays},
		{"Recycling", testRecycling},
		{"Handles", testHandles},
		{"Exhaustion", testExhaustion},
		{"FrameSizes", testFrameSizes},
		{"Idle", testIdle},
		{"TransmitKeep", testTransmitKeep},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, newPair(t)) })
	}
}

const timeout = 10 * time.Second

// payload is the content of frame seq of size n: the sequence number then
// a pattern that depends on both.
func payload(seq uint32, n int) []byte {
	b := make([]byte, n)
	if n >= 4 {
		binary.BigEndian.PutUint32(b, seq)
	}
	for i := 4; i < n; i++ {
		b[i] = byte(int(seq)*7 + i)
	}
	return b
}

// build allocates a frame on nic and writes a UDP datagram into it.
func build(t testing.TB, nic vnic.NIC, src, dst pkt.Endpoint, body []byte) (vnic.Handle, []byte) {
	t.Helper()
	p := nic.Pool()
	h := p.Alloc()
	if h == vnic.Null {
		t.Fatalf("%s: pool empty (%+v)", nic.Info().Name, p.Stats())
	}
	n, err := pkt.UDP(p.Buf(h), src, dst, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SetLen(h, n); err != nil {
		t.Fatal(err)
	}
	return h, append([]byte(nil), p.Data(h)...)
}

// send transmits every frame, retrying while the ring is full.
func send(t testing.TB, nic vnic.NIC, hs []vnic.Handle) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for len(hs) > 0 {
		n, err := nic.Transmit(hs)
		if err != nil {
			t.Fatalf("%s: transmit: %v", nic.Info().Name, err)
		}
		hs = hs[n:]
		if n == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: transmit made no progress for %v", nic.Info().Name, timeout)
			}
			// Let completions come back.
			var none [0]vnic.Handle
			nic.Receive(none[:])
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// collect receives until want frames have arrived or the timeout passes,
// copies their bytes, frees them and returns the copies.
func collect(t testing.TB, nic vnic.NIC, want int) [][]byte {
	t.Helper()
	var got [][]byte
	hs := make([]vnic.Handle, 64)
	deadline := time.Now().Add(timeout)
	for len(got) < want {
		n := nic.Receive(hs)
		for _, h := range hs[:n] {
			got = append(got, append([]byte(nil), nic.Pool().Data(h)...))
			if err := nic.Pool().Free(h); err != nil {
				t.Fatalf("free received frame: %v", err)
			}
		}
		if n == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: received %d of %d frames in %v (stats %+v)", nic.Info().Name, len(got), want, timeout, nic.Stats())
			}
			time.Sleep(time.Microsecond)
		}
	}
	return got
}

func testRoundTrip(t *testing.T, p Pair) {
	const n = 200
	var want [][]byte
	var hs []vnic.Handle
	for i := range n {
		h, b := build(t, p.A, p.AEnd, p.BEnd, payload(uint32(i), 1+i*7%1400))
		hs = append(hs, h)
		want = append(want, b)
	}
	send(t, p.A, hs)
	got := collect(t, p.B, n)
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d differs (or arrived out of order):\n got %x\nwant %x", i, got[i], want[i])
		}
	}
	if s := p.A.Stats(); s.TxFrames != n {
		t.Errorf("A counted %d frames sent, want %d", s.TxFrames, n)
	}
	if s := p.B.Stats(); s.RxFrames != n {
		t.Errorf("B counted %d frames received, want %d", s.RxFrames, n)
	}
}

// testBothWays sends in both directions at once, each NIC driven by its own
// goroutine, in batches.
func testBothWays(t *testing.T, p Pair) {
	const n = 2000
	// A real wire drops what a receiver cannot take in time; keep the
	// frames in flight below the smallest ring in use so that none are.
	const window = 64
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	var received [2]atomic.Int64
	run := func(me int, nic vnic.NIC, src, dst pkt.Endpoint) {
		defer wg.Done()
		peer := &received[1-me]
		sent, recv := 0, 0
		batch := make([]vnic.Handle, 32)
		rx := make([]vnic.Handle, 64)
		deadline := time.Now().Add(timeout)
		for sent < n || recv < n {
			if time.Now().After(deadline) {
				errs <- fmt.Errorf("%s: sent %d received %d of %d in %v", nic.Info().Name, sent, recv, n, timeout)
				return
			}
			k := 0
			for k < len(batch) && sent+k < n && sent+k-int(peer.Load()) < window {
				h := nic.Pool().Alloc()
				if h == vnic.Null {
					break
				}
				l, err := pkt.UDP(nic.Pool().Buf(h), src, dst, payload(uint32(sent+k), 64+(sent+k)%900))
				if err != nil {
					errs <- err
					return
				}
				nic.Pool().SetLen(h, l)
				batch[k] = h
				k++
			}
			m, err := nic.Transmit(batch[:k])
			if err != nil {
				errs <- err
				return
			}
			for _, h := range batch[m:k] {
				nic.Pool().Free(h)
			}
			sent += m
			got := nic.Receive(rx)
			for _, h := range rx[:got] {
				f, err := pkt.Parse(nic.Pool().Data(h))
				if err != nil {
					errs <- fmt.Errorf("%s: frame %d: %v", nic.Info().Name, recv, err)
					return
				}
				if want := payload(uint32(recv), 64+recv%900); !bytes.Equal(f.Payload, want) {
					errs <- fmt.Errorf("%s: frame %d: payload differs or out of order", nic.Info().Name, recv)
					return
				}
				nic.Pool().Free(h)
				recv++
			}
			received[me].Store(int64(recv))
		}
	}
	wg.Add(2)
	go run(0, p.A, p.AEnd, p.BEnd)
	go run(1, p.B, p.BEnd, p.AEnd)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// testRecycling sends many times more frames than the pools hold: frames
// must come back after sending and after being freed, and none may leak.
func testRecycling(t *testing.T, p Pair) {
	freeA, freeB := p.A.Pool().Available(), p.B.Pool().Available()
	total := 4 * p.A.Pool().Count()
	const batch = 32
	for sent := 0; sent < total; sent += batch {
		hs := make([]vnic.Handle, batch)
		for i := range hs {
			hs[i], _ = build(t, p.A, p.AEnd, p.BEnd, payload(uint32(sent+i), 100))
		}
		send(t, p.A, hs)
		for i, b := range collect(t, p.B, batch) {
			f, err := pkt.Parse(b)
			if err != nil || binary.BigEndian.Uint32(f.Payload) != uint32(sent+i) {
				t.Fatalf("frame %d: %v (payload %x)", sent+i, err, f.Payload)
			}
		}
	}
	// Completions may trail the last receive.
	deadline := time.Now().Add(timeout)
	for p.A.Pool().Available() != freeA || p.B.Pool().Available() != freeB {
		if time.Now().After(deadline) {
			t.Fatalf("frames leaked: A has %d free (was %d) %+v, B has %d free (was %d) %+v",
				p.A.Pool().Available(), freeA, p.A.Pool().Stats(), p.B.Pool().Available(), freeB, p.B.Pool().Stats())
		}
		var none [0]vnic.Handle
		p.A.Receive(none[:])
		p.B.Receive(none[:])
		time.Sleep(time.Millisecond)
	}
}

// testHandles checks that every use of a handle the caller no longer holds
// is refused and changes nothing.
func testHandles(t *testing.T, p Pair) {
	pool := p.A.Pool()
	free := pool.Available()
	h := pool.Alloc()
	if h == vnic.Null {
		t.Fatal("Alloc returned Null from a full pool")
	}
	if err := pool.Free(h); err != nil {
		t.Fatal(err)
	}
	if err := pool.Free(h); !errors.Is(err, vnic.ErrStale) {
		t.Errorf("double free: %v, want ErrStale", err)
	}
	if pool.Data(h) != nil || pool.Buf(h) != nil {
		t.Error("Data or Buf of a freed handle is not nil")
	}
	if n, err := p.A.Transmit([]vnic.Handle{h}); n != 0 || !errors.Is(err, vnic.ErrStale) {
		t.Errorf("transmit freed handle: %d, %v; want 0, ErrStale", n, err)
	}
	if pool.Available() != free {
		t.Errorf("free frames %d after refused operations, want %d", pool.Available(), free)
	}

	// A transmitted handle is stale at once.
	h2, _ := build(t, p.A, p.AEnd, p.BEnd, []byte("x"))
	send(t, p.A, []vnic.Handle{h2})
	if pool.Data(h2) != nil {
		t.Error("a transmitted handle still reads its frame")
	}
	if err := pool.Free(h2); !errors.Is(err, vnic.ErrStale) {
		t.Errorf("free of a transmitted handle: %v, want ErrStale", err)
	}
	collect(t, p.B, 1)

	// A batch with a bad handle in the middle: it is refused alone, the
	// good ones on both sides go in their order and come to the front.
	g1, w1 := build(t, p.A, p.AEnd, p.BEnd, []byte("g1"))
	g2, w2 := build(t, p.A, p.AEnd, p.BEnd, []byte("g2"))
	batch := []vnic.Handle{g1, h, g2}
	if n, err := p.A.Transmit(batch); n != 2 || !errors.Is(err, vnic.ErrStale) {
		t.Errorf("transmit [good, stale, good]: %d, %v; want 2, ErrStale", n, err)
	}
	if batch[0] != g1 || batch[1] != g2 || batch[2] != h {
		t.Errorf("after transmit [good, stale, good] the batch is %v, want the two taken in order, then the refused one", batch)
	}
	if pool.Data(g2) != nil {
		t.Error("the frame after the bad handle was not taken")
	}
	got := collect(t, p.B, 2)
	if !bytes.Equal(got[0], w1) || !bytes.Equal(got[1], w2) {
		t.Errorf("frames around the bad handle arrived as %q, %q; want g1 then g2", got[0], got[1])
	}

	// Forged handles: Null, index out of range, wrong generation.
	live := pool.Alloc()
	defer pool.Free(live)
	for _, bad := range []vnic.Handle{vnic.Null, vnic.Handle(vnic.MaxFrames - 1), live ^ (1 << 20), live ^ (1 << 31)} {
		if pool.Data(bad) != nil || pool.Check(bad) == nil || pool.SetLen(bad, 1) == nil || pool.SetNext(bad, live) == nil {
			t.Errorf("forged handle %v accepted", bad)
		}
	}
	if pool.Data(live) == nil {
		t.Error("a live handle stopped working after forged ones were refused")
	}
}

func testExhaustion(t *testing.T, p Pair) {
	pool := p.A.Pool()
	hs := make([]vnic.Handle, pool.Count()+1)
	n := pool.AllocBatch(hs)
	if n != pool.Count()-pool.Stats().Kernel {
		t.Errorf("allocated %d frames, want every frame not in the kernel (%+v)", n, pool.Stats())
	}
	if h := pool.Alloc(); h != vnic.Null {
		t.Error("Alloc from an empty pool returned a frame")
	}
	if pool.Stats().Empty == 0 {
		t.Error("refused allocations not counted")
	}
	for _, h := range hs[:n] {
		if err := pool.Free(h); err != nil {
			t.Fatal(err)
		}
	}
	if h := pool.Alloc(); h == vnic.Null {
		t.Error("Alloc failed after frames were freed")
	} else {
		pool.Free(h)
	}
}

// testFrameSizes sends the smallest and the largest frames the MTU allows,
// and checks that one byte more is refused before it reaches the wire.
func testFrameSizes(t *testing.T, p Pair) {
	mtu := p.A.Info().MTU
	maxBody := mtu - 28
	var want [][]byte
	for _, n := range []int{0, 1, 18, maxBody} {
		h, b := build(t, p.A, p.AEnd, p.BEnd, payload(uint32(n), n))
		send(t, p.A, []vnic.Handle{h})
		want = append(want, b)
	}
	got := collect(t, p.B, len(want))
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Errorf("frame of %d bytes differs", len(want[i]))
		}
	}
	pool := p.A.Pool()
	h := pool.Alloc()
	defer pool.Free(h)
	if err := pool.SetLen(h, len(pool.Buf(h))+1); !errors.Is(err, vnic.ErrTooLong) {
		t.Errorf("SetLen past the buffer: %v, want ErrTooLong", err)
	}
	big := pool.Alloc()
	n, err := pkt.UDP(pool.Buf(big), p.AEnd, p.BEnd, make([]byte, maxBody+1))
	if err != nil {
		t.Fatal(err)
	}
	pool.SetLen(big, n)
	if n, err := p.A.Transmit([]vnic.Handle{big}); n != 0 || !errors.Is(err, vnic.ErrTooLong) {
		t.Errorf("transmit of mtu+1: %d, %v; want 0, ErrTooLong", n, err)
	}
	pool.Free(big)
}

func testIdle(t *testing.T, p Pair) {
	hs := make([]vnic.Handle, 8)
	for range 100 {
		if n := p.B.Receive(hs); n != 0 {
			t.Fatalf("idle NIC received %d frames", n)
		}
	}
	if n := p.B.Receive(nil); n != 0 {
		t.Fatalf("Receive(nil) = %d", n)
	}
	if n, err := p.B.Transmit(nil); n != 0 || err != nil {
		t.Fatalf("Transmit(nil) = %d, %v", n, err)
	}
}

// testTransmitKeep sends a frame the sender keeps, as a TCP retransmission
// queue does: the handle stays valid, the frame can be sent again once the
// NIC is done with it, and freeing it returns it to the pool.
func testTransmitKeep(t *testing.T, p Pair) {
	pool := p.A.Pool()
	free := pool.Available()
	h, want := build(t, p.A, p.AEnd, p.BEnd, payload(42, 300))
	for round := range 3 {
		// Wait until the NIC is done with the previous send.
		deadline := time.Now().Add(timeout)
		for pool.Busy(h) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: frame still busy after %v", round, timeout)
			}
			var none [0]vnic.Handle
			p.A.Receive(none[:])
			time.Sleep(10 * time.Microsecond)
		}
		if n, err := p.A.TransmitKeep([]vnic.Handle{h}); n != 1 || err != nil {
			t.Fatalf("round %d: TransmitKeep = %d, %v", round, n, err)
		}
		if !bytes.Equal(pool.Data(h), want) {
			t.Fatalf("round %d: the kept handle no longer reads its frame", round)
		}
		if got := collect(t, p.B, 1); !bytes.Equal(got[0], want) {
			t.Fatalf("round %d: received frame differs", round)
		}
	}
	if err := pool.Free(h); err != nil {
		t.Fatal(err)
	}
	if pool.Data(h) != nil {
		t.Error("freed kept frame still readable")
	}
	deadline := time.Now().Add(timeout)
	for pool.Available() != free {
		if time.Now().After(deadline) {
			t.Fatalf("kept frame not back in the pool: %d free, want %d", pool.Available(), free)
		}
		var none [0]vnic.Handle
		p.A.Receive(none[:])
		time.Sleep(10 * time.Microsecond)
	}
}
