package test

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/xdp-onload/onload/internal/impair"
	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// faults are the paths of issue 5's byte-exact transfers.
var faults = []struct {
	name string
	imp  vnic.Impairment
}{
	{"loss1", vnic.Impairment{Loss: 0.01}},
	{"loss5", vnic.Impairment{Loss: 0.05}},
	{"burst10", vnic.Impairment{BurstLoss: 0.001, BurstLen: 10}},
	{"reorder10", vnic.Impairment{Reorder: 0.10, ReorderDelay: time.Millisecond}},
	{"dup1", vnic.Impairment{Duplicate: 0.01}},
	{"corrupt0.1", vnic.Impairment{Corrupt: 0.001}},
	{"delay20jitter5", vnic.Impairment{Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond}},
}

func faultBytes() int {
	if testing.Short() {
		return 16 << 20
	}
	return 256 << 20
}

// TestFaultsKernel moves 256 MiB (16 MiB with -short) byte-exact between
// our stack and the kernel's TCP through each fault of the path, our
// stack sending and receiving. The fault applies to both directions
// (data and ACKs).
func TestFaultsKernel(t *testing.T) {
	for i, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			p := FaultyPath(t, PathConfig{Seed: uint64(i + 1)})
			s := ourSockets(t, p.B, sockets.Balanced)
			for _, weSend := range []bool{true, false} {
				name := map[bool]string{true: "ours-sends", false: "ours-receives"}[weSend]
				t.Run(name, func(t *testing.T) {
					d, el := faultedTransfer(t, p, s, weSend, f.imp, faultBytes(), uint64(i*2+1), 10*time.Minute)
					ab, ba := p.Counters()
					t.Logf("%d MiB in %v (%.0f Mbit/s); ours: %s; a->b %+v; b->a %+v", faultBytes()>>20, el.Round(time.Millisecond),
						float64(faultBytes())*8/el.Seconds()/1e6, &d, ab, ba)
				})
			}
			if d := p.Drops(); d != 0 {
				t.Errorf("the forwarder dropped %d frames of its own", d)
			}
		})
	}
}

// faultedTransfer connects our stack s (in B) with A's kernel over a clean
// path, then turns imp on in both directions and moves n random bytes one
// way (ours to the kernel when weSend), byte-exact, failing the test
// otherwise. It returns what our stack's counters did and how long it
// took, and logs the stack if it takes more than 10s.
func faultedTransfer(t *testing.T, p *Path, s *sockets.Stack, weSend bool, imp vnic.Impairment, n int, seed uint64, timeout time.Duration) (stack.Counters, time.Duration) {
	t.Helper()
	if err := p.Impair(vnic.Impairment{}, vnic.Impairment{}); err != nil {
		t.Fatal(err)
	}
	ours, theirs, stop, err := kernelPipe(p.A, p.B, s, weSend)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := p.Impair(imp, imp); err != nil {
		t.Fatal(err)
	}
	from, to := theirs, ours
	if weSend {
		from, to = ours, theirs
	}
	start := time.Now()
	before := s.Engine().Counters()
	ab0, ba0 := p.Counters()
	slow := time.AfterFunc(10*time.Second, func() { t.Logf("slow: after 10s\n%s", s.Dump()) })
	err = oneWay(from, to, n, seed, timeout)
	slow.Stop()
	if err != nil {
		t.Fatalf("ours sends %v: %v\n%s", weSend, err, s.Dump())
	}
	ab1, ba1 := p.Counters()
	checkImpaired(t, "a->b", imp, diffLine(ab1, ab0))
	checkImpaired(t, "b->a", imp, diffLine(ba1, ba0))
	return s.Engine().Counters().Sub(before), time.Since(start)
}

// diffLine is after - before, field by field.
func diffLine(after, before impair.Counters) impair.Counters {
	a, b := reflect.ValueOf(&after).Elem(), reflect.ValueOf(before)
	for i := range a.NumField() {
		a.Field(i).SetUint(a.Field(i).Uint() - b.Field(i).Uint())
	}
	return after
}

