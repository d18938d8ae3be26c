package test

import (
	"bytes"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdp-onload/onload/vnic"
)

// kernelTransfer sends data from host a's kernel to host b's kernel over
// TCP and returns what b received.
func kernelTransfer(t *testing.T, p *Path, data []byte, timeout time.Duration) []byte {
	t.Helper()
	var ln net.Listener
	if err := p.B.Do(func() (err error) { ln, err = net.Listen("tcp", p.IfB.Addr().String()+":0"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(timeout))
		b, _ := io.ReadAll(c)
		got <- b
	}()
	var c net.Conn
	if err := p.A.Do(func() (err error) { c, err = net.DialTimeout("tcp", ln.Addr().String(), timeout); return }); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write(data); err != nil {
		t.Fatal(err)
	}
	c.Close()
	return <-got
}

// TestPathForwards checks the fault injector with the kernel on both
// sides: ping crosses M (ARP too), a lossy, reordering, duplicating,
// corrupting path still carries TCP byte-exact, and each fault's counter
// moves.
func TestPathForwards(t *testing.T) {
	imp := vnic.Impairment{Loss: 0.01, Reorder: 0.02, Duplicate: 0.01, Corrupt: 0.001, BurstLoss: 0.0005}
	p := FaultyPath(t, PathConfig{Seed: 1, AtoB: imp, BtoA: vnic.Impairment{Loss: 0.01}})
	// ping exits 0 when a reply came back (one may be lost).
	if out, err := p.A.Run("ping", "-c", "3", "-i", "0.2", "-W", "2", p.IfB.Addr().String()); err != nil {
		t.Fatalf("ping through M: %v\n%s", err, out)
	}
	data := random(8<<20, 3)
	got := kernelTransfer(t, p, data, 60*time.Second)
	if !bytes.Equal(got, data) {
		t.Fatalf("received %d of %d bytes, or different bytes", len(got), len(data))
	}
	ab, ba := p.Counters()
	t.Logf("a->b %+v", ab)
	t.Logf("b->a %+v", ba)
	for name, v := range map[string]uint64{"lost": ab.Lost, "burst lost": ab.BurstLost, "reordered": ab.Reordered,
		"duplicated": ab.Duplicated, "corrupted": ab.Corrupted, "b->a lost": ba.Lost, "delivered": ab.Delivered} {
		if v == 0 {
			t.Errorf("%s: counter did not move", name)
		}
	}
	if d := p.Drops(); d != 0 {
		t.Errorf("the forwarder dropped %d frames of its own", d)
	}
}

// TestPathDelay checks that ping's round trip carries both directions'
// delay.
func TestPathDelay(t *testing.T) {
	d := vnic.Impairment{Delay: 10 * time.Millisecond, Jitter: 2 * time.Millisecond}
	p := FaultyPath(t, PathConfig{Seed: 2, AtoB: d, BtoA: d})
	out, err := p.A.Run("ping", "-c", "5", "-i", "0.2", "-W", "2", p.IfB.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// rtt min/avg/max/mdev = 20.1/21.0/...
	_, stats, ok := strings.Cut(out, "rtt min/avg/max/mdev = ")
	var min float64
	if !ok || scanFloat(stats, &min) != nil || min < 20 || min > 30 {
		t.Fatalf("ping round trip %q: want from 20 to 30 ms\n%s", stats, out)
	}
}

func scanFloat(s string, v *float64) error {
	f, _, _ := strings.Cut(s, "/")
	x, err := strconv.ParseFloat(f, 64)
	*v = x
	return err
}
