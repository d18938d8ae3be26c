// Command bench measures the project's data path on test hosts and writes
// the figures as JSON (test/bench/results/bench.json) with a table on
// stdout. `make bench` runs it as root.
//
//	bench [-rounds 3] [-count 100000] [-out test/bench/results/bench.json]
//
// The floor: two processes in two network namespaces joined by veth bounce
// a 64-byte frame through AF_XDP sockets, busy-polling, with this
// project's rings and with github.com/asavie/xdp's; beside them the Linux
// kernel's TCP ping-pong (sockperf, --nonblocked, 64 bytes) on the same
// veth pair in the same run.
//
// TCP: 64-byte ping-pong with this project's stack on both ends, each a
// process busy-polling its AF_XDP socket, beside the floor and the kernel.
//
// bench also runs its own helper processes: `bench echo`, `bench ping`,
// `bench stack-echo` and `bench stack-ping`.
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
