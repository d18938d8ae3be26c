package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/test"
)

// The sockets demo: one server, written once against net.Listener, run in
// host b on the standard net package and then on package sockets; the
// same kernel client in host a (bench's api-client, a process of its own)
// measures each.

const demoPort = 7300 // echo; the sink is demoPort+1

// serve runs the demo server on ln until it is closed: every connection
// gets a goroutine, as in any Go server. On the echo port it echoes; on
// the sink port it reads to the end of the stream and answers with the
// byte count.
func serve(ln net.Listener, sink bool, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			if !sink {
				io.Copy(c, c)
				return
			}
			n, _ := io.Copy(io.Discard, c)
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], uint64(n))
			c.Write(b[:])
		}()
	}
}

// server is the demo server listening on one library.
type server struct {
	lns []net.Listener
	wg  sync.WaitGroup
}

func (s *server) close() {
	for _, ln := range s.lns {
		ln.Close()
	}
	s.wg.Wait()
}

// startServer listens on addr's echo and sink ports with listen, made in
// host b.
func startServer(b *test.Host, addr string, listen func(network, address string) (net.Listener, error)) (*server, error) {
	s := &server{}
	for i, sink := range []bool{false, true} {
		var ln net.Listener
		err := b.Do(func() (err error) {
			ln, err = listen("tcp", net.JoinHostPort(addr, strconv.Itoa(demoPort+i)))
			return err
		})
		if err != nil {
			s.close()
			return nil, err
		}
		s.lns = append(s.lns, ln)
		s.wg.Add(1)
		go serve(ln, sink, &s.wg)
	}
	return s, nil
}

// demoRow is one line of the table.
type demoRow struct {
	name     string
	p50, p99 float64 // µs
	gbps     float64
}

// measure runs the kernel client in host a against the server: 64-byte
// ping-pong, then a bulk upload.
func measure(a *test.Host, bench, dst string, count int, seconds float64) (demoRow, error) {
	var row demoRow
	run := func(args ...string) ([]byte, error) {
		cmd := a.Command(bench, append([]string{"api-client", "-impl", "net", "-dst", dst, "-port", strconv.Itoa(demoPort)}, args...)...)
		var stderr test.LimitedBuffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("kernel client: %w: %s", err, &stderr)
		}
		return out, nil
	}
	out, err := run("-mode", "pingpong", "-count", strconv.Itoa(count))
	if err != nil {
		return row, err
	}
	var pp struct {
		RTTs []float64 `json:"rtts_us"`
	}
	if err := json.Unmarshal(out, &pp); err != nil || len(pp.RTTs) == 0 {
		return row, fmt.Errorf("kernel client output %q: %v", out, err)
	}
	slices.Sort(pp.RTTs)
	row.p50, row.p99 = pp.RTTs[len(pp.RTTs)/2], pp.RTTs[len(pp.RTTs)*99/100]
	if out, err = run("-mode", "bulk", "-seconds", fmt.Sprint(seconds)); err != nil {
		return row, err
	}
	var bk struct {
		Bytes   int64   `json:"bytes"`
		Seconds float64 `json:"seconds"`
	}
	if err := json.Unmarshal(out, &bk); err != nil || bk.Seconds == 0 {
		return row, fmt.Errorf("kernel client output %q: %v", out, err)
	}
	row.gbps = float64(bk.Bytes) * 8 / bk.Seconds / 1e9
	return row, nil
}

// socketsDemo serves from b on net, then on sockets in each profile, and
// prints the table.
func socketsDemo(a, b *test.Host, bench string) error {
	if _, err := exec.LookPath(bench); err != nil {
		return fmt.Errorf("the demo's client is %s (make build): %w", bench, err)
	}
	ib := b.Iface0()
	addr := ib.Addr().String()
	const count, seconds = 20000, 2.0
	step("b: one echo server, written against net.Listener, served by the standard net package, then by package sockets")
	fmt.Println("   a: the same kernel client (64-byte Write then Read; then a bulk upload) measures each")
	var rows []demoRow
	stdRow, err := func() (demoRow, error) {
		srv, err := startServer(b, addr, net.Listen)
		if err != nil {
			return demoRow{}, err
		}
		defer srv.close()
		return measure(a, bench, addr, count, seconds)
	}()
	if err != nil {
		return fmt.Errorf("server on net: %w", err)
	}
	stdRow.name = "net.Listen (kernel TCP)"
	rows = append(rows, stdRow)
	for _, p := range []sockets.Profile{sockets.Balanced, sockets.Latency} {
		row, counters, err := onSockets(a, b, bench, p, count, seconds)
		if err != nil {
			return fmt.Errorf("server on sockets (%s): %w", p, err)
		}
		row.name = fmt.Sprintf("sockets.Listen, %s profile", p)
		rows = append(rows, row)
		fmt.Printf("   b| %s: %s\n", p, counters)
	}
	fmt.Printf("\n   %-34s %9s %9s %10s %12s %12s\n", "server in b", "p50 µs", "p99 µs", "Gbit/s", "p50 vs net", "Gbit/s vs net")
	for _, r := range rows {
		fmt.Printf("   %-34s %9.2f %9.2f %10.2f %12.2f %12.2f\n", r.name, r.p50, r.p99, r.gbps, r.p50/stdRow.p50, r.gbps/stdRow.gbps)
	}
	fmt.Println("\n   One run on a 2-CPU VM; `make bench` measures clients through the public API with rounds and ratios.")
	return nil
}

// onSockets opens an accelerated stack on b's interface with profile p
// and measures the server on it. A stack closed a moment ago may still
// hold the interface's queue: opening is retried.
func onSockets(a, b *test.Host, bench string, p sockets.Profile, count int, seconds float64) (demoRow, string, error) {
	cfg, err := sockets.DefaultConfig(p)
	if err != nil {
		return demoRow{}, "", err
	}
	cfg.Interface = b.Iface0().Name
	var st *sockets.Stack
	for try := 0; ; try++ {
		if err = b.Do(func() (err error) { st, err = sockets.Open(cfg); return }); err == nil || try == 10 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		return demoRow{}, "", err
	}
	defer st.Close()
	lc := sockets.ListenConfig{Stack: st}
	srv, err := startServer(b, b.Iface0().Addr().String(), func(network, address string) (net.Listener, error) {
		return lc.Listen(context.Background(), network, address)
	})
	if err != nil {
		return demoRow{}, "", err
	}
	for _, ln := range srv.lns {
		if _, ok := ln.(*sockets.TCPListener); !ok {
			srv.close()
			return demoRow{}, "", errors.New("the listen fell back to the kernel")
		}
	}
	row, err := measure(a, bench, b.Iface0().Addr().String(), count, seconds)
	srv.close()
	c := st.Engine().Counters()
	return row, fmt.Sprintf("%d TCP segments in, %d frames out, %d retransmitted", c.RxTCP, c.TxFrames, c.TCPRetransmits), err
}
