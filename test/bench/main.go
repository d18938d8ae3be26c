// Command bench measures the project's data path on test hosts and writes
// the figures as JSON (test/bench/results/bench.json) with the tables the
// README quotes on stdout. `make bench` runs it as root (about 20
// minutes); `bench -h` lists its flags, and a flag's count at 0 skips its
// section:
//
//	bench [-rounds 20] [-count 10000] [-sockperf-seconds 1]
//	      [-api-rounds 5] [-api-count 20000] [-bulk-seconds 2]
//	      [-http-rounds 5] [-http-seconds 4] [-http-conns 1,32,256]
//	      [-goodput-rounds 3] [-goodput-seconds 10] [-shim-rounds 5]
//	      [-out test/bench/results/bench.json]
//
// Every section interleaves its contenders in rounds, so that the
// machine's drift hits all alike, and reports each contender by the median
// over rounds of each round's own percentile (or throughput), and each
// ratio as the median of the per-round ratios (stats.go).
//
// The floor: two processes in two network namespaces joined by veth bounce
// a 64-byte frame through AF_XDP sockets, busy-polling, with this
// project's rings and with github.com/asavie/xdp's; beside them the Linux
// kernel's TCP ping-pong (sockperf, --nonblocked, 64 bytes) on the same
// veth pair in the same run. TCP: 64-byte ping-pong with this project's
// stack on both ends, each a process busy-polling its AF_XDP socket.
//
// The public API (api.go): a Go client on sockets, net or gVisor's gonet
// against one kernel server. The server (http.go): one net/http server on
// net and on sockets, loaded by the kernel's wrk. Goodput (goodput.go):
// one connection through the fault injector, ours beside the kernel's.
// The shim (shim.go): sockperf and redis-server, unmodified, under
// `onloadd run` beside the same programs on the kernel.
//
// bench also runs its own helper processes: `bench echo`, `bench ping`,
// `bench stack-echo`, `bench stack-ping`, `bench api-server`,
// `bench api-client`, `bench onloadd` (the daemon, for the API section's
// stack from onloadd) and `bench http-server` (which writes its stack's
// dump to the file ONLOAD_BENCH_DUMP names, and a CPU profile or an
// execution trace to ONLOAD_BENCH_CPUPROFILE or ONLOAD_BENCH_TRACE).
package main

import (
	"fmt"
	"os"
)

func main() {
	var err error
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "echo":
			err = echoMain(os.Args[2:])
		case "ping":
			err = pingMain(os.Args[2:])
		case "stack-echo":
			err = stackEchoMain(os.Args[2:])
		case "stack-ping":
			err = stackPingMain(os.Args[2:])
		case "api-server":
			err = apiServerMain(os.Args[2:])
		case "api-client":
			err = apiClientMain(os.Args[2:])
		case "http-server":
			err = httpServerMain(os.Args[2:])
		case "respond":
			err = respondMain(os.Args[2:])
		case "onloadd":
			err = onloaddMain(os.Args[2:])
		default:
			err = floorMain(os.Args[1:])
		}
	} else {
		err = floorMain(nil)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
