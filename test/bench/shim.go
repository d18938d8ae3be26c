package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xdp-onload/onload/test"
)

// The shim section: unmodified programs run with `onloadd run` (the
// LD_PRELOAD shim, standalone: ONLOAD_DAEMON=off) beside the same
// programs on the kernel, in the same rounds.
//
//   - sockperf's 64-byte TCP ping-pong, each end pinned to its own CPU:
//     both ends under the shim as its users run it (blocking calls, which
//     spin for the profile's spin time before they block: 50 µs), both
//     ends on the kernel as its users run it (blocking calls, no spin),
//     and both ends on the kernel busy-polling (--nonblocked); beside them
//     the floor (a raw AF_XDP ping-pong) in the same round.
//   - redis-server under the shim against redis-server on the kernel,
//     loaded by the kernel's redis-benchmark (50 clients, GET, not
//     pipelined and 16 pipelined), unpinned, as their users run them,
//     back to back with the server floor in redis-server's place: the
//     kernel's, the shim's and the floor's figures of a round are seconds
//     apart, the shim's between the other two.
//   - iperf3's client under the shim against the kernel's client, both to
//     the kernel's server, one connection for 3 s, beside the Go
//     library's bulk (sockets against net, one connection for 3 s to a Go
//     sink on the kernel) placed the same way in the same round, which
//     is the figure the shim's iperf3 is held to; memcached -t 2 under
//     the shim against the kernel's, loaded by memcslap (8 threads, get);
//     nginx (a master and 2 workers sharing one listening socket, its
//     workers on one stack from onloadd) under the shim, against nginx
//     on the kernel, loaded by wrk (2 threads, 50 connections, a 1 KiB
//     file); and on a second pair of hosts whose veth has two queues,
//     wrk's connections spread over them by source port
//     (test.QueueSteer.Spread, as a NIC's RSS hash spreads them), nginx
//     under the shim as a cluster (a stack for each worker, on a queue
//     each: onloadd run -cluster) and on the kernel, with the listening
//     socket its workers inherit ("nginx-cluster") and with reuseport (a
//     listening socket each).
//   - memcached with one worker (-t 1) and with two (-t 2), under the
//     shim and on the kernel, loaded by mcping (mcping/mcping.c: 8
//     connections, each one get at a time, a client that costs little a
//     request): what a server's second thread costs on each stack, in
//     gets a second and in a get's 99th percentile.
//   - threadsrv (threadsrv/threadsrv.c: a thread a connection, each
//     blocked in read(), as apache's workers, varnish's and MariaDB's
//     serve) under the shim and on the kernel, loaded by wrk (2 threads,
//     50 connections, a 1 KiB body): what a server of many threads
//     pays on each stack. No target; the README says where it stands.
//   - the server floor (respond.go) in each server's place, the same
//     clients, in the same round: raw AF_XDP with canned replies and no
//     TCP, one thread that spins 50 µs and then blocks, as the shim's
//     balanced profile does. It says whether a kernel ratio is within
//     the path's reach, and what share of it the shim takes.
//   - the cost of interposition on a call that is not ours: read() of
//     an empty pipe beyond the same system call through syscall(2), with
//     the shim and without (bin/shim-mixed bench).

// ShimReport is the shim section of the report.
type ShimReport struct {
	Rounds  int                `json:"rounds"`
	Results []Result           `json:"results"`
	Redis   []ThroughputResult `json:"throughput"` // redis, iperf3, memcached
	ReadNs  map[string]float64 `json:"read_ns"`    // ns a read() of an empty pipe costs beyond syscall(2): "kernel", "shim"
	// CPU: redis-server's threads during redis-benchmark, medians over
	// rounds: µs of CPU a GET (all threads; on the kernel, TCP's receive
	// runs in the client's context, under the shim in redis-server's),
	// and under the shim its other threads' CPU (the Go runtime's) over
	// its main thread's.
	CPU     map[string]float64 `json:"cpu"`
	Ratios  map[string]float64 `json:"ratios"`
	Targets map[string]float64 `json:"targets"`
}

// ThroughputResult is one contender's requests per second: the median
// over rounds, and each round's.
type ThroughputResult struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	PerSec       float64   `json:"per_sec"`
	RoundsPerSec []float64 `json:"rounds_per_sec"`
	// RoundsP99us is each round's 99th percentile of a request's time,
	// where the load tool reports it (mcping).
	RoundsP99us []float64 `json:"rounds_p99_us,omitempty"`
	// RoundsIdle and RoundsStolen are each round's shares of the
	// machine's CPU time that were idle and that the hypervisor took
	// (machineShare), over the whole round: the server's start, its load
	// and its stop.
	RoundsIdle   []float64 `json:"rounds_idle,omitempty"`
	RoundsStolen []float64 `json:"rounds_stolen,omitempty"`
}

// shimTools finds onloadd and the shim beside the bench binary (make
// build puts them all in bin/).
func shimTools(self string) (onloadd, mixed string, err error) {
	dir := filepath.Dir(self)
	for _, f := range []string{"onloadd", "libonload.so", "libonload-core.so", "shim-mixed", "mcping", "threadsrv"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return "", "", fmt.Errorf("%s: run make build", err)
		}
	}
	for _, tool := range []string{"redis-server", "redis-benchmark", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			return "", "", fmt.Errorf("%s not found: apt-get install redis-server redis-tools", tool)
		}
	}
	return filepath.Join(dir, "onloadd"), filepath.Join(dir, "shim-mixed"), nil
}

// shimmed is cmd run under the shim (onloadd run), or as it is if
// onloadd is "".
func shimmed(onloadd string, argv ...string) []string {
	if onloadd == "" {
		return argv
	}
	return append([]string{"env", "ONLOAD_DAEMON=off", onloadd, "run", "--"}, argv...)
}

