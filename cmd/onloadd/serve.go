package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/daemon"
	"github.com/xdp-onload/onload/sockets"
)

// serve runs the daemon in the foreground until SIGTERM or SIGINT.
func serve(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	sock := fs.String("socket", envOr("ONLOAD_DAEMON_SOCKET", control.DefaultSocket), "the control socket")
	mode := fs.String("mode", "0660", "the control socket's permissions: who may connect, and so have a stack")
	group := fs.String("group", "", "the control socket's group (a name or number; default root's)")
	ifaces := fs.String("interface", os.Getenv("ONLOAD_INTERFACE"), "serve only these interfaces (comma-separated; default: any a client asks for)")
	level := fs.String("log", envOr("ONLOAD_LOG", "info"), "log level: debug, info, warn or error")
	jsonLog := fs.Bool("json", false, "log in JSON")
	metricsAddr := fs.String("metrics", "", "serve the stacks' counters in Prometheus's text format at http://ADDR/metrics (for example 127.0.0.1:9464)")
	env, err := sockets.ConfigFromEnv()
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	takeover := fs.Duration("takeover", env.Takeover, "how long a stack with work waiting may go unpolled by its processes before onloadd polls it for them (0: never; default ONLOAD_TAKEOVER_US)")
	prio := fs.Int("takeover-priority", env.TakeoverPrio, "the SCHED_FIFO priority (1-99) of the threads that poll stacks for their processes (0: normal scheduling; default ONLOAD_TAKEOVER_PRIORITY)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *takeover < 0 {
		return fmt.Errorf("serve: -takeover %v: a duration of 0 or more", *takeover)
	}
	if *prio < 0 || *prio > 99 {
		return fmt.Errorf("serve: -takeover-priority %d: a real-time priority from 1 to 99, or 0 for normal scheduling", *prio)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected arguments %q", fs.Args())
	}
	m, err := strconv.ParseUint(*mode, 8, 32)
	if err != nil || m > 0o777 {
		return fmt.Errorf("serve: -mode %q: an octal permission such as 0660", *mode)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("serve: -log %q: debug, info, warn or error", *level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler = slog.NewTextHandler(stderr, opts)
	if *jsonLog {
		h = slog.NewJSONHandler(stderr, opts)
	}
	cfg := daemon.Config{Socket: *sock, Mode: os.FileMode(m), Group: *group, Log: slog.New(h), Takeover: *takeover}
	if *takeover == 0 {
		cfg.Takeover = -1 // never
	}
	if cfg.TakeoverPriority = *prio; *prio == 0 {
		cfg.TakeoverPriority = -1 // normal scheduling
	}
	for _, s := range strings.Split(*ifaces, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Interfaces = append(cfg.Interfaces, s)
		}
	}
	d, err := daemon.New(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *metricsAddr != "" {
		srv, err := serveMetrics(*metricsAddr, d)
		if err != nil {
			d.Close()
			return err
		}
		defer srv.Close()
		cfg.Log.Info("metrics", "url", "http://"+srv.Addr+"/metrics")
	}
	err = d.Serve(ctx)
	return errorsJoin(err, d.Close())
}

// serveMetrics serves d's metrics (and Go's own) at http://addr/metrics.
func serveMetrics(addr string, d *daemon.Daemon) (*http.Server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(d.Metrics(), collectors.NewGoCollector())
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("serve: -metrics %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Addr: ln.Addr().String(), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, nil
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func envOr(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

// stackdump prints onloadd's stacks: their queues, processes, filters and
// the engine's dump of each.
func stackdump(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("stackdump", flag.ContinueOnError)
	sock := fs.String("socket", envOr("ONLOAD_DAEMON_SOCKET", control.DefaultSocket), "onloadd's control socket")
	asJSON := fs.Bool("json", false, "print JSON, for scripts (the engine dumps too with -v)")
	verbose := fs.Bool("v", false, "also print the engine's own dump: counters, neighbours and every socket's TCP state")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var kill uint64
	switch {
	case fs.NArg() == 0:
	case fs.NArg() == 2 && (fs.Arg(0) == "kill" || fs.Arg(0) == "handover"):
		n, err := strconv.ParseUint(fs.Arg(1), 10, 32)
		if err != nil {
			return fmt.Errorf("stackdump %s %q: a stack number, as stackdump lists them", fs.Arg(0), fs.Arg(1))
		}
		kill = n
	default:
		return fmt.Errorf("stackdump: unexpected arguments %q (stackdump [-json] [-v], stackdump kill STACK, or stackdump handover STACK)", fs.Args())
	}
	cl, err := control.Dial(*sock, "stackdump")
	if err != nil {
		return fmt.Errorf("stackdump: onloadd at %s: %w", *sock, err)
	}
	defer cl.Close()
	if fs.NArg() > 0 && fs.Arg(0) == "handover" {
		rep, fds, err := cl.Call(control.Request{Op: control.OpDrain, Drain: &control.DrainRequest{Stack: uint32(kill)}})
		control.CloseFDs(fds)
		if err != nil {
			return fmt.Errorf("stackdump handover %d: %w", kill, err)
		}
		if rep.Drain == nil {
			return fmt.Errorf("stackdump handover %d: onloadd's reply says nothing of the handover", kill)
		}
		fmt.Fprintf(out, "stack %d: %d of its %d established connections handed over to the kernel\n", kill, rep.Drain.Moved, rep.Drain.Of)
		return nil
	}
	if fs.NArg() > 0 {
		rep, fds, err := cl.Call(control.Request{Op: control.OpKill, Kill: &control.KillRequest{Stack: uint32(kill)}})
		control.CloseFDs(fds)
		if err != nil {
			return fmt.Errorf("stackdump kill %d: %w", kill, err)
		}
		if rep.Kill == nil {
			return fmt.Errorf("stackdump kill %d: onloadd's reply says nothing of the kill", kill)
		}
		fmt.Fprintf(out, "stack %d ended: %d sockets reset\n", kill, rep.Kill.Reset)
		return nil
	}
	rep, fds, err := cl.Call(control.Request{Op: control.OpDump, Dump: &control.DumpRequest{Engine: *verbose}})
	control.CloseFDs(fds)
	if err != nil {
		return fmt.Errorf("stackdump: %w", err)
	}
	if *asJSON {
		e := json.NewEncoder(out)
		e.SetIndent("", "  ")
		return e.Encode(rep.Dump)
	}
	d := rep.Dump
	fmt.Fprintf(out, "onloadd %s, pid %d: %d stacks\n", d.Daemon, d.PID, len(d.Stacks))
	for _, i := range d.Interfaces {
		fmt.Fprintf(out, "interface %s: %d queues, steered by %s; %d port and %d connection entries in its maps%s\n",
			i.Name, i.Queues, i.Steering, i.Listeners, i.Flows, map[bool]string{true: " (" + i.Error + ")", false: ""}[i.Error != ""])
		for _, c := range i.Clusters {
			fmt.Fprintf(out, "  cluster %s\n", c)
		}
	}
	for _, s := range d.Stacks {
		name := ""
		if s.Name != "" {
			name = " " + strconv.Quote(s.Name)
		}
		if s.Cluster {
			name = ", a member of cluster" + name + ","
		}
		fmt.Fprintf(out, "\nstack %d%s on %s queue %d, %s\n", s.ID, name, s.Interface, s.Queue, s.Addr)
		for _, c := range s.Clients {
			fmt.Fprintf(out, "  process %d (%s) uid %d\n", c.PID, c.Program, c.UID)
		}
		if s.Quarantined != "" {
			fmt.Fprintf(out, "  quarantined: %s; no frame reaches it\n", s.Quarantined)
		}
		if s.LockBreaks > 0 {
			fmt.Fprintf(out, "  onloadd broke its lock %d times: a process died holding it\n", s.LockBreaks)
		}
		if s.Orphan {
			fmt.Fprintf(out, "  orphan: its processes are gone; onloadd finishes its %d sockets (closing, or in TIME-WAIT)\n", s.InUse)
		}
		switch {
		case s.Watch != "":
			fmt.Fprintf(out, "  takeover %s; onloadd polled it %d times\n", s.Watch, s.Takeovers)
		case s.StalledMs > 0:
			fmt.Fprintf(out, "  its processes have not polled it for %d ms: onloadd polls it (%d times so far)\n", s.StalledMs, s.Takeovers)
		default:
			fmt.Fprintf(out, "  onloadd polled it %d times when its processes did not\n", s.Takeovers)
		}
		if s.Handovers > 0 {
			fmt.Fprintf(out, "  %d connections handed over to the kernel\n", s.Handovers)
		}
		for _, f := range s.Filters {
			fmt.Fprintf(out, "  filter %s\n", f)
		}
		if s.FiltersCut > 0 {
			fmt.Fprintf(out, "  (%d more filters: a dump is at most %d KiB)\n", s.FiltersCut, control.MaxMessage>>10)
		}
		if len(s.Sockets) > 0 {
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  proto\tstate\tlocal\tremote\tsend-q\trecv-q\tcwnd\trtt µs\tretrans B\tpid")
			for _, k := range s.Sockets {
				pid := "-"
				if k.OwnerPID != 0 {
					pid = strconv.Itoa(k.OwnerPID)
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n",
					k.Proto, k.State, k.Local, k.Remote, k.SendQ, k.RecvQ, k.Cwnd, k.RTTus, k.RetransB, pid)
			}
			tw.Flush()
		}
		if s.SocketsCut > 0 {
			fmt.Fprintf(out, "  (%d more sockets: a dump is at most %d KiB)\n", s.SocketsCut, control.MaxMessage>>10)
		}
		if *verbose {
			for _, l := range strings.Split(strings.TrimRight(s.Engine, "\n"), "\n") {
				fmt.Fprintf(out, "  %s\n", l)
			}
			if s.EngineCut > 0 {
				fmt.Fprintf(out, "  (%d more bytes of the engine's dump: a dump is at most %d KiB)\n", s.EngineCut, control.MaxMessage>>10)
			}
		}
	}
	return nil
}
