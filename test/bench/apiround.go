package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/xdp-onload/onload/test"
)

// apiContender is one client library (and profile) of the API benchmark.
type apiContender struct {
	id, name string
	impl     string   // -impl of api-client
	env      []string // for sockets: the profile
	// daemon: the client gets its stack from an onloadd started in its
	// host for the run (standalone otherwise: the client makes its own).
	daemon bool
}

var apiPing = []apiContender{
	{"api-net", "standard net package (kernel TCP), blocking", "net", nil, false},
	{"api-sockets-nospin", "sockets, balanced, spinning off (ONLOAD_SPIN_US=0), blocking", "sockets", []string{"ONLOAD_PROFILE=balanced", "ONLOAD_SPIN_US=0"}, false},
	{"api-gonet", "gVisor netstack + gonet over AF_XDP", "gonet", nil, false},
	{"api-sockets-balanced", "sockets, balanced profile (default): spins 50 µs", "sockets", []string{"ONLOAD_PROFILE=balanced"}, false},
	{"api-sockets-latency", "sockets, latency profile: spins", "sockets", []string{"ONLOAD_PROFILE=latency"}, false},
	{"api-sockets-latency-onloadd", "sockets, latency profile, stack from onloadd", "sockets", []string{"ONLOAD_PROFILE=latency"}, true},
}

var apiBulk = []apiContender{
	{"bulk-net", "standard net package (kernel TCP)", "net", nil, false},
	{"bulk-gonet", "gVisor netstack + gonet over AF_XDP", "gonet", nil, false},
	{"bulk-sockets-balanced", "sockets, balanced profile (default)", "sockets", []string{"ONLOAD_PROFILE=balanced"}, false},
	{"bulk-sockets-throughput", "sockets, throughput profile", "sockets", []string{"ONLOAD_PROFILE=throughput"}, false},
}

// BulkResult is one contender's single-connection throughput.
type BulkResult struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Gbps       float64   `json:"gbit_per_s"` // median of rounds
	RoundsGbps []float64 `json:"rounds_gbit_per_s"`
}

// apiAcc gathers one contender's rounds.
type apiAcc struct {
	rounds
	gbps []float64
}

// apiRound runs every API contender once against one kernel server in b:
// ping-pong first, then bulk, each client a process of its own in a.
func apiRound(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, count int, bulkSeconds float64, accs map[string]*apiAcc) error {
	srv := inHost(ctx, b, pinB, self, "api-server", "-addr", b.Iface0().Addr().String())
	stop, err := startServer(srv, listening(b, apiSinkPort))
	if err != nil {
		return fmt.Errorf("api server: %w: %s", err, srv.Stderr)
	}
	defer stop()
	common := []string{"-dst", b.Iface0().Addr().String(), "-iface", a.Iface0().Name,
		"-addr", a.Iface0().Prefix.String(), "-dst-mac", b.Iface0().MAC.String()}
	for _, c := range apiPing {
		out, err := apiClient(ctx, self, a, pinA, c, append([]string{"-mode", "pingpong", "-count", strconv.Itoa(count)}, common...))
		if err != nil {
			return fmt.Errorf("%s: %w", c.id, err)
		}
		var res pingResult
		if err := json.Unmarshal(out, &res); err != nil || len(res.RTTs) == 0 {
			return fmt.Errorf("%s: output %q: %v", c.id, out, err)
		}
		accs[c.id].add(res.RTTs, 0)
		fmt.Fprintf(os.Stderr, "  %-24s p50 %7.2f us  p99 %7.2f us\n", c.id, pct(res.RTTs, 50), pct(res.RTTs, 99))
	}
	for _, c := range apiBulk {
		bps, err := bulkClient(ctx, self, a, pinA, c, append([]string{"-seconds", fmt.Sprint(bulkSeconds)}, common...))
		if err != nil {
			return err
		}
		g := bps / 1e9
		accs[c.id].gbps = append(accs[c.id].gbps, g)
		fmt.Fprintf(os.Stderr, "  %-24s %7.3f Gbit/s\n", c.id, g)
	}
	return nil
}

// bulkClient runs one api-client process in bulk mode: the bits per
// second the sink counted.
func bulkClient(ctx context.Context, self string, a *test.Host, pinA []string, c apiContender, args []string) (float64, error) {
	out, err := apiClient(ctx, self, a, pinA, c, append([]string{"-mode", "bulk"}, args...))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", c.id, err)
	}
	var res bulkResult
	if err := json.Unmarshal(out, &res); err != nil || res.Seconds == 0 {
		return 0, fmt.Errorf("%s: output %q: %v", c.id, out, err)
	}
	return float64(res.Bytes) * 8 / res.Seconds, nil
}

// apiClient runs one api-client process, retried while the queue is
// still held (queueRetry).
func apiClient(ctx context.Context, self string, a *test.Host, pinA []string, c apiContender, args []string) ([]byte, error) {
	var out []byte
	err := queueRetry(ctx, 300*time.Millisecond, func() (err error) {
		cmd := inHost(ctx, a, pinA, self, append([]string{"api-client", "-impl", c.impl}, args...)...)
		// Every Go client gets two processors (GOMAXPROCS=2) on its one
		// CPU: gVisor's AF_XDP endpoint blocks a processor in ppoll, and
		// with one it would stall the whole client. The same for all, so
		// that the libraries, not their settings, differ.
		cmd.Env = append(append(os.Environ(), "ONLOAD_INTERFACE="+a.Iface0().Name, "GOMAXPROCS=2", "ONLOAD_DAEMON=off"), c.env...)
		if c.daemon {
			sock, stop, err := startOnloadd(ctx, self, a, pinA)
			if err != nil {
				return err
			}
			defer stop()
			cmd.Env = append(cmd.Env, "ONLOAD_DAEMON=require", "ONLOAD_DAEMON_SOCKET="+sock)
		}
		if out, err = cmd.Output(); err != nil {
			return fmt.Errorf("%w: %s", err, cmd.Stderr)
		}
		return nil
	})
	return out, err
}

