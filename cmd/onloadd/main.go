// Command onloadd is the helper daemon of the onload stack: it owns the
// steering program, the AF_XDP sockets and the queues of the interfaces
// it serves, and hands stacks to processes that need no privilege of
// their own (package daemon). It also carries the data path's diagnostic
// tools.
//
//	onloadd [serve] [-socket /run/onload/onloadd.sock] [-mode 0660] [-group G] [-interface vB] [-log info] [-json] [-metrics ADDR] [-takeover 1ms]
//	onloadd stackdump [-socket ...] [-json] [-v]
//	onloadd stackdump [-socket ...] kill STACK
//	onloadd run [-p latency|balanced|throughput] [--] CMD ARGS...
//	onloadd capture -iface eth0 -udp 7000 -tcp 7001 [-queue 0] [-duration 10s]
//	onloadd config [-markdown]
//	onloadd version
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/xdp-onload/onload/daemon"
)

const usage = `usage: onloadd <command> [flags]

commands:
  serve     run the daemon in the foreground (the default command): stacks
            for processes over the control socket; SIGTERM or SIGINT stops
            it, handing every connection over to the kernel (they go on
            there), removing every filter and detaching the program
  stackdump print onloadd's stacks: their processes, filters and sockets
            (netstat's columns with cwnd, RTT and retransmissions); -v adds
            the engine's own dump, -json is for scripts; "stackdump kill
            STACK" ends an orphan stack (its processes are gone), resetting
            its connections; "stackdump handover STACK" hands the stack's
            connections over to the kernel, live
  run       run a program with the LD_PRELOAD shim: "onloadd run -- redis-server"
            accelerates its TCP sockets, unmodified
  capture   steer TCP/UDP ports on an interface into an AF_XDP socket and
            print every frame that arrives, then the steering counters
  config    print the configuration an accelerated process would use
            (ONLOAD_* variables), or with -markdown the table of them
  version   print the version

Run "onloadd <command> -h" for a command's flags.
`

func main() {
	args := os.Args[1:]
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && !isHelp(args[0]) {
		args = append([]string{"serve"}, args...)
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(args[1:], os.Stderr)
	case "stackdump":
		err = stackdump(args[1:], os.Stdout)
	case "run":
		err = run(args[1:])
	case "capture":
		err = capture(args[1:], os.Stdout)
	case "config":
		err = config(args[1:], os.Stdout)
	case "version":
		fmt.Println(version())
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "onloadd: unknown command %q\n\n%s", args[0], usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "onloadd:", err)
		var ee *exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

func isHelp(s string) bool { return s == "-h" || s == "-help" || s == "--help" }

func version() string { return "onloadd " + daemon.Version }
