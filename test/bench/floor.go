package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/test"
)

// Result is one contender's round-trip times: p50 and p99 are medians
// over rounds of each round's own (stats.go).
type Result struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	P50us       float64   `json:"p50_us"`
	P99us       float64   `json:"p99_us"`
	MinUs       float64   `json:"min_us"`
	Samples     int       `json:"samples"`
	Lost        int       `json:"lost"`
	RoundsP50us []float64 `json:"rounds_p50_us"`
	RoundsP99us []float64 `json:"rounds_p99_us"`
	Note        string    `json:"note,omitempty"`
}

// Report is the JSON bench writes.
type Report struct {
	Run struct {
		Date    string `json:"date"`
		Kernel  string `json:"kernel"`
		Go      string `json:"go"`
		CPUs    int    `json:"cpus"`
		Command string `json:"command"`
		Commit  string `json:"commit,omitempty"` // the revision built, "+dirty" with changes
	} `json:"run"`
	Floor struct {
		FrameBytes int                `json:"frame_bytes"`
		Rounds     int                `json:"rounds"`
		Results    []Result           `json:"results"`
		Ratios     map[string]float64 `json:"ratios"`
	} `json:"floor"`
	TCP struct {
		MessageBytes int                `json:"message_bytes"`
		Rounds       int                `json:"rounds"`
		Results      []Result           `json:"results"`
		Ratios       map[string]float64 `json:"ratios"`
		Targets      map[string]float64 `json:"targets"`
	} `json:"tcp"`
	API struct {
		MessageBytes int                `json:"message_bytes"`
		Rounds       int                `json:"rounds"`
		Results      []Result           `json:"results"`
		Bulk         []BulkResult       `json:"bulk"`
		Ratios       map[string]float64 `json:"ratios"`
		Targets      map[string]float64 `json:"targets"`
	} `json:"api"`
	HTTP struct {
		Rounds  int                `json:"rounds"`
		Seconds float64            `json:"seconds"`
		Results []HTTPResult       `json:"results"`
		Ratios  map[string]float64 `json:"ratios"`
		Targets map[string]float64 `json:"targets"`
	} `json:"http"`
	Goodput struct {
		Rounds  int                `json:"rounds"`
		Seconds float64            `json:"seconds"`
		Results []GoodputResult    `json:"results"`
		Targets map[string]float64 `json:"targets"`
	} `json:"goodput"`
	Shim     *ShimReport     `json:"shim,omitempty"`
	Handover *HandoverReport `json:"handover,omitempty"`
}