// checkImpaired checks that the path did to the frames of one direction
// what imp says, at about its rate: a transfer that passed through a
// fault that never happened proves nothing. The count of a fault of
// probability p over n frames is within 5 standard deviations of p·n.
func checkImpaired(t *testing.T, dir string, imp vnic.Impairment, c impair.Counters) {
	t.Helper()
	n := float64(c.Sent)
	near := func(what string, got uint64, p float64) {
		want := p * n
		if math.Abs(float64(got)-want) > 5*math.Sqrt(want*(1-p))+2 {
			t.Errorf("%s: %d of %d frames %s, want about %.0f (%g)", dir, got, c.Sent, what, want, p)
		}
	}
	if imp.Loss > 0 {
		near("lost", c.Lost, imp.Loss)
	}
	if imp.BurstLoss > 0 {
		// A burst starts at probability BurstLoss and loses up to BurstLen
		// frames (fewer when the line goes quiet first).
		if c.BurstLost == 0 || c.BurstLost > uint64(float64(imp.BurstLen)*(imp.BurstLoss*n+5*math.Sqrt(imp.BurstLoss*n)+2)) {
			t.Errorf("%s: %d of %d frames lost in bursts, want about %.0f bursts of up to %d", dir, c.BurstLost, c.Sent, imp.BurstLoss*n, imp.BurstLen)
		}
	}
	if imp.Reorder > 0 {
		near("reordered", c.Reordered, imp.Reorder)
	}
	if imp.Duplicate > 0 {
		near("duplicated", c.Duplicated, imp.Duplicate)
	}
	if imp.Corrupt > 0 {
		near("corrupted", c.Corrupted, imp.Corrupt)
	}
	if imp.Delay > 0 && c.Delayed < c.Sent-c.Sent/100 {
		t.Errorf("%s: %d of %d frames delayed, want all", dir, c.Delayed, c.Sent)
	}
	if c.Sent == 0 {
		t.Errorf("%s: no frame went through the path", dir)
	}
}

// oneWay writes n random bytes into from, closes its write side and checks
// that to reads exactly them.
func oneWay(from, to net.Conn, n int, seed uint64, timeout time.Duration) error {
	data := random(n, seed)
	from.SetDeadline(time.Now().Add(timeout))
	to.SetDeadline(time.Now().Add(timeout))
	errc := make(chan error, 1)
	go func() {
		_, err := from.Write(data)
		if err == nil {
			err = from.(interface{ CloseWrite() error }).CloseWrite()
		}
		errc <- err
	}()
	got, rerr := io.ReadAll(to)
	werr := <-errc
	if werr != nil {
		return fmt.Errorf("write: %w", werr)
	}
	if rerr != nil {
		return fmt.Errorf("read after %d of %d bytes: %w", len(got), n, rerr)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("received %d bytes, sent %d; first difference at %d", len(got), n, firstDiff(got, data))
	}
	return nil
}

// TestFaultsKernelNoSack turns SACK off in A's kernel and moves data both
// ways through 1% loss: our stack recovers with NewReno (RFC 6582), the
// third duplicate ACK and each partial ACK resending the first hole.
func TestFaultsKernelNoSack(t *testing.T) {
	p := FaultyPath(t, PathConfig{Seed: 77})
	if _, err := p.A.Run("sysctl", "-qw", "net.ipv4.tcp_sack=0"); err != nil {
		Missing(t, "cannot turn SACK off in the test host: %v", err)
	}
	s := ourSockets(t, p.B, sockets.Balanced)
	n := 64 << 20
	if testing.Short() {
		n = 8 << 20
	}
	imp := vnic.Impairment{Loss: 0.01}
	for _, weSend := range []bool{true, false} {
		d, el := faultedTransfer(t, p, s, weSend, imp, n, 99, 5*time.Minute)
		t.Logf("ours sends %v: %d MiB in %v; %s", weSend, n>>20, el.Round(time.Millisecond), &d)
		if weSend && (d.TCPFastRetrans == 0 || d.TCPSackRecovered != 0) {
			t.Errorf("without SACK: %d fast recoveries, %d bytes SACKed; want some and none", d.TCPFastRetrans, d.TCPSackRecovered)
		}
	}
}
