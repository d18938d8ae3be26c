// Command onloadd is the helper daemon of the onload stack. Today it
// carries the diagnostic tools of the data path; the daemon proper (stack
// creation for unprivileged processes, takeover of stalled stacks, the
// LD_PRELOAD launcher) arrives with the later parts of the stack.
//
//	onloadd capture -iface eth0 -udp 7000 -tcp 7001 [-queue 0] [-duration 10s]
//	onloadd config [-markdown]
//	onloadd version
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
)

const usage = `usage: onloadd <command> [flags]

commands:
  capture   steer TCP/UDP ports on an interface into an AF_XDP socket and
            print every frame that arrives, then the steering counters
  config    print the configuration an accelerated process would use
            (ONLOAD_* variables), or with -markdown the table of them
  version   print the version

Run "onloadd <command> -h" for a command's flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "capture":
		err = capture(os.Args[2:], os.Stdout)
	case "config":
		err = config(os.Args[2:], os.Stdout)
	case "version":
		fmt.Println(version())
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "onloadd: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "onloadd:", err)
		os.Exit(1)
	}
}

func version() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " " + s.Value[:12]
			}
		}
	}
	return "onloadd " + v
}