func shimSection(ctx context.Context, self string, a, b *test.Host, pinA, pinB []string, nRounds, count, seconds int) (*ShimReport, error) {
	onloadd, mixed, err := shimTools(self)
	if err != nil {
		return nil, err
	}
	ib := b.Iface0()
	// nginx's clusters run on hosts whose veth has two queues.
	n2, c, d, err := test.NewPair(test.LinkOptions{Queues: 2})
	if err != nil {
		return nil, err
	}
	defer n2.Close()
	spread, err := test.NewQueueSteer(c, c.Iface0().Name)
	if err != nil {
		return nil, fmt.Errorf("spreading wrk's connections over two queues: %w", err)
	}
	defer spread.Close()
	if err := spread.Spread(8090, 2); err != nil {
		return nil, err
	}
	accs := map[string]*rounds{"floor": {}, "kernel": {}, "kernel-busy": {}, "shim": {}}
	redis := map[string][]float64{}
	mcP99 := map[string][]float64{} // mcping rounds: a get's 99th percentile, µs
	// redis-server's CPU a GET (all its threads) and its other threads'
	// CPU over its main thread's, by round.
	cpuUs, others := map[string][]float64{}, map[string][]float64{}
	machine := machineWatch{}
	for r := range nRounds {
		res, err := xdpRound(ctx, self, a, b, pinA, pinB, "ours", ib.MAC.String(), count)
		if err != nil {
			return nil, fmt.Errorf("shim round %d, floor: %w", r+1, err)
		}
		accs["floor"].add(res.RTTs, res.Lost)
		for _, side := range []string{"kernel", "kernel-busy", "shim"} {
			run := ""
			if side == "shim" {
				run = onloadd
			}
			sp, err := sockperfPingPong(ctx, a, b, pinA, pinB, run, ib.Addr().String(), 11112, seconds, side == "kernel-busy")
			if err != nil {
				return nil, fmt.Errorf("shim round %d, sockperf %s: %w", r+1, side, err)
			}
			accs[side].addPercentiles(sp.P50us, sp.P99us, sp.MinUs, sp.Samples)
			fmt.Fprintf(os.Stderr, "shim round %d sockperf %-11s p50 %6.2f us  p99 %6.2f us\n", r+1, side, sp.P50us, sp.P99us)
			if side == "kernel-busy" {
				continue
			}
			for _, tool := range []string{"iperf3", "gobulk", "memcslap", "memcaslap", "memcaslap-t2", "nginx", "nginx-cluster", "nginx-reuseport", "threadsrv"} {
				var v float64
				var err error
				done := machine.start(tool + "-" + side)
				switch tool {
				case "iperf3":
					v, err = iperfRound(ctx, a, b, run)
				case "gobulk":
					v, err = goBulkRound(ctx, self, a, b, side == "shim")
				case "nginx-cluster", "nginx-reuseport":
					v, err = serverRound(ctx, c, d, tool, server{side: side, onloadd: run})
				case "threadsrv":
					v, err = threadsrvRound(ctx, self, a, b, run)
				default:
					v, err = serverRound(ctx, a, b, tool, server{side: side, onloadd: run})
				}
				done()
				if err != nil {
					return nil, fmt.Errorf("shim round %d, %s %s: %w", r+1, tool, side, err)
				}
				id := tool + "-" + side
				redis[id] = append(redis[id], v)
				fmt.Fprintf(os.Stderr, "shim round %d %s %-6s %12.0f/s\n", r+1, tool, side, v)
			}
			for _, workers := range []int{1, 2} {
				done := machine.start(fmt.Sprintf("mcping-t%d-%s", workers, side))
				v, p99, err := memcachedPingRound(ctx, self, a, b, server{side: side, onloadd: run}, workers)
				done()
				if err != nil {
					return nil, fmt.Errorf("shim round %d, memcached -t %d %s: %w", r+1, workers, side, err)
				}
				id := fmt.Sprintf("mcping-t%d-%s", workers, side)
				redis[id] = append(redis[id], v)
				mcP99[id] = append(mcP99[id], p99)
				fmt.Fprintf(os.Stderr, "shim round %d memcached -t %d mcping %-6s %9.0f/s p99 %7.1f us\n", r+1, workers, side, v, p99)
			}
		}
		// redis: the kernel's, the shim's and the floor back to back, so
		// that a round's three figures are seconds apart, not minutes
		// (the machine drifts: a round's floor read 0.86-1.21M GETs a
		// second in one run); the shim's between the two, the order of
		// the others turned each round.
		sides := []string{"kernel", "shim", "floor"}
		if r%2 == 1 {
			sides = []string{"floor", "shim", "kernel"}
		}
		for _, pipe := range []int{1, 16} {
			for _, side := range sides {
				sv := server{side: side}
				switch side {
				case "shim":
					sv.onloadd = onloadd
				case "floor":
					sv.self = self
				}
				// The ids are the results' (the machine's shares are
				// looked up by them).
				id := fmt.Sprintf("redis-%s-p%d", side, pipe)
				if side == "floor" {
					id = fmt.Sprintf("redis-p%d-floor", pipe)
				}
				var cpu cpuUse
				done := machine.start(id)
				rps, err := redisRound(ctx, a, b, sv, pipe, &cpu)
				done()
				if err != nil {
					return nil, fmt.Errorf("shim round %d, redis %s -P %d: %w", r+1, side, pipe, err)
				}
				redis[id] = append(redis[id], rps)
				if side == "floor" {
					fmt.Fprintf(os.Stderr, "shim round %d redis floor  -P %-2d %9.0f GET/s\n", r+1, pipe, rps)
					continue
				}
				cpuUs[id] = append(cpuUs[id], cpu.perRequest())
				others[id] = append(others[id], cpu.othersShare())
				fmt.Fprintf(os.Stderr, "shim round %d redis %-6s -P %-2d %9.0f GET/s, %.2f us of CPU a GET, other threads %.3f of the main one's\n",
					r+1, side, pipe, rps, cpu.perRequest(), cpu.othersShare())
			}
		}
		// The server floor in the programs' place, the same clients.
		fl := server{side: "floor", self: self}
		for _, tool := range []string{"memcslap", "nginx"} {
			done := machine.start(tool + "-floor")
			v, err := serverRound(ctx, a, b, tool, fl)
			done()
			if err != nil {
				return nil, fmt.Errorf("shim round %d, %s floor: %w", r+1, tool, err)
			}
			redis[tool+"-floor"] = append(redis[tool+"-floor"], v)
			fmt.Fprintf(os.Stderr, "shim round %d %s floor %12.0f/s\n", r+1, tool, v)
		}
	}
	rep := &ShimReport{Rounds: nRounds, ReadNs: map[string]float64{}, CPU: map[string]float64{}}
	floor := accs["floor"].result("xdp-ours", "floor: this project's rings (xdp + vnic), AF_XDP busy-poll")
	kern := accs["kernel"].result("sockperf-kernel", "sockperf ping-pong -m 64, both ends on the kernel (blocking)")
	busy := accs["kernel-busy"].result("sockperf-kernel-busy", "sockperf ping-pong -m 64 --nonblocked, both ends on the kernel (busy-poll)")
	shim := accs["shim"].result("sockperf-shim", "sockperf ping-pong -m 64, both ends under the shim (spin 50µs, then block)")
	rep.Results = []Result{shim, kern, busy, floor}
	rep.Ratios = map[string]float64{
		"sockperf_shim_vs_kernel_p50":      round3(medianRatio(shim.RoundsP50us, kern.RoundsP50us)),
		"sockperf_shim_vs_kernel_p99":      round3(medianRatio(shim.RoundsP99us, kern.RoundsP99us)),
		"sockperf_shim_vs_kernel_busy_p50": round3(medianRatio(shim.RoundsP50us, busy.RoundsP50us)),
		"sockperf_shim_vs_floor_p50":       round3(medianRatio(shim.RoundsP50us, floor.RoundsP50us)),
		"sockperf_kernel_busy_vs_kernel":   round3(medianRatio(busy.RoundsP50us, kern.RoundsP50us)),
	}
	for _, pipe := range []int{1, 16} {
		for _, side := range []string{"shim", "kernel"} {
			id := fmt.Sprintf("redis-%s-p%d", side, pipe)
			name := fmt.Sprintf("redis-server on the %s, redis-benchmark -c 50 -t get -P %d", side, pipe)
			if side == "shim" {
				name = fmt.Sprintf("redis-server under the shim, redis-benchmark -c 50 -t get -P %d", pipe)
			}
			rep.Redis = append(rep.Redis, ThroughputResult{ID: id, Name: name, PerSec: median(redis[id]), RoundsPerSec: redis[id]})
		}
		rep.Ratios[fmt.Sprintf("redis_p%d_shim_vs_kernel", pipe)] = round3(medianRatio(redis[fmt.Sprintf("redis-shim-p%d", pipe)], redis[fmt.Sprintf("redis-kernel-p%d", pipe)]))
		fid := fmt.Sprintf("redis-p%d-floor", pipe)
		rep.Redis = append(rep.Redis, ThroughputResult{ID: fid, PerSec: median(redis[fid]), RoundsPerSec: redis[fid],
			Name: fmt.Sprintf("the server floor in redis-server's place (raw AF_XDP, canned replies), redis-benchmark -c 50 -t get -P %d", pipe)})
		floorRatios(rep, fmt.Sprintf("redis_p%d", pipe), redis[fmt.Sprintf("redis-shim-p%d", pipe)], redis[fmt.Sprintf("redis-kernel-p%d", pipe)], redis[fid])
		for _, side := range []string{"shim", "kernel"} {
			id := fmt.Sprintf("redis-%s-p%d", side, pipe)
			rep.CPU[fmt.Sprintf("redis_p%d_%s_us_per_get", pipe, side)] = round3(median(cpuUs[id]))
		}
		rep.CPU[fmt.Sprintf("redis_p%d_shim_others_vs_main", pipe)] = round3(median(others[fmt.Sprintf("redis-shim-p%d", pipe)]))
		rep.Ratios[fmt.Sprintf("redis_p%d_cpu_per_get_shim_vs_kernel", pipe)] = round3(medianRatio(cpuUs[fmt.Sprintf("redis-shim-p%d", pipe)], cpuUs[fmt.Sprintf("redis-kernel-p%d", pipe)]))
	}
	for _, tool := range []string{"iperf3", "gobulk", "memcslap", "memcaslap", "memcaslap-t2", "nginx", "nginx-cluster", "nginx-reuseport", "threadsrv"} {
		key := strings.ReplaceAll(tool, "-", "_")
		for _, side := range []string{"shim", "kernel"} {
			id := tool + "-" + side
			name := map[string]string{
				"iperf3-shim":            "iperf3 -c under the shim (one connection, 3 s), bits/s",
				"iperf3-kernel":          "iperf3 -c on the kernel (one connection, 3 s), bits/s",
				"gobulk-shim":            "the Go library's bulk: sockets (balanced), one connection, 3 s, bits/s",
				"gobulk-kernel":          "the Go library's baseline: net (the kernel), one connection, 3 s, bits/s",
				"memcslap-shim":          "memcached -t 2 under the shim, memcslap -c 8 get, keys/s",
				"memcslap-kernel":        "memcached -t 2 on the kernel, memcslap -c 8 get, keys/s",
				"memcaslap-shim":         "memcached -t 2 -m 1024 under the shim, memcaslap -T 1 -c 16 (9 gets to a set, a tenth verified), 4 s, operations/s",
				"memcaslap-kernel":       "memcached -t 2 -m 1024 on the kernel, memcaslap -T 1 -c 16 (9 gets to a set, a tenth verified), 4 s, operations/s",
				"memcaslap-t2-shim":      "memcached -t 2 -m 1024 under the shim, memcaslap -T 2 -c 16 (9 gets to a set, a tenth verified), 4 s, operations/s",
				"memcaslap-t2-kernel":    "memcached -t 2 -m 1024 on the kernel, memcaslap -T 2 -c 16 (9 gets to a set, a tenth verified), 4 s, operations/s",
				"nginx-shim":             "nginx (2 workers, one stack from onloadd) under the shim, wrk -t 2 -c 50, 1 KiB file, requests/s",
				"nginx-kernel":           "nginx (2 workers) on the kernel, wrk -t 2 -c 50, 1 KiB file, requests/s",
				"nginx-cluster-shim":     "nginx (2 workers, the listening socket they inherit, a cluster: a stack each from onloadd, on a queue each) under the shim, a two-queue veth, wrk -t 2 -c 50, 1 KiB file, requests/s",
				"nginx-cluster-kernel":   "nginx (2 workers, the listening socket they inherit) on the kernel, the same two-queue veth, wrk -t 2 -c 50, 1 KiB file, requests/s",
				"nginx-reuseport-shim":   "nginx (2 workers, listen reuseport, a cluster: a stack each from onloadd, on a queue each) under the shim, a two-queue veth, wrk -t 2 -c 50, 1 KiB file, requests/s",
				"nginx-reuseport-kernel": "nginx (2 workers, listen reuseport) on the kernel, the same two-queue veth, wrk -t 2 -c 50, 1 KiB file, requests/s",
				"threadsrv-shim":         "threadsrv (a thread a connection, each blocked in read(): as apache's workers, varnish's, MariaDB's) under the shim, wrk -t 2 -c 50, 1 KiB body, requests/s",
				"threadsrv-kernel":       "threadsrv (a thread a connection, each blocked in read()) on the kernel, wrk -t 2 -c 50, 1 KiB body, requests/s",
			}[id]
			rep.Redis = append(rep.Redis, ThroughputResult{ID: id, Name: name, PerSec: median(redis[id]), RoundsPerSec: redis[id]})
		}
		rep.Ratios[key+"_shim_vs_kernel"] = round3(medianRatio(redis[tool+"-shim"], redis[tool+"-kernel"]))
		if tool == "nginx-cluster" || tool == "nginx-reuseport" {
			// The floor does not see the listening socket (nginx's), and it
			// runs on the one-queue hosts.
			floorRatios(rep, key, redis[tool+"-shim"], redis[tool+"-kernel"], redis["nginx-floor"])
		} else if fl, ok := redis[tool+"-floor"]; ok {
			name := map[string]string{
				"memcslap": "the server floor in memcached's place (raw AF_XDP, one thread, canned replies), memcslap -c 8 get, keys/s",
				"nginx":    "the server floor in nginx's place (raw AF_XDP, one thread, canned replies), wrk -t 2 -c 50, requests/s",
			}[tool]
			rep.Redis = append(rep.Redis, ThroughputResult{ID: tool + "-floor", Name: name, PerSec: median(fl), RoundsPerSec: fl})
			floorRatios(rep, tool, redis[tool+"-shim"], redis[tool+"-kernel"], fl)
		}
	}
	for _, workers := range []int{1, 2} {
		for _, side := range []string{"shim", "kernel"} {
			id := fmt.Sprintf("mcping-t%d-%s", workers, side)
			name := fmt.Sprintf("memcached -t %d on the kernel, mcping 8 connections, gets", workers)
			if side == "shim" {
				name = fmt.Sprintf("memcached -t %d under the shim, mcping 8 connections, gets", workers)
			}
			rep.Redis = append(rep.Redis, ThroughputResult{ID: id, Name: name, PerSec: median(redis[id]), RoundsPerSec: redis[id], RoundsP99us: mcP99[id]})
		}
		shim, kern := fmt.Sprintf("mcping-t%d-shim", workers), fmt.Sprintf("mcping-t%d-kernel", workers)
		rep.Ratios[fmt.Sprintf("memcached_t%d_mcping_shim_vs_kernel", workers)] = round3(medianRatio(redis[shim], redis[kern]))
		rep.Ratios[fmt.Sprintf("memcached_t%d_mcping_shim_vs_kernel_p99", workers)] = round3(medianRatio(mcP99[shim], mcP99[kern]))
	}
	for i := range rep.Redis {
		rep.Redis[i].RoundsIdle, rep.Redis[i].RoundsStolen = machine.rounds(rep.Redis[i].ID)
	}
	// The iperf3 target: the shim's client beside the kernel's, against
	// the Go library beside net in the same round (a ratio of ratios,
	// then the median over rounds).
	var iperfVsGo []float64
	for i := range min(len(redis["iperf3-shim"]), len(redis["gobulk-shim"])) {
		iperfVsGo = append(iperfVsGo, (redis["iperf3-shim"][i]/redis["iperf3-kernel"][i])/(redis["gobulk-shim"][i]/redis["gobulk-kernel"][i]))
	}
	rep.Ratios["iperf3_vs_gobulk"] = round3(median(iperfVsGo))
	for _, side := range []string{"kernel", "shim"} {
		run := ""
		if side == "shim" {
			run = onloadd
		}
		var ns []float64
		for range 5 {
			v, err := readBench(ctx, a, run, mixed)
			if err != nil {
				return nil, fmt.Errorf("read bench %s: %w", side, err)
			}
			ns = append(ns, v)
		}
		rep.ReadNs[side] = round3(median(ns))
	}
	rep.Ratios["read_shim_minus_kernel_ns"] = round3(rep.ReadNs["shim"] - rep.ReadNs["kernel"])
	rep.Targets = map[string]float64{"sockperf_shim_vs_kernel_p50": 0.6, "redis_p1_shim_vs_kernel": 1.3, "redis_p16_shim_vs_kernel": 1.3,
		"nginx_shim_vs_kernel": 1.3, "nginx_cluster_shim_vs_kernel": 1.3, "nginx_reuseport_shim_vs_kernel": 1.3, "iperf3_vs_gobulk": 1, "memcaslap_shim_vs_kernel": 1}
	return rep, nil
}

