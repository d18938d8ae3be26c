package main

// The server benchmark: one net/http server, written once against
// net.Listener, in host b on the standard net package and on package
// sockets (default profile), loaded by the kernel's wrk from host a at
// several connection counts. The contenders alternate within each round
// so that the machine's drift hits both alike.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/test"
)

const httpPort = 7400

// httpBody is what the handler answers: a small fixed body, as a health
// check or a small API reply would be.
var httpBody = []byte("hello from the onload benchmark\n")

// httpServerMain serves httpBody on addr:httpPort through -impl until it is
// signalled or its time is up.
func httpServerMain(args []string) error {
	fs := flag.NewFlagSet("http-server", flag.ExitOnError)
	impl := fs.String("impl", "sockets", "sockets or net")
	addr := fs.String("addr", "198.18.0.2", "address to listen on")
	limit := fs.Duration("limit", 5*time.Minute, "exit after this long whatever happens")
	fs.Parse(args)
	hostport := net.JoinHostPort(*addr, strconv.Itoa(httpPort))
	var ln net.Listener
	var st *sockets.Stack // the sockets contender's stack, for its dump
	var err error
	switch *impl {
	case "net":
		ln, err = net.Listen("tcp", hostport)
	case "sockets":
		// The stack sockets.Listen would make, made here so that its
		// counters can be dumped (ONLOAD_BENCH_DUMP=1).
		var cfg sockets.Config
		if cfg, err = sockets.ConfigFromEnv(); err != nil {
			return err
		}
		if st, err = sockets.Open(cfg); err != nil {
			return err
		}
		defer st.Close()
		lc := sockets.ListenConfig{Stack: st}
		ln, err = lc.Listen(context.Background(), "tcp", hostport)
		if err == nil {
			if _, ok := ln.(*sockets.TCPListener); !ok {
				err = fmt.Errorf("sockets fell back to the kernel (%T)", ln)
			}
		}
	default:
		return fmt.Errorf("unknown -impl %q: want sockets or net", *impl)
	}
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Write(httpBody)
	})}
	go srv.Serve(ln)
	if f := os.Getenv("ONLOAD_BENCH_CPUPROFILE"); f != "" {
		go func() {
			time.Sleep(3 * time.Second)
			out, _ := os.Create(f + "." + *impl)
			pprof.StartCPUProfile(out)
			time.Sleep(2 * time.Second)
			pprof.StopCPUProfile()
			out.Close()
		}()
	}
	if f := os.Getenv("ONLOAD_BENCH_TRACE"); f != "" {
		go func() {
			time.Sleep(3 * time.Second)
			out, _ := os.Create(f)
			trace.Start(out)
			time.Sleep(2 * time.Second)
			trace.Stop()
			out.Close()
		}()
	}
	fmt.Println("ready")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
	case <-time.After(*limit):
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	if f := os.Getenv("ONLOAD_BENCH_DUMP"); st != nil && f != "" {
		os.WriteFile(f, []byte(st.Dump()), 0o644)
	}
	return nil
}

// HTTPResult is one contender at one connection count.
type HTTPResult struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	Conns       int       `json:"connections"`
	ReqPerSec   float64   `json:"requests_per_s"` // median of rounds
	P50us       float64   `json:"p50_us"`         // median of rounds of wrk's p50
	P99us       float64   `json:"p99_us"`         // median of rounds of wrk's p99
	Errors      int       `json:"errors"`         // wrk's socket errors and non-2xx, all rounds
	RoundsRPS   []float64 `json:"rounds_requests_per_s"`
	RoundsP50us []float64 `json:"rounds_p50_us"`
	RoundsP99us []float64 `json:"rounds_p99_us"`
}

// wrkResult is what one wrk run reports.
type wrkResult struct {
	rps, p50, p99 float64 // requests/s, µs
	errors        int
}

var (
	wrkLatency  = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkRPS      = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkErrors   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	wrkNon2xx   = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	wrkRequests = regexp.MustCompile(`(\d+) requests in`)
)

func parseWrk(out []byte) (wrkResult, error) {
	var r wrkResult
	for _, m := range wrkLatency.FindAllSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		switch string(m[3]) {
		case "ms":
			v *= 1e3
		case "s":
			v *= 1e6
		}
		if string(m[1]) == "50" {
			r.p50 = v
		} else {
			r.p99 = v
		}
	}
	if m := wrkRPS.FindSubmatch(out); m != nil {
		r.rps, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := wrkErrors.FindSubmatch(out); m != nil {
		for _, s := range m[1:] {
			n, _ := strconv.Atoi(string(s))
			r.errors += n
		}
	}
	if m := wrkNon2xx.FindSubmatch(out); m != nil {
		n, _ := strconv.Atoi(string(m[1]))
		r.errors += n
	}
	if r.rps == 0 || r.p50 == 0 || r.p99 == 0 || wrkRequests.Find(out) == nil {
		return r, fmt.Errorf("no figures in wrk's output:\n%s", strings.TrimSpace(string(out)))
	}
	return r, nil
}

// httpContender is one server library.
type httpContender struct {
	id, name string
	impl     string
	env      []string
}

var httpContenders = []httpContender{
	{"http-net", "net/http on the standard net package (kernel TCP)", "net", nil},
	{"http-sockets", "net/http on sockets, balanced profile (default)", "sockets", nil},
}

