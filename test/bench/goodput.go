package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/test"
	"github.com/xdp-onload/onload/vnic"
)

// The goodput section: one TCP connection from host A to host B through the
// fault injector's middle host (test.Path), for a fixed time, with our
// stack sending beside the kernel sending, both to the kernel of B and
// both with CUBIC, in alternating rounds on the same path.

// GoodputResult is one path's figures.
type GoodputResult struct {
	ID          string    `json:"id"`
	Path        string    `json:"path"`
	KernelMbps  float64   `json:"kernel_mbit_per_s"` // median of rounds
	OursMbps    float64   `json:"ours_mbit_per_s"`
	Ratio       float64   `json:"ours_vs_kernel"`
	RoundsKern  []float64 `json:"rounds_kernel_mbit_per_s"`
	RoundsOurs  []float64 `json:"rounds_ours_mbit_per_s"`
	RatioRounds float64   `json:"ours_vs_kernel_median_of_rounds"`
}

var goodputPaths = []struct {
	id, desc string
	data     vnic.Impairment // A to B; the ACKs come back clean
}{
	{"loss1-10ms-200mbit", "1% random loss, 10 ms one-way delay, 200 Mbit/s token bucket (256 KiB queue), data direction",
		vnic.Impairment{Loss: 0.01, Delay: 10 * time.Millisecond, Rate: 200_000_000, QueueBytes: 256 << 10}},
	{"clean-10ms-200mbit", "no loss, 10 ms one-way delay, 200 Mbit/s token bucket (256 KiB queue), data direction",
		vnic.Impairment{Delay: 10 * time.Millisecond, Rate: 200_000_000, QueueBytes: 256 << 10}},
}

// goodputSection runs rounds alternating kernel and ours on each path.
func goodputSection(ctx context.Context, rounds int, seconds float64) ([]GoodputResult, error) {
	var out []GoodputResult
	for _, gp := range goodputPaths {
		p, err := test.NewPath(test.PathConfig{Seed: 5, AtoB: gp.data})
		if err != nil {
			return nil, err
		}
		res, err := goodputPath(ctx, p, rounds, seconds)
		p.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", gp.id, err)
		}
		res.ID, res.Path = gp.id, gp.desc
		out = append(out, res)
	}
	return out, nil
}

func goodputPath(ctx context.Context, p *test.Path, rounds int, seconds float64) (GoodputResult, error) {
	var r GoodputResult
	cfg, err := sockets.DefaultConfig(sockets.Balanced)
	if err != nil {
		return r, err
	}
	cfg.Interface = p.IfA.Name
	cfg.Congestion = "cubic"
	var st *sockets.Stack
	if err := p.A.Do(func() (err error) { st, err = sockets.Open(cfg); return }); err != nil {
		return r, err
	}
	defer st.Close()
	var ln net.Listener
	if err := p.B.Do(func() (err error) { ln, err = net.Listen("tcp", p.IfB.Addr().String()+":0"); return }); err != nil {
		return r, err
	}
	defer ln.Close()
	d := time.Duration(seconds * float64(time.Second))
	for i := range rounds {
		for _, ours := range []bool{false, true} {
			if ctx.Err() != nil {
				return r, ctx.Err()
			}
			dial := func() (net.Conn, error) {
				var c net.Conn
				err := p.A.Do(func() (err error) {
					if ours {
						c, err = (&sockets.Dialer{Stack: st}).Dial("tcp", ln.Addr().String())
					} else {
						c, err = kernelCubicDialer.Dial("tcp", ln.Addr().String())
					}
					return
				})
				return c, err
			}
			mbps, err := goodputRound(ln, dial, d)
			if err != nil {
				return r, fmt.Errorf("round %d (ours %v): %w", i+1, ours, err)
			}
			who := "kernel"
			if ours {
				who = "ours"
				r.RoundsOurs = append(r.RoundsOurs, mbps)
			} else {
				r.RoundsKern = append(r.RoundsKern, mbps)
			}
			fmt.Fprintf(os.Stderr, "goodput round %d %-6s %7.1f Mbit/s\n", i+1, who, mbps)
		}
	}
	r.KernelMbps = round3(median(slices.Clone(r.RoundsKern)))
	r.OursMbps = round3(median(slices.Clone(r.RoundsOurs)))
	r.Ratio = round3(r.OursMbps / r.KernelMbps)
	r.RatioRounds = round3(medianRatio(r.RoundsOurs, r.RoundsKern))
	return r, nil
}

// goodputRound sends as fast as the connection takes for d and returns
// what the receiver got in that time, in Mbit/s.
func goodputRound(ln net.Listener, dial func() (net.Conn, error), d time.Duration) (float64, error) {
	var got atomic.Int64
	accepted := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := ln.Accept()
		accepted <- err
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(d + 30*time.Second))
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	c, err := dial()
	if err != nil {
		ln.(*net.TCPListener).SetDeadline(time.Now())
		<-done
		ln.(*net.TCPListener).SetDeadline(time.Time{})
		return 0, err
	}
	if err := <-accepted; err != nil {
		c.Close()
		return 0, err
	}
	start := time.Now()
	c.SetWriteDeadline(start.Add(d))
	buf := make([]byte, 256<<10)
	for time.Since(start) < d {
		if _, err := c.Write(buf); err != nil {
			break // the deadline
		}
	}
	n := got.Load()
	el := time.Since(start)
	c.Close()
	// Wait for the receiver to see the end, so the next round starts on an
	// empty path.
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		return 0, fmt.Errorf("the receiver did not see the end within a minute")
	}
	return float64(n) * 8 / el.Seconds() / 1e6, nil
}

func printGoodput(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "\ngoodput, one connection A -> B through the fault injector, CUBIC both, %d rounds of %gs (medians over rounds; ratio: median of per-round ratios):\n", rep.Goodput.Rounds, rep.Goodput.Seconds)
	fmt.Fprintf(w, "%-20s %14s %14s %8s %8s\n", "path", "kernel Mbit/s", "ours Mbit/s", "ratio", "target")
	for _, r := range rep.Goodput.Results {
		fmt.Fprintf(w, "%-20s %14.1f %14.1f %8.3f %8s\n", r.ID, r.KernelMbps, r.OursMbps, r.RatioRounds, ">= 0.9")
	}
}

// kernelCubicDialer dials with TCP_CONGESTION set to cubic, whatever the
// host's default (a namespace inherits it, and may not change it to an
// algorithm the host restricts; a root socket may).
var kernelCubicDialer = net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, "cubic")
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set TCP_CONGESTION cubic: %w (is tcp_cubic available?)", serr)
	}
	return nil
}}