// sockperfPingPong runs sockperf's 64-byte TCP ping-pong, server in host
// b on port, client in host a, both ends under the shim when onloadd is
// set, busy-polling (--nonblocked) if busy.
func sockperfPingPong(ctx context.Context, a, b *test.Host, pinA, pinB []string, onloadd, addr string, port, seconds int, busy bool) (Result, error) {
	mode := []string{}
	if busy {
		mode = []string{"--nonblocked"}
	}
	p := strconv.Itoa(port)
	argv := shimmed(onloadd, append([]string{"sockperf", "sr", "--tcp", "-i", addr, "-p", p}, mode...)...)
	srv := inHost(ctx, b, pinB, argv[0], argv[1:]...)
	stop, err := startServer(srv, listening(b, port))
	if err != nil {
		return Result{}, fmt.Errorf("sockperf server: %w", err)
	}
	defer stop()
	var out []byte
	for try := 0; ; try++ {
		argv := shimmed(onloadd, append([]string{"sockperf", "pp", "--tcp", "-i", addr, "-p", p, "-m", "64",
			"-t", strconv.Itoa(seconds), "--full-rtt"}, mode...)...)
		cmd := inHost(ctx, a, pinA, argv[0], argv[1:]...)
		cmd.Stderr = nil
		out, err = cmd.CombinedOutput()
		if err == nil || try == 5 {
			break
		}
		time.Sleep(200 * time.Millisecond) // server still starting
	}
	if err != nil {
		return Result{}, fmt.Errorf("sockperf client: %w\n%s", err, out)
	}
	return parseSockperf(out)
}

