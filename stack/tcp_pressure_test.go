package stack_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// TestFramePressure runs more connections than the frame pool can hold
// buffers for: each of 8 connections may queue 256 KiB to send and to
// read, both ways at once, with 512 frames (1 MiB) per stack, and the
// readers stall for a while now and then. Frames run out again and
// again; every byte must still arrive, in time, and no frame may leak.
func TestFramePressure(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{FrameCount: 512})
	poll := pollBoth(a, b)
	const conns = 8
	n := 2 << 20
	if testing.Short() {
		n = 512 << 10
	}
	type end struct {
		s        *stack.Stack
		id       stack.SockID
		data     []byte
		sent     int
		got      []byte
		stallFor int
	}
	var ends []*end
	for i := range conns {
		c, s := connectPair(t, a, b, poll)
		for _, e := range []*end{{s: a, id: c}, {s: b, id: s}} {
			e.s.SetOption(e.id, stack.SendBuffer, 256<<10)
			e.s.SetOption(e.id, stack.RecvBuffer, 256<<10)
			e.data = randomBytes(n, uint64(len(ends)+100*i))
			ends = append(ends, e)
		}
	}
	buf := make([]byte, 32<<10)
	deadline := time.Now().Add(120 * time.Second)
	for round := 0; ; round++ {
		done := true
		for i, e := range ends {
			peer := ends[i^1]
			if e.sent < n {
				k, err := e.s.Send(e.id, e.data[e.sent:min(n, e.sent+32<<10)])
				if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
					t.Fatal(err)
				}
				e.sent += k
			}
			if e.stallFor > 0 {
				e.stallFor--
			} else if k, err := e.s.Recv(e.id, buf, false); err == nil {
				e.got = append(e.got, buf[:k]...)
			} else if !errors.Is(err, stack.ErrWouldBlock) {
				t.Fatal(err)
			}
			if round%997 == i {
				e.stallFor = 500 // this reader looks away for a while
			}
			if len(e.got) < len(peer.data) || e.sent < n {
				done = false
			}
		}
		poll()
		if done {
			break
		}
		if time.Now().After(deadline) {
			var got int
			for _, e := range ends {
				got += len(e.got)
			}
			t.Fatalf("stalled: %d of %d bytes arrived (a: %s; b: %s)\n%s", got, len(ends)*n,
				ptr(a.Counters()), ptr(b.Counters()), a.Dump())
		}
	}
	for i, e := range ends {
		if !bytes.Equal(e.got, ends[i^1].data) {
			t.Fatalf("end %d received different bytes", i)
		}
	}
	t.Logf("a: %s", ptr(a.Counters()))
}
