package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/test"
)

// The handover section: connections of our stack (standalone, in host
// B) to the kernel's echo server in host A, each handed over to the
// kernel with (*sockets.TCPConn).Handover while it holds 1 KiB it has not
// read, and checked after: the bytes read from the kernel socket are the
// echo. The time is the whole call, as a program sees it (the kernel
// socket prepared, the stack's state read, the connection re-created in
// repair mode, the flow moved, the *net.TCPConn made).

// HandoverReport is the section's figures.
type HandoverReport struct {
	Count    int     `json:"count"`
	P50us    float64 `json:"p50_us"`
	P99us    float64 `json:"p99_us"`
	MaxUs    float64 `json:"max_us"`
	Counted  uint64  `json:"counted"` // TCPHandovers moved by this much
	TargetUs float64 `json:"target_us"`
}

func handoverSection(ctx context.Context, a, b *test.Host, count int) (*HandoverReport, error) {
	ln, err := a.KernelEcho(a.Iface0().Addr().String() + ":0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	cfg, err := sockets.DefaultConfig(sockets.Balanced)
	if err != nil {
		return nil, err
	}
	cfg.Interface = b.Iface0().Name
	var s *sockets.Stack
	if err := b.Do(func() (err error) { s, err = sockets.Open(cfg); return }); err != nil {
		return nil, err
	}
	defer s.Close()
	before := s.Engine().Counters().TCPHandovers
	d := sockets.Dialer{Stack: s}
	msg := bytes.Repeat([]byte("handover"), 128)
	buf := make([]byte, len(msg))
	var took []float64
	for i := range count {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var c net.Conn
		if err := b.Do(func() (err error) { c, err = d.Dial("tcp", ln.Addr().String()); return }); err != nil {
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		tc, ok := c.(*sockets.TCPConn)
		if !ok {
			c.Close()
			return nil, fmt.Errorf("connection %d fell back to the kernel", i)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write(msg); err != nil {
			c.Close()
			return nil, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return nil, err
		}
		// 1 KiB the connection has not read when it moves.
		if _, err := c.Write(msg); err != nil {
			c.Close()
			return nil, err
		}
		time.Sleep(2 * time.Millisecond)
		// A dialled connection moves onto its own kernel socket (its
		// port's reservation): the call makes no socket, and needs no
		// network namespace of its own.
		start := time.Now()
		kc, err := tc.Handover()
		el := time.Since(start)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("connection %d: %w", i, err)
		}
		kc.SetDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadFull(kc, buf)
		kc.Close()
		if err != nil || !bytes.Equal(buf, msg) {
			return nil, fmt.Errorf("connection %d after the handover: %v (read %q)", i, err, buf[:16])
		}
		took = append(took, float64(el.Nanoseconds())/1e3)
	}
	slices.Sort(took)
	return &HandoverReport{
		Count: count, P50us: round3(pct(took, 50)), P99us: round3(pct(took, 99)), MaxUs: round3(took[len(took)-1]),
		Counted: s.Engine().Counters().TCPHandovers - before, TargetUs: 1000,
	}, nil
}

func printHandover(w io.Writer, rep *Report) {
	h := rep.Handover
	fmt.Fprintf(w, "\nHandover to the kernel: %d connections of our stack, each holding 1 KiB unread, handed over with (*sockets.TCPConn).Handover\n\n", h.Count)
	fmt.Fprintf(w, "%-40s %9s %9s %9s\n", "", "p50 µs", "p99 µs", "max µs")
	fmt.Fprintf(w, "%-40s %9.1f %9.1f %9.1f\n", "the whole call", h.P50us, h.P99us, h.MaxUs)
	fmt.Fprintf(w, "\ncounted in stackdump (TCPHandovers): %d; target: under %.0f µs\n", h.Counted, h.TargetUs)
}