var redisGets = regexp.MustCompile(`(?m)^GET: ([0-9.]+) requests per second`)

// serverRound is one round of tool's server (memcslap, memcaslap,
// memcaslap-t2 or an nginx) served as sv says: its clients' requests per
// second.
func serverRound(ctx context.Context, a, b *test.Host, tool string, sv server) (float64, error) {
	switch tool {
	case "memcslap":
		return memcachedRound(ctx, a, b, sv)
	case "memcaslap":
		return memcaslapRound(ctx, a, b, sv, 1)
	case "memcaslap-t2":
		return memcaslapRound(ctx, a, b, sv, 2)
	case "nginx", "nginx-cluster", "nginx-reuseport":
		return nginxRound(ctx, a, b, sv, strings.TrimPrefix(strings.TrimPrefix(tool, "nginx"), "-"))
	}
	return 0, fmt.Errorf("no server round for %q", tool)
}

// server is how a round serves its clients: the program on the kernel,
// under the shim (onloadd set), or the server floor in its place.
type server struct {
	side    string // "kernel", "shim" or "floor"
	onloadd string // the shim's: set for "shim"
	self    string // the bench binary, whose respond is the floor: set for "floor"
}

// start starts the round's server in host b: program, or for the floor
// the bench's respond on port, answering proto.
func (sv server) start(ctx context.Context, b *test.Host, port int, proto string, program func() (func(), error)) (stop func(), err error) {
	if sv.side != "floor" {
		return program()
	}
	err = queueRetry(ctx, 200*time.Millisecond, func() (err error) {
		stop, err = startHelper(ctx, b, nil, sv.self, "respond", "-iface", b.Iface0().Name, "-port", strconv.Itoa(port), "-proto", proto)
		if err != nil {
			return fmt.Errorf("floor: %w", err)
		}
		return nil
	})
	return stop, err
}