// apiReport fills the report's API section from the rounds.
func apiReport(rep *Report, rounds int, accs map[string]*apiAcc) {
	api := &rep.API
	api.MessageBytes = apiMsg
	api.Rounds = rounds
	byID := map[string]Result{}
	for _, c := range apiPing {
		r := accs[c.id].result(c.id, c.name)
		api.Results = append(api.Results, r)
		byID[c.id] = r
	}
	for _, c := range apiBulk {
		ac := accs[c.id]
		api.Bulk = append(api.Bulk, BulkResult{ID: c.id, Name: c.name, Gbps: round3(median(ac.gbps)), RoundsGbps: ac.gbps})
	}
	lat, bal, nospin, std, gn := byID["api-sockets-latency"], byID["api-sockets-balanced"], byID["api-sockets-nospin"], byID["api-net"], byID["api-gonet"]
	viaDaemon := byID["api-sockets-latency-onloadd"]
	bulk := func(a, b string) float64 { return round3(medianRatio(accs[a].gbps, accs[b].gbps)) }
	// Medians of per-round ratios, every one.
	api.Ratios = map[string]float64{
		"sockets_latency_vs_net_p50":        round3(medianRatio(lat.RoundsP50us, std.RoundsP50us)),
		"sockets_latency_vs_net_p99":        round3(medianRatio(lat.RoundsP99us, std.RoundsP99us)),
		"sockets_latency_vs_gonet_p50":      round3(medianRatio(lat.RoundsP50us, gn.RoundsP50us)),
		"sockets_balanced_vs_net_p50":       round3(medianRatio(bal.RoundsP50us, std.RoundsP50us)),
		"sockets_nospin_vs_net_p50":         round3(medianRatio(nospin.RoundsP50us, std.RoundsP50us)),
		"sockets_nospin_vs_net_p99":         round3(medianRatio(nospin.RoundsP99us, std.RoundsP99us)),
		"sockets_onloadd_vs_standalone_p50": round3(medianRatio(viaDaemon.RoundsP50us, lat.RoundsP50us)),
		"sockets_onloadd_vs_standalone_p99": round3(medianRatio(viaDaemon.RoundsP99us, lat.RoundsP99us)),
		"bulk_sockets_throughput_vs_gonet":  bulk("bulk-sockets-throughput", "bulk-gonet"),
		"bulk_sockets_throughput_vs_net":    bulk("bulk-sockets-throughput", "bulk-net"),
		"bulk_sockets_balanced_vs_net":      bulk("bulk-sockets-balanced", "bulk-net"),
	}
	api.Targets = map[string]float64{
		"sockets_latency_vs_net_p50": 0.5, "sockets_latency_vs_gonet_p50": 0.5, "bulk_sockets_throughput_vs_gonet": 1.5,
	}
}

func printAPI(w io.Writer, rep *Report) {
	api := &rep.API
	fmt.Fprintf(w, "\nPublic API: %d-byte Write then Read against a kernel server over the same veth pair (%d rounds; medians over rounds of each round's percentiles)\n\n", api.MessageBytes, api.Rounds)
	fmt.Fprintf(w, "%-62s %9s %9s %9s\n", "", "p50 µs", "p99 µs", "samples")
	for _, r := range api.Results {
		fmt.Fprintf(w, "%-62s %9.2f %9.2f %9d\n", r.Name, r.P50us, r.P99us, r.Samples)
	}
	fmt.Fprintf(w, "\nmedian of per-round ratios, p50: sockets (latency) / net %.3f (target <= 0.5), / gonet %.3f (target <= 0.5); blocking: sockets (spinning off) / net %.3f\n",
		api.Ratios["sockets_latency_vs_net_p50"], api.Ratios["sockets_latency_vs_gonet_p50"], api.Ratios["sockets_nospin_vs_net_p50"])
	fmt.Fprintf(w, "the daemon off the data path: sockets (latency), stack from onloadd / standalone, p50 %.3f, p99 %.3f (target: within noise)\n",
		api.Ratios["sockets_onloadd_vs_standalone_p50"], api.Ratios["sockets_onloadd_vs_standalone_p99"])
	fmt.Fprintf(w, "\nSingle-connection bulk throughput, median of rounds\n\n")
	for _, r := range api.Bulk {
		fmt.Fprintf(w, "%-62s %7.3f Gbit/s\n", r.Name, r.Gbps)
	}
	fmt.Fprintf(w, "\nmedian of per-round ratios: sockets (throughput) / gonet %.3f (target >= 1.5), / net %.3f\n",
		api.Ratios["bulk_sockets_throughput_vs_gonet"], api.Ratios["bulk_sockets_throughput_vs_net"])
}

// startOnloadd runs onloadd (this binary's onloadd command) in host h
// with its control socket in a new directory, and waits for the socket.
func startOnloadd(ctx context.Context, self string, h *test.Host, pin []string) (sock string, stop func(), err error) {
	dir, err := os.MkdirTemp("", "onload-bench-")
	if err != nil {
		return "", nil, err
	}
	sock = filepath.Join(dir, "onloadd.sock")
	cmd := inHost(ctx, h, pin, self, "onloadd", "-socket", sock)
	stopd, err := startServer(cmd, func() bool { _, err := os.Stat(sock); return err == nil })
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("onloadd: %w: %s", err, cmd.Stderr)
	}
	return sock, func() { stopd(); os.RemoveAll(dir) }, nil
}