// httpSection runs rounds of every contender at every connection count:
// the server a process of its own in b, wrk (one thread) in a, each
// pinned to its own CPU.
func httpSection(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, rounds int, conns []int, seconds float64) ([]HTTPResult, error) {
	if _, err := exec.LookPath("wrk"); err != nil {
		return nil, errors.New("wrk not found: apt-get install wrk")
	}
	type key struct {
		id    string
		conns int
	}
	acc := map[key]*HTTPResult{}
	var order []key
	for _, n := range conns {
		for _, c := range httpContenders {
			k := key{c.id, n}
			acc[k] = &HTTPResult{ID: c.id, Name: c.name, Conns: n}
			order = append(order, k)
		}
	}
	for r := range rounds {
		for _, n := range conns {
			// Alternate which contender goes first from round to round.
			cs := httpContenders
			if r%2 == 1 {
				cs = []httpContender{cs[1], cs[0]}
			}
			for _, c := range cs {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				w, err := httpRound(ctx, self, a, b, pinA, pinB, c, n, seconds)
				if err != nil {
					return nil, fmt.Errorf("round %d, %s, %d connections: %w", r+1, c.id, n, err)
				}
				h := acc[key{c.id, n}]
				h.RoundsRPS = append(h.RoundsRPS, w.rps)
				h.RoundsP50us = append(h.RoundsP50us, w.p50)
				h.RoundsP99us = append(h.RoundsP99us, w.p99)
				h.Errors += w.errors
				fmt.Fprintf(os.Stderr, "http round %d %-14s c=%-4d %9.0f req/s  p50 %8.1f us  p99 %8.1f us  errors %d\n",
					r+1, c.id, n, w.rps, w.p50, w.p99, w.errors)
			}
		}
	}
	var out []HTTPResult
	for _, k := range order {
		h := acc[k]
		h.ReqPerSec, h.P50us, h.P99us = round3(median(h.RoundsRPS)), round3(median(h.RoundsP50us)), round3(median(h.RoundsP99us))
		out = append(out, *h)
	}
	return out, nil
}

// httpRound starts one server and runs wrk against it once.
func httpRound(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, c httpContender, conns int, seconds float64) (wrkResult, error) {
	var res wrkResult
	err := queueRetry(ctx, 300*time.Millisecond, func() error {
		srv := inHost(ctx, b, pinB, self, "http-server", "-impl", c.impl, "-addr", b.Iface0().Addr().String())
		srv.Env = append(append(os.Environ(), "ONLOAD_INTERFACE="+b.Iface0().Name), c.env...)
		stop, err := startServer(srv, listening(b, httpPort))
		if err != nil {
			return fmt.Errorf("server: %w: %s", err, srv.Stderr)
		}
		defer stop()
		url := fmt.Sprintf("http://%s/", net.JoinHostPort(b.Iface0().Addr().String(), strconv.Itoa(httpPort)))
		// A short warm-up, then the measured run.
		warm := inHost(ctx, a, pinA, "wrk", "-t1", "-c"+strconv.Itoa(conns), "-d1s", url)
		warm.Run()
		cmd := inHost(ctx, a, pinA, "wrk", "-t1", "-c"+strconv.Itoa(conns),
			fmt.Sprintf("-d%.0fs", seconds), "--latency", "--timeout", "5s", url)
		out, err := cmd.Output()
		if err != nil {
			return fmt.Errorf("wrk: %w: %s", err, cmd.Stderr)
		}
		res, err = parseWrk(out)
		return err
	})
	return res, err
}

// httpRatios are the section's headline figures: medians of per-round
// ratios of sockets to net at each connection count.
func httpRatios(rs []HTTPResult) map[string]float64 {
	by := map[string]HTTPResult{}
	for _, r := range rs {
		by[fmt.Sprintf("%s/%d", r.ID, r.Conns)] = r
	}
	out := map[string]float64{}
	for _, r := range rs {
		if r.ID != "http-sockets" {
			continue
		}
		n, ok := by[fmt.Sprintf("http-net/%d", r.Conns)]
		if !ok {
			continue
		}
		out[fmt.Sprintf("c%d_sockets_vs_net_requests", r.Conns)] = round3(medianRatio(r.RoundsRPS, n.RoundsRPS))
		out[fmt.Sprintf("c%d_sockets_vs_net_p50", r.Conns)] = round3(medianRatio(r.RoundsP50us, n.RoundsP50us))
		out[fmt.Sprintf("c%d_sockets_vs_net_p99", r.Conns)] = round3(medianRatio(r.RoundsP99us, n.RoundsP99us))
	}
	return out
}

func printHTTP(w io.Writer, rep *Report) {
	h := &rep.HTTP
	fmt.Fprintf(w, "\nServer: net/http, kernel wrk (1 thread) from the other host, %d rounds of %.0fs; medians over rounds\n\n", h.Rounds, h.Seconds)
	fmt.Fprintf(w, "%-52s %6s %10s %10s %10s %7s\n", "", "conns", "req/s", "p50 µs", "p99 µs", "errors")
	for _, r := range h.Results {
		fmt.Fprintf(w, "%-52s %6d %10.0f %10.1f %10.1f %7d\n", r.Name, r.Conns, r.ReqPerSec, r.P50us, r.P99us, r.Errors)
	}
	fmt.Fprintf(w, "\nmedian of per-round ratios, sockets / net:\n")
	for _, r := range h.Results {
		if r.ID != "http-sockets" {
			continue
		}
		fmt.Fprintf(w, "  %4d connections: requests/s %.3f, p50 %.3f, p99 %.3f\n", r.Conns,
			h.Ratios[fmt.Sprintf("c%d_sockets_vs_net_requests", r.Conns)],
			h.Ratios[fmt.Sprintf("c%d_sockets_vs_net_p50", r.Conns)],
			h.Ratios[fmt.Sprintf("c%d_sockets_vs_net_p99", r.Conns)])
	}
	fmt.Fprintf(w, "targets: at 32 and 256 connections requests/s >= 1.3 and p99 <= 1.0; at 1 connection p50 <= 0.6\n")
}