// floorRatios puts the shim and the kernel beside the server floor
// (median of per-round ratios): what share of the floor the shim reaches,
// and whether the floor itself reaches a kernel ratio.
func floorRatios(rep *ShimReport, key string, shim, kernel, floor []float64) {
	rep.Ratios[key+"_shim_vs_floor"] = round3(medianRatio(shim, floor))
	rep.Ratios[key+"_floor_vs_kernel"] = round3(medianRatio(floor, kernel))
}

// redisRound serves redis-benchmark from redis-server in host b (or the
// floor in its place): GET requests per second. If cpu is set, it gets
// the CPU redis-server's threads ran during the load (not the floor's).
func redisRound(ctx context.Context, a, b *test.Host, sv server, pipeline int, cpu *cpuUse) (float64, error) {
	pid := 0
	stop, err := sv.start(ctx, b, 6380, "redis", func() (func(), error) {
		argv := shimmed(sv.onloadd, "redis-server", "--bind", "0.0.0.0", "--port", "6380", "--save", "", "--appendonly", "no",
			"--protected-mode", "no", "--daemonize", "no")
		srv := inHost(ctx, b, nil, argv[0], argv[1:]...)
		stop, err := startServer(srv, listening(b, 6380))
		if err == nil {
			pid = srv.Process.Pid // ip, env and onloadd run exec it
		}
		return stop, err
	})
	if err != nil {
		return 0, fmt.Errorf("redis-server: %w", err)
	}
	defer stop()
	n := 100000
	if pipeline > 1 {
		n = 1000000
	}
	addr := b.Iface0().Addr().String()
	// The first connection makes the shim's stack: not timed.
	if out, err := a.RunFor(30*time.Second, "redis-cli", "-h", addr, "-p", "6380", "ping"); err != nil || !strings.Contains(out, "PONG") {
		return 0, fmt.Errorf("redis-cli ping: %v %s", err, out)
	}
	var cpu0 cpuUse
	if cpu != nil && pid != 0 {
		if cpu0, err = threadsCPU(pid); err != nil {
			return 0, err
		}
	}
	out, err := a.RunFor(2*time.Minute, "redis-benchmark", "-h", addr, "-p", "6380", "-c", "50", "-n", strconv.Itoa(n),
		"-t", "get", "-P", strconv.Itoa(pipeline), "-q")
	if err != nil {
		return 0, err
	}
	if cpu != nil && pid != 0 {
		u, err := threadsCPU(pid)
		if err != nil {
			return 0, err
		}
		*cpu = u.since(cpu0)
		cpu.requests = n
	}
	out = strings.ReplaceAll(out, "\r", "\n")
	m := redisGets.FindStringSubmatch(out)
	if m == nil || strings.Contains(out, "rror") {
		return 0, fmt.Errorf("redis-benchmark:\n%s", out)
	}
	return strconv.ParseFloat(m[1], 64)
}

var iperfBps = regexp.MustCompile(`"sum_received":\s*\{[^}]*"bits_per_second":\s*([0-9.e+]+)`)