func floorMain(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	nRounds := fs.Int("rounds", 20, "rounds per contender, interleaved so that drift in a noisy machine hits all alike")
	count := fs.Int("count", 10000, "round trips per round for the AF_XDP and TCP contenders")
	seconds := fs.Int("sockperf-seconds", 1, "seconds per sockperf round")
	apiRounds := fs.Int("api-rounds", 5, "rounds of the public API contenders (0: skip them)")
	apiCount := fs.Int("api-count", 20000, "round trips per API ping-pong round")
	bulkSeconds := fs.Float64("bulk-seconds", 2, "seconds per bulk transfer")
	gpRounds := fs.Int("goodput-rounds", 3, "rounds of the goodput contenders on each faulty path (0: skip them)")
	gpSeconds := fs.Float64("goodput-seconds", 10, "seconds per goodput transfer")
	httpRounds := fs.Int("http-rounds", 5, "rounds of the net/http server contenders (0: skip them)")
	httpSeconds := fs.Float64("http-seconds", 4, "seconds per wrk run")
	httpConns := fs.String("http-conns", "1,32,256", "wrk connection counts, comma-separated")
	shimRounds := fs.Int("shim-rounds", 5, "rounds of the LD_PRELOAD shim's contenders: sockperf, redis, iperf3, memcached, nginx, and the server floor in the servers' places (0: skip them)")
	handovers := fs.Int("handovers", 200, "connections handed over to the kernel in the handover section (0: skip it)")
	out := fs.String("out", "test/bench/results/bench.json", "where to write the JSON ('' for nowhere)")
	fs.Parse(args)
	var conns []int
	for _, f := range strings.Split(*httpConns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10000 {
			return fmt.Errorf("-http-conns %q: want connection counts from 1 to 10000, comma-separated", *httpConns)
		}
		conns = append(conns, n)
	}
	if *nRounds < 0 || *count < 100 || *seconds < 1 || *apiRounds < 0 || *apiCount < 100 || *bulkSeconds < 0.1 || *gpRounds < 0 || *gpSeconds < 1 {
		return errors.New("-rounds must be at least 0, -count and -api-count at least 100, -sockperf-seconds at least 1, -api-rounds and -goodput-rounds at least 0, -bulk-seconds at least 0.1, -goodput-seconds at least 1")
	}
	for _, tool := range []string{"sockperf", "taskset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: apt-get install sockperf util-linux", tool)
		}
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}

	n, a, b, err := test.NewPair(test.LinkOptions{})
	if err != nil {
		return err
	}
	defer n.Close()
	// Tear the hosts down on ^C too.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	ib := b.Iface0()
	pinA, pinB := pin(0), pin(1)
	accs := map[string]*rounds{"ours": {}, "asavie": {}, "stack": {}, "kernel": {}}
	for r := range *nRounds {
		for _, impl := range []string{"ours", "asavie"} {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			res, err := xdpRound(ctx, self, a, b, pinA, pinB, impl, ib.MAC.String(), *count)
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", r+1, impl, err)
			}
			accs[impl].add(res.RTTs, res.Lost)
			fmt.Fprintf(os.Stderr, "round %d %-7s p50 %6.2f us  p99 %6.2f us\n", r+1, impl, pct(res.RTTs, 50), pct(res.RTTs, 99))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		res, err := stackRound(ctx, self, a, b, pinA, pinB, *count)
		if err != nil {
			return fmt.Errorf("round %d, our tcp: %w", r+1, err)
		}
		accs["stack"].add(res.RTTs, 0)
		fmt.Fprintf(os.Stderr, "round %d stack   p50 %6.2f us  p99 %6.2f us (tcp)\n", r+1, pct(res.RTTs, 50), pct(res.RTTs, 99))
		sp, err := sockperfRound(ctx, a, b, pinA, pinB, ib.Addr().String(), *seconds)
		if err != nil {
			return fmt.Errorf("round %d, sockperf: %w", r+1, err)
		}
		fmt.Fprintf(os.Stderr, "round %d kernel  p50 %6.2f us  p99 %6.2f us (sockperf)\n", r+1, sp.P50us, sp.P99us)
		accs["kernel"].addPercentiles(sp.P50us, sp.P99us, sp.MinUs, sp.Samples)
	}

	apiAccs := map[string]*apiAcc{}
	for _, c := range append(slices.Clone(apiPing), apiBulk...) {
		apiAccs[c.id] = &apiAcc{}
	}
	for r := range *apiRounds {
		fmt.Fprintf(os.Stderr, "api round %d\n", r+1)
		if err := apiRound(ctx, self, a, b, pinA, pinB, *apiCount, *bulkSeconds, apiAccs); err != nil {
			return fmt.Errorf("api round %d: %w", r+1, err)
		}
	}

	var rep Report
	if *apiRounds > 0 {
		apiReport(&rep, *apiRounds, apiAccs)
	}
	if *gpRounds > 0 {
		res, err := goodputSection(ctx, *gpRounds, *gpSeconds)
		if err != nil {
			return fmt.Errorf("goodput: %w", err)
		}
		rep.Goodput.Rounds, rep.Goodput.Seconds, rep.Goodput.Results = *gpRounds, *gpSeconds, res
		rep.Goodput.Targets = map[string]float64{"ours_vs_kernel": 0.9}
	}
	rep.Run.Date = time.Now().UTC().Format(time.RFC3339)
	rep.Run.Kernel = kernelRelease()
	rep.Run.Go = runtime.Version()
	rep.Run.CPUs = runtime.NumCPU()
	rep.Run.Command = "make bench"
	rep.Run.Commit = commit
	if *httpRounds > 0 {
		res, err := httpSection(ctx, self, a, b, pinA, pinB, *httpRounds, conns, *httpSeconds)
		if err != nil {
			return fmt.Errorf("http: %w", err)
		}
		rep.HTTP.Rounds, rep.HTTP.Seconds, rep.HTTP.Results = *httpRounds, *httpSeconds, res
		rep.HTTP.Ratios = httpRatios(res)
		rep.HTTP.Targets = map[string]float64{
			"c32_sockets_vs_net_requests": 1.3, "c256_sockets_vs_net_requests": 1.3,
			"c32_sockets_vs_net_p99": 1.0, "c256_sockets_vs_net_p99": 1.0, "c1_sockets_vs_net_p50": 0.6,
		}
	}
	if *nRounds > 0 {
		floorReport(&rep, *nRounds, accs)
	}
	if *shimRounds > 0 {
		if rep.Shim, err = shimSection(ctx, self, a, b, pinA, pinB, *shimRounds, *count, *seconds); err != nil {
			return fmt.Errorf("shim: %w", err)
		}
	}
	if *handovers > 0 {
		if rep.Handover, err = handoverSection(ctx, a, b, *handovers); err != nil {
			return fmt.Errorf("handover: %w", err)
		}
	}
	printTable(os.Stdout, &rep)
	if *out != "" {
		if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
			return err
		}
		j, _ := json.MarshalIndent(&rep, "", "  ")
		if err := os.WriteFile(*out, append(j, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Printf("\nwritten to %s\n", *out)
	}
	return nil
}