// iperfRound runs iperf3's client in host a (under the shim when onloadd
// is set) against the kernel's server in host b for 3 s: the bits per
// second the server received.
func iperfRound(ctx context.Context, a, b *test.Host, onloadd string) (float64, error) {
	srv := inHost(ctx, b, nil, "iperf3", "-s", "-1", "-p", "5210")
	stop, err := startServer(srv, listening(b, 5210))
	if err != nil {
		return 0, fmt.Errorf("iperf3 server: %w", err)
	}
	defer stop()
	argv := shimmed(onloadd, "iperf3", "-c", b.Iface0().Addr().String(), "-p", "5210", "-t", "3", "-J")
	cmd := inHost(ctx, a, nil, argv[0], argv[1:]...)
	cmd.Stderr = io.Discard
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("iperf3 client: %w\n%s", err, out)
	}
	m := iperfBps.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no sum_received in:\n%s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// goBulkRound is the Go library's bulk in the iperf3 round's placement:
// one connection from host a (sockets, standalone and balanced, if ours;
// net otherwise) pushing for 3 s to the bench's Go sink on the kernel in
// host b, unpinned as iperf3 is. Bits per second.
func goBulkRound(ctx context.Context, self string, a, b *test.Host, ours bool) (float64, error) {
	srv := inHost(ctx, b, nil, self, "api-server", "-addr", b.Iface0().Addr().String())
	stop, err := startServer(srv, listening(b, apiSinkPort))
	if err != nil {
		return 0, fmt.Errorf("api server: %w: %s", err, srv.Stderr)
	}
	defer stop()
	id := "bulk-net"
	if ours {
		id = "bulk-sockets-balanced"
	}
	i := slices.IndexFunc(apiBulk, func(c apiContender) bool { return c.id == id })
	c := apiBulk[i]
	return bulkClient(ctx, self, a, nil, c, []string{"-seconds", "3", "-dst", b.Iface0().Addr().String()})
}

var memcslapTime = regexp.MustCompile(`Time to get\s+(\d+) keys by\s+\d+ threads:\s+([0-9.]+) seconds`)

// memcachedRound serves memcslap (8 threads, get) in host a from
// memcached -t 2 in host b (or the floor in its place): keys read per
// second.
func memcachedRound(ctx context.Context, a, b *test.Host, sv server) (float64, error) {
	stop, err := startMemcached(ctx, b, sv, 2, 11290)
	if err != nil {
		return 0, err
	}
	defer stop()
	out, err := a.RunFor(2*time.Minute, "memcslap", "--servers="+b.Iface0().Addr().String()+":11290", "--test=get",
		"--concurrency=8", "--execute-number=20000")
	if err != nil {
		return 0, err
	}
	m := memcslapTime.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("memcslap:\n%s", out)
	}
	keys, _ := strconv.ParseFloat(m[1], 64)
	secs, _ := strconv.ParseFloat(m[2], 64)
	if secs <= 0 || keys == 0 {
		return 0, fmt.Errorf("memcslap read nothing:\n%s", out)
	}
	return keys / secs, nil
}

// memcaslapRound serves memcaslap (threads threads, 16 connections, 4 s;
// 9 gets to a set of a 1 KiB value, a tenth of the gets checked against
// what was set) in host a from memcached -t 2 in host b: operations a
// second. memcached has 1 GiB (-m 1024), so that nothing set is evicted
// (the default 64 MiB evicts within a round): a get that misses, or a
// value that is not what was set, fails the round.
func memcaslapRound(ctx context.Context, a, b *test.Host, sv server, threads int) (float64, error) {
	stop, err := startMemcached(ctx, b, sv, 2, 11290, "-m", "1024")
	if err != nil {
		return 0, err
	}
	defer stop()
	out, err := a.RunFor(time.Minute, "memcaslap", "-s", b.Iface0().Addr().String()+":11290", "-T", strconv.Itoa(threads),
		"-c", "16", "-t", "4s", "--verify=0.1")
	if err != nil {
		return 0, fmt.Errorf("memcaslap: %w\n%s", err, out)
	}
	return test.ParseMemcaslap(out)
}

// startMemcached starts memcached with workers threads on port in host
// b as sv says (or the floor in its place), with extra arguments.
func startMemcached(ctx context.Context, b *test.Host, sv server, workers, port int, extra ...string) (func(), error) {
	p := strconv.Itoa(port)
	stop, err := sv.start(ctx, b, port, "memcache", func() (func(), error) {
		argv := shimmed(sv.onloadd, append([]string{"memcached", "-t", strconv.Itoa(workers), "-p", p, "-U", "0", "-l", "0.0.0.0", "-u", "root", "-c", "1024"}, extra...)...)
		srv := inHost(ctx, b, nil, argv[0], argv[1:]...)
		return startServer(srv, listening(b, port))
	})
	if err != nil {
		return nil, fmt.Errorf("memcached: %w", err)
	}
	return stop, nil
}

var mcpingGets = regexp.MustCompile(`(?m)^gets (\d+) seconds (\d+) p50_us [0-9.]+ p99_us ([0-9.]+)`)

// memcachedPingRound serves mcping (8 connections, 3 s) in host a from
// memcached with workers threads in host b, under the shim or on the
// kernel: gets per second, and the 99th percentile of a get's time in µs.
func memcachedPingRound(ctx context.Context, self string, a, b *test.Host, sv server, workers int) (perSec, p99us float64, err error) {
	const port = 11291
	stop, err := startMemcached(ctx, b, sv, workers, port)
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	out, err := a.RunFor(time.Minute, filepath.Join(filepath.Dir(self), "mcping"), b.Iface0().Addr().String(), strconv.Itoa(port), "8", "3")
	if err != nil {
		return 0, 0, fmt.Errorf("mcping: %w\n%s", err, out)
	}
	m := mcpingGets.FindStringSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("mcping:\n%s", out)
	}
	gets, _ := strconv.ParseFloat(m[1], 64)
	secs, _ := strconv.ParseFloat(m[2], 64)
	p99us, _ = strconv.ParseFloat(m[3], 64)
	return gets / secs, p99us, nil
}

var wrkRate = regexp.MustCompile(`Requests/sec:\s*([0-9.]+)`)

// nginxConf is the bench's nginx: a master and two workers sharing one
// listening socket (or, with reuseport in %[2]s, one each), a 1 KiB
// static file, sendfile on.
const nginxConf = `daemon off;
master_process on;
worker_processes 2;
user root;
error_log %[1]s/error.log warn;
pid %[1]s/nginx.pid;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  keepalive_requests 1000000;
  client_body_temp_path %[1]s;
  proxy_temp_path %[1]s;
  fastcgi_temp_path %[1]s;
  uwsgi_temp_path %[1]s;
  scgi_temp_path %[1]s;
  server { listen 8090%[2]s; root %[1]s; }
}
`

// nginxSettle is how long an nginx round waits, after the server's first
// answer, before its load (nginxRound).
const nginxSettle = 500 * time.Millisecond

// nginxRound serves wrk (2 threads, 50 connections, 3 s) in host a from
// nginx in host b (startNginx, as mode says), or the floor in its place.
// Requests per second.
func nginxRound(ctx context.Context, a, b *test.Host, sv server, mode string) (float64, error) {
	dir, err := os.MkdirTemp("", "onload-bench-nginx-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	url := "http://" + b.Iface0().Addr().String() + ":8090/index.html"
	stop, err := sv.start(ctx, b, 8090, "http", func() (func(), error) { return startNginx(ctx, a, b, sv.onloadd, dir, url, mode) })
	if err != nil {
		return 0, fmt.Errorf("nginx: %w", err)
	}
	defer stop()
	// The load starts once every worker is serving, as on a server that
	// has run a while: under the shim a worker accelerates its listener
	// at its first wait, and wrk's connections made before the last
	// worker's stack came up (the first answer is enough for
	// startNginx) stayed on the kernel for the whole round, 23-26 of
	// 50 as a cluster (docs/SHIM-PERFORMANCE.md). Every side waits
	// alike.
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(nginxSettle):
	}
	return wrkLoad(a, url)
}

// wrkLoad runs wrk (2 threads, 50 connections, 3 s) in host a on url:
// requests a second, an error if any request failed.
func wrkLoad(a *test.Host, url string) (float64, error) {
	out, err := a.RunFor(time.Minute, "wrk", "-t", "2", "-c", "50", "-d", "3s", url)
	if err != nil {
		return 0, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	m := wrkRate.FindStringSubmatch(out)
	if m == nil || strings.Contains(out, "Socket errors") || strings.Contains(out, "Non-2xx") {
		return 0, fmt.Errorf("wrk:\n%s", out)
	}
	return strconv.ParseFloat(m[1], 64)
}

// answers reports whether url answers host a's curl with a success.
func answers(a *test.Host, url string) func() bool {
	return func() bool {
		out, err := a.RunFor(5*time.Second, "curl", "-sS", "--fail", "-o", "/dev/null", url)
		return err == nil && out == ""
	}
}

// threadsrvRound serves wrk (2 threads, 50 connections, 3 s) in host a
// from threadsrv (threadsrv/threadsrv.c: a thread a connection) in host
// b, under the shim (standalone) when onloadd is set: requests a second.
func threadsrvRound(ctx context.Context, self string, a, b *test.Host, onloadd string) (float64, error) {
	const port = 8092
	url := "http://" + b.Iface0().Addr().String() + ":" + strconv.Itoa(port) + "/"
	argv := shimmed(onloadd, filepath.Join(filepath.Dir(self), "threadsrv"), strconv.Itoa(port))
	srv := inHost(ctx, b, nil, argv[0], argv[1:]...)
	stop, err := startServer(srv, answers(a, url))
	if err != nil {
		return 0, fmt.Errorf("threadsrv: %w", err)
	}
	defer stop()
	return wrkLoad(a, url)
}

// startNginx starts nginx in host b from dir, a master and two workers:
// under the shim when onloadd is set, with onloadd run in host b for the
// round. By mode: "" its workers share the listening socket they inherit
// and one stack from onloadd; "cluster" they share the socket, each on a
// stack of its own (onloadd run -cluster); "reuseport" each worker
// listens on a socket of its own, on a stack of its own (a cluster).
func startNginx(ctx context.Context, a, b *test.Host, onloadd, dir, url, mode string) (func(), error) {
	reuseport := mode == "reuseport"
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(strings.Repeat("0123456789abcdef", 64)), 0o644); err != nil {
		return nil, err
	}
	conf := filepath.Join(dir, "nginx.conf")
	listen := ""
	if reuseport {
		listen = " reuseport"
	}
	if err := os.WriteFile(conf, fmt.Appendf(nil, nginxConf, dir, listen), 0o644); err != nil {
		return nil, err
	}
	argv := []string{"nginx", "-c", conf, "-p", dir}
	stopD := func() {}
	if onloadd != "" {
		sock := filepath.Join(dir, "onloadd.sock")
		od := inHost(ctx, b, nil, "env", "ONLOAD_DAEMON_SOCKET="+sock, onloadd, "serve")
		var err error
		stopD, err = startServer(od, func() bool { _, err := os.Stat(sock); return err == nil })
		if err != nil {
			return nil, fmt.Errorf("onloadd: %w", err)
		}
		run := []string{"env", "ONLOAD_DAEMON=require", "ONLOAD_DAEMON_SOCKET=" + sock,
			"ONLOAD_INTERFACE=" + b.Iface0().Name, onloadd, "run", "-n", "nginx"}
		if mode != "" {
			run = append(run, "-cluster")
		}
		argv = append(append(run, "--"), argv...)
	}
	srv := inHost(ctx, b, nil, argv[0], argv[1:]...)
	stopN, err := startServer(srv, answers(a, url))
	if err != nil {
		stopD()
		return nil, err
	}
	return func() { stopN(); stopD() }, nil
}

var readNs = regexp.MustCompile(`difference ([-0-9.]+) ns/op`)