func floorReport(rep *Report, n int, accs map[string]*rounds) {
	rep.Floor.FrameBytes = 64
	rep.Floor.Rounds = n
	ours := accs["ours"].result("xdp-ours", "this project's rings (xdp + vnic), AF_XDP busy-poll")
	asv := accs["asavie"].result("xdp-asavie", "github.com/asavie/xdp v0.3.3, AF_XDP busy-poll")
	kern := accs["kernel"].result("kernel-tcp", "Linux kernel TCP, sockperf ping-pong --nonblocked --tcp -m 64")
	kern.Note = "sockperf reports percentiles, not samples: each round's p50 and p99 are sockperf's own"
	rep.Floor.Results = []Result{ours, asv, kern}
	rep.Floor.Ratios = map[string]float64{
		"ours_vs_asavie_p50":     round3(medianRatio(ours.RoundsP50us, asv.RoundsP50us)),
		"ours_vs_asavie_p99":     round3(medianRatio(ours.RoundsP99us, asv.RoundsP99us)),
		"ours_vs_kernel_tcp_p50": round3(medianRatio(ours.RoundsP50us, kern.RoundsP50us)),
	}
	ourTCP := accs["stack"].result("tcp-ours", "this project's TCP on both ends, busy-poll (64-byte ping-pong)")
	rep.TCP.MessageBytes = 64
	rep.TCP.Rounds = n
	rep.TCP.Results = []Result{ourTCP, kern, ours}
	rep.TCP.Ratios = map[string]float64{
		"ours_tcp_vs_floor_p50":      round3(medianRatio(ourTCP.RoundsP50us, ours.RoundsP50us)),
		"ours_tcp_vs_kernel_tcp_p50": round3(medianRatio(ourTCP.RoundsP50us, kern.RoundsP50us)),
		"ours_tcp_vs_kernel_tcp_p99": round3(medianRatio(ourTCP.RoundsP99us, kern.RoundsP99us)),
	}
	rep.TCP.Targets = map[string]float64{"ours_tcp_vs_floor_p50": 1.5, "ours_tcp_vs_kernel_tcp_p50": 0.6}
}

// pin returns the taskset prefix that puts a process on cpu, or nothing on
// a one-CPU machine.
func pin(cpu int) []string {
	if runtime.NumCPU() < 2 {
		return nil
	}
	return []string{"taskset", "-c", strconv.Itoa(cpu)}
}

func inHost(ctx context.Context, h *test.Host, pin []string, name string, args ...string) *exec.Cmd {
	argv := append(append([]string{"netns", "exec", h.NS}, pin...), name)
	cmd := exec.CommandContext(ctx, "ip", append(argv, args...)...)
	cmd.Stderr = new(test.LimitedBuffer)
	return cmd
}