// readBench is what a read() of an empty pipe costs beyond the same
// system call made with syscall(2) (median of per-block differences), in
// host a, under the shim when onloadd is set: interposition's cost.
func readBench(ctx context.Context, a *test.Host, onloadd, mixed string) (float64, error) {
	argv := shimmed(onloadd, mixed, "bench")
	cmd := inHost(ctx, a, nil, argv[0], argv[1:]...)
	cmd.Stderr = io.Discard
	out, err := cmd.Output()
	if err != nil {
		return 0, err
	}
	m := readNs.FindSubmatch(out)
	if m == nil {
		return 0, errors.New("no figure in: " + string(out))
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

func printShim(w io.Writer, rep *Report) {
	s := rep.Shim
	fmt.Fprintf(w, "\nThe LD_PRELOAD shim: unmodified programs under `onloadd run` beside the kernel (%d rounds)\n\n", s.Rounds)
	fmt.Fprintf(w, "%-72s %9s %9s\n", "", "p50 µs", "p99 µs")
	for _, r := range s.Results {
		fmt.Fprintf(w, "%-72s %9.2f %9.2f\n", r.Name, r.P50us, r.P99us)
	}
	fmt.Fprintf(w, "\n%-72s %12s\n", "", "per second")
	for _, r := range s.Redis {
		fmt.Fprintf(w, "%-72s %12.0f\n", r.Name, r.PerSec)
	}
	fmt.Fprintf(w, "\nread() of an empty pipe beyond syscall(2): %.1f ns without the shim, %.1f ns under it\n", s.ReadNs["kernel"], s.ReadNs["shim"])
	fmt.Fprintf(w, "median of per-round ratios: sockperf shim / kernel p50 %.3f (target <= 0.6), p99 %.3f; shim / kernel busy-polling p50 %.3f; shim / floor p50 %.3f; redis shim / kernel %.3f, pipelined %.3f (target >= 1.3)\n",
		s.Ratios["sockperf_shim_vs_kernel_p50"], s.Ratios["sockperf_shim_vs_kernel_p99"], s.Ratios["sockperf_shim_vs_kernel_busy_p50"],
		s.Ratios["sockperf_shim_vs_floor_p50"], s.Ratios["redis_p1_shim_vs_kernel"], s.Ratios["redis_p16_shim_vs_kernel"])
	fmt.Fprintf(w, "iperf3 client shim / kernel %.3f, the Go library's bulk sockets / net %.3f, the one over the other %.3f (target >= 1); memcached shim / kernel %.3f; nginx shim / kernel %.3f, as a cluster %.3f, with reuseport %.3f (target >= 1.3)\n",
		s.Ratios["iperf3_shim_vs_kernel"], s.Ratios["gobulk_shim_vs_kernel"], s.Ratios["iperf3_vs_gobulk"], s.Ratios["memcslap_shim_vs_kernel"], s.Ratios["nginx_shim_vs_kernel"], s.Ratios["nginx_cluster_shim_vs_kernel"], s.Ratios["nginx_reuseport_shim_vs_kernel"])
	fmt.Fprintf(w, "memcached under memcaslap, shim / kernel: one client thread %.3f (target > 1), two %.3f\n",
		s.Ratios["memcaslap_shim_vs_kernel"], s.Ratios["memcaslap_t2_shim_vs_kernel"])
	fmt.Fprintf(w, "a thread a connection (threadsrv), shim / kernel: %.3f (no target)\n", s.Ratios["threadsrv_shim_vs_kernel"])
	fmt.Fprintf(w, "memcached under mcping, shim / kernel: one worker (-t 1) %.3f (p99 %.3f), two (-t 2) %.3f (p99 %.3f)\n",
		s.Ratios["memcached_t1_mcping_shim_vs_kernel"], s.Ratios["memcached_t1_mcping_shim_vs_kernel_p99"],
		s.Ratios["memcached_t2_mcping_shim_vs_kernel"], s.Ratios["memcached_t2_mcping_shim_vs_kernel_p99"])
	fmt.Fprintf(w, "the server floor / kernel: redis %.3f, pipelined %.3f, memcached %.3f, nginx %.3f (cluster %.3f, reuseport %.3f); shim / the server floor: redis %.3f, pipelined %.3f, memcached %.3f, nginx %.3f (cluster %.3f, reuseport %.3f)\n",
		s.Ratios["redis_p1_floor_vs_kernel"], s.Ratios["redis_p16_floor_vs_kernel"], s.Ratios["memcslap_floor_vs_kernel"], s.Ratios["nginx_floor_vs_kernel"], s.Ratios["nginx_cluster_floor_vs_kernel"], s.Ratios["nginx_reuseport_floor_vs_kernel"],
		s.Ratios["redis_p1_shim_vs_floor"], s.Ratios["redis_p16_shim_vs_floor"], s.Ratios["memcslap_shim_vs_floor"], s.Ratios["nginx_shim_vs_floor"], s.Ratios["nginx_cluster_shim_vs_floor"], s.Ratios["nginx_reuseport_shim_vs_floor"])
	fmt.Fprintf(w, "redis-server's CPU a GET, µs (medians): shim %.2f, kernel %.2f (shim / kernel %.3f); pipelined %.2f, %.2f (%.3f); the Go runtime's threads over redis' own under the shim %.3f, pipelined %.3f\n",
		s.CPU["redis_p1_shim_us_per_get"], s.CPU["redis_p1_kernel_us_per_get"], s.Ratios["redis_p1_cpu_per_get_shim_vs_kernel"],
		s.CPU["redis_p16_shim_us_per_get"], s.CPU["redis_p16_kernel_us_per_get"], s.Ratios["redis_p16_cpu_per_get_shim_vs_kernel"],
		s.CPU["redis_p1_shim_others_vs_main"], s.CPU["redis_p16_shim_others_vs_main"])
	fmt.Fprintf(w, "the machine's CPU time the hypervisor took (steal), median share over rounds, shim / kernel:")
	for _, r := range s.Redis {
		if !strings.Contains(r.ID, "shim") || len(r.RoundsStolen) == 0 {
			continue
		}
		kid := strings.Replace(r.ID, "shim", "kernel", 1)
		for _, k := range s.Redis {
			if k.ID == kid && len(k.RoundsStolen) > 0 {
				fmt.Fprintf(w, " %s %.3f / %.3f;", strings.Replace(r.ID, "-shim", "", 1), median(r.RoundsStolen), median(k.RoundsStolen))
			}
		}
	}
	fmt.Fprintln(w)
}