// startServer starts a server process and waits until ready says it is
// up (ready is polled every 20ms for up to 10s).
func startServer(cmd *exec.Cmd, ready func() bool) (stop func(), err error) {
	if cmd.Stdout == nil {
		cmd.Stdout = io.Discard
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for !ready() {
		select {
		case <-exited:
			return nil, errors.New("server exited before it was ready")
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, errors.New("server not ready after 10s")
		}
	}
	return stop, nil
}

// listening reports whether something in host h listens on TCP port.
func listening(h *test.Host, port int) func() bool {
	return func() bool {
		out, err := h.Command("ss", "-Hltn", "sport", "=", ":"+strconv.Itoa(port)).Output()
		return err == nil && len(bytes.TrimSpace(out)) > 0
	}
}

// helperRound runs one echo process in b and one ping process in a, with
// the given arguments, retried while the queue is still held (queueRetry).
func helperRound(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, echoArgs, pingArgs []string) (*pingResult, error) {
	var res *pingResult
	err := queueRetry(ctx, 200*time.Millisecond, func() (err error) {
		res, err = helperRoundOnce(ctx, self, a, b, pinA, pinB, echoArgs, pingArgs)
		return err
	})
	return res, err
}

// queueRetry runs fn up to 5 times, pause apart, until it succeeds or ctx
// ends. A closed AF_XDP socket releases its queue a moment after its
// process exits, so the next helper process may find it still held.
func queueRetry(ctx context.Context, pause time.Duration, fn func() error) error {
	var err error
	for try := 0; try < 5; try++ {
		if try > 0 {
			time.Sleep(pause)
		}
		if err = fn(); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// startHelper starts one of the bench's own server roles (self with
// args) in host h and waits until it says "ready".
func startHelper(ctx context.Context, h *test.Host, pin []string, self string, args ...string) (stop func(), err error) {
	cmd := inHost(ctx, h, pin, self, args...)
	out := new(test.LimitedBuffer)
	cmd.Stdout = out
	if stop, err = startServer(cmd, func() bool { return strings.Contains(out.String(), "ready") }); err != nil {
		return nil, fmt.Errorf("%w: %s", err, cmd.Stderr)
	}
	return stop, nil
}

func helperRoundOnce(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, echoArgs, pingArgs []string) (*pingResult, error) {
	stop, err := startHelper(ctx, b, pinB, self, echoArgs...)
	if err != nil {
		return nil, fmt.Errorf("echo: %w", err)
	}
	defer stop()
	cmd := inHost(ctx, a, pinA, self, pingArgs...)
	outb, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ping: %w: %s", err, cmd.Stderr)
	}
	var res pingResult
	if err := json.Unmarshal(outb, &res); err != nil {
		return nil, fmt.Errorf("ping output: %w", err)
	}
	return &res, nil
}

// xdpRound is one floor round for one ring library.
func xdpRound(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, impl, dstMAC string, count int) (*pingResult, error) {
	return helperRound(ctx, self, a, b, pinA, pinB,
		[]string{"echo", "-impl", impl, "-iface", b.Iface0().Name},
		[]string{"ping", "-impl", impl, "-iface", a.Iface0().Name,
			"-src", a.Iface0().Addr().String(), "-dst", b.Iface0().Addr().String(), "-dst-mac", dstMAC,
			"-count", strconv.Itoa(count)})
}

// stackRound is one round of TCP ping-pong through our stack on both ends.
func stackRound(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, count int) (*pingResult, error) {
	return helperRound(ctx, self, a, b, pinA, pinB,
		[]string{"stack-echo", "-iface", b.Iface0().Name, "-addr", b.Iface0().Prefix.String()},
		[]string{"stack-ping", "-iface", a.Iface0().Name, "-addr", a.Iface0().Prefix.String(),
			"-dst", b.Iface0().Addr().String(), "-count", strconv.Itoa(count)})
}

var percentileLine = regexp.MustCompile(`percentile\s+([0-9.]+)\s*=\s*([0-9.]+)`)
var minLine = regexp.MustCompile(`<MIN> observation\s*=\s*([0-9.]+)`)
var totalLine = regexp.MustCompile(`Total (\d+) observations`)

// sockperfRound runs the kernel's TCP ping-pong: sockperf server in b,
// client in a, both non-blocking and busy-polling, 64-byte messages,
// round-trip times (--full-rtt).
func sockperfRound(ctx context.Context, a, b *test.Host, pinA, pinB []string, addr string, seconds int) (Result, error) {
	return sockperfPingPong(ctx, a, b, pinA, pinB, "", addr, 11111, seconds, true)
}

func parseSockperf(out []byte) (Result, error) {
	r := Result{ID: "kernel-tcp", Name: "Linux kernel TCP, sockperf ping-pong --nonblocked --tcp -m 64"}
	for _, m := range percentileLine.FindAllSubmatch(out, -1) {
		p, _ := strconv.ParseFloat(string(m[1]), 64)
		v, _ := strconv.ParseFloat(string(m[2]), 64)
		switch p {
		case 50:
			r.P50us = v
		case 99:
			r.P99us = v
		}
	}
	if m := minLine.FindSubmatch(out); m != nil {
		r.MinUs, _ = strconv.ParseFloat(string(m[1]), 64)
	}
	if m := totalLine.FindSubmatch(out); m != nil {
		r.Samples, _ = strconv.Atoi(string(m[1]))
	}
	if r.P50us == 0 || r.Samples == 0 {
		return r, fmt.Errorf("no percentiles in sockperf output:\n%s", bytes.TrimSpace(out))
	}
	return r, nil
}

// commit is the revision the binary was built from, set by the Makefile
// ("+dirty" when the tree had changes; empty when built another way).
var commit string

func kernelRelease() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	var b []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

func printTable(w io.Writer, rep *Report) {
	if len(rep.Floor.Results) > 0 {
		fmt.Fprintf(w, "\nFloor: 64-byte round trip over veth between two test hosts (%d rounds, %s, %d CPUs; medians over rounds of each round's percentiles)\n\n",
			rep.Floor.Rounds, rep.Run.Kernel, rep.Run.CPUs)
		fmt.Fprintf(w, "%-62s %9s %9s %9s\n", "", "p50 µs", "p99 µs", "samples")
		for _, r := range rep.Floor.Results {
			fmt.Fprintf(w, "%-62s %9.2f %9.2f %9d\n", r.Name, r.P50us, r.P99us, r.Samples)
		}
		fmt.Fprintf(w, "\nmedian of per-round ratios: ours / asavie p50 %.3f (target <= 1.0), p99 %.3f; ours / kernel TCP p50 %.3f\n",
			rep.Floor.Ratios["ours_vs_asavie_p50"], rep.Floor.Ratios["ours_vs_asavie_p99"], rep.Floor.Ratios["ours_vs_kernel_tcp_p50"])
	}
	if len(rep.TCP.Results) > 0 {
		fmt.Fprintf(w, "\nTCP: 64-byte ping-pong over the same veth pair\n\n")
		fmt.Fprintf(w, "%-62s %9s %9s %9s\n", "", "p50 µs", "p99 µs", "samples")
		for _, r := range rep.TCP.Results {
			fmt.Fprintf(w, "%-62s %9.2f %9.2f %9d\n", r.Name, r.P50us, r.P99us, r.Samples)
		}
		fmt.Fprintf(w, "\nmedian of per-round ratios: our TCP / floor p50 %.3f (target <= 1.5), our TCP / kernel TCP p50 %.3f (target <= 0.6)\n",
			rep.TCP.Ratios["ours_tcp_vs_floor_p50"], rep.TCP.Ratios["ours_tcp_vs_kernel_tcp_p50"])
	}
	if len(rep.API.Results) > 0 {
		printAPI(w, rep)
	}
	if len(rep.HTTP.Results) > 0 {
		printHTTP(w, rep)
	}
	if len(rep.Goodput.Results) > 0 {
		printGoodput(w, rep)
	}
	if rep.Handover != nil {
		printHandover(w, rep)
	}
	if rep.Shim != nil {
		printShim(w, rep)
	}
}
