package sockets

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
)

// Profile is a set of defaults tuned for one goal.
type Profile string

const (
	// Latency: goroutines spin long before they sleep, the fill ring is
	// kept shallow (hot in the caches). Costs a core per busy goroutine.
	Latency Profile = "latency"
	// Balanced, the default: a short spin, then sleep with interrupts.
	Balanced Profile = "balanced"
	// Throughput: deep rings and large socket buffers.
	Throughput Profile = "throughput"
)

// Config is the configuration of an accelerated stack. Every field has an
// environment variable (see the table in Options, and docs/config.md);
// ConfigFromEnv reads them, the process default stack uses them.
type Config struct {
	Profile        Profile
	Disable        bool          // accelerate nothing: every call goes to the standard library
	IOURing        string        // under the shim, "kernel" or "accelerate" (ONLOAD_IO_URING; the interposer reads it)
	ChildServed    int           // under the shim, connections in a row a listener's process hands to forked children, unused, before the listener's port goes to the kernel (0: never)
	BlockedThreads int           // under the shim, threads blocked at once, each on one connection of its own, at which the process's sockets go to the kernel (0: never)
	Interface      string        // "" picks the interface of the default route, or the only one
	Spin           time.Duration // how long a goroutine polls before it sleeps
	SpinThreads    int           // how many waiters spin at once
	Sockets        int           // socket table size
	UmemFrames     int           // frames in the UMEM
	RingSize       int           // entries in each AF_XDP ring
	FillDepth      int           // frames kept in the fill ring
	MinRTO         time.Duration
	DelayedAck     time.Duration
	TimeWait       time.Duration // how long a closed connection stays in TIME-WAIT
	SendBuffer     int           // default SO_SNDBUF
	RecvBuffer     int           // default SO_RCVBUF
	// SendBufferMax and RecvBufferMax bound the buffers' own growth.
	SendBufferMax, RecvBufferMax int
	Congestion                   string // "cubic" or "reno"
	Log                          slog.Level
	LogFile                      string // the log's file ("": standard error)
	// Daemon says whether stacks come from onloadd: DaemonAuto (when it
	// runs), DaemonRequire or DaemonOff (standalone only).
	Daemon       string
	DaemonSocket string        // onloadd's control socket
	StackName    string        // share the named stack with other processes
	Cluster      bool          // StackName names a cluster: a stack each, SO_REUSEPORT ports shared
	SharedPorts  int           // on a stack of onloadd's: local ports kept for the connections the process opens (0: none)
	Takeover     time.Duration // onloadd's: how long work may wait unpolled before it polls (0: never)
	TakeoverPrio int           // onloadd's: its watchers' SCHED_FIFO priority (0: normal scheduling)
}

// The values of Config.Daemon (ONLOAD_DAEMON).
const (
	DaemonAuto    = "auto"
	DaemonRequire = "require"
	DaemonOff     = "off"
)

// Option is one configuration variable: its environment name, default
// (per profile), bounds, unit and meaning.
type Option struct {
	Env      string
	Default  string             // in the balanced profile
	Profiles map[Profile]string // defaults that differ by profile
	Min, Max int64              // for numbers
	Choices  []string           // for enumerations
	Unit     string
	Doc      string
	set      func(c *Config, v int64, s string)
}

const envPrefix = "ONLOAD_"

// Options is the table of configuration variables: the one place they are
// defined. docs/config.md is generated from it.
var Options = []Option{
	{Env: "ONLOAD_PROFILE", Default: "balanced", Choices: []string{"latency", "balanced", "throughput"},
		Doc: "Defaults tuned for a goal. `latency` spins long before sleeping and keeps the rings shallow (a busy goroutine keeps a core); `throughput` uses deep rings and large buffers. Variables set explicitly override the profile.",
		set: func(c *Config, _ int64, s string) { c.Profile = Profile(s) }},
	{Env: "ONLOAD_DISABLE", Default: "0", Min: 0, Max: 1,
		Doc: "1: accelerate nothing; every call goes to the standard library.",
		set: func(c *Config, v int64, _ string) { c.Disable = v == 1 }},
	{Env: "ONLOAD_IO_URING", Default: "kernel", Choices: []string{"kernel", "accelerate"},
		Doc: "Under the shim, what a process that has an io_uring instance does. `kernel`: its sockets use the kernel, since what a ring does on a socket's fd (an accept, a send, a poll) passes the interposer by and would reach the accelerated socket's kernel half, which has no connection; a ring made after the stack loaded (through liburing's calls) hands the process's connections over to the kernel and gives its listeners' ports to their kernel sockets. `accelerate`: accelerate them anyway, for a program whose rings do file I/O only. A ring made after the stack loaded through the C library's syscall(2) is seen too; one made with the system call's own instruction (a liburing linked into the program) is not.",
		set: func(c *Config, _ int64, s string) { c.IOURing = s }},
	{Env: "ONLOAD_CHILD_SERVED", Default: "2", Min: 0, Max: 1_000_000, Unit: "connections",
		Doc: "Under the shim, a server of a process a connection (PostgreSQL's postmaster, sshd, inetd: it accepts, forks a child for the connection and closes its own copy without using it) has each connection handed over to the kernel for its child, about 2 ms more a connection. After this many connections of one listener in a row went so, the listener's port goes to the kernel, whose connections its children use as they are; a connection the process read or wrote itself starts the count again. 0: never.",
		set: func(c *Config, v int64, _ string) { c.ChildServed = int(v) }},
	{Env: "ONLOAD_BLOCKED_THREADS", Default: "8", Min: 0, Max: 1_000_000, Unit: "threads",
		Doc: "Under the shim, a server of a thread a connection (apache's workers, varnish, MariaDB, a client's pool of connections each used by a thread of its own: each thread blocked in a read, or a poll, of its one connection) serves less on the stack than on the kernel, as each block and wake-up costs a user-space stack more than it costs the kernel. Once this many of a process's threads are blocked at once, each waiting to read one accelerated connection alone, its listeners' ports go to their kernel sockets, its later sockets stay the kernel's, and each of its connections is handed over to the kernel by its own thread as that thread next waits on it alone (a connection an event loop uses stays on the stack); `ONLOAD_LOG=debug` says so. 0: never.",
		set: func(c *Config, v int64, _ string) { c.BlockedThreads = int(v) }},
	{Env: "ONLOAD_INTERFACE", Default: "",
		Doc: "The interface to accelerate. Empty: the interface of the default route, else the only interface that is up with an IPv4 address. Traffic through other interfaces goes to the kernel.",
		set: func(c *Config, _ int64, s string) { c.Interface = s }},
	{Env: "ONLOAD_SPIN_US", Default: "50", Profiles: map[Profile]string{Latency: "100000", Throughput: "20"},
		Min: 0, Max: 10_000_000, Unit: "µs",
		Doc: "How long a goroutine that finds its socket not ready polls the stack before it sleeps.",
		set: func(c *Config, v int64, _ string) { c.Spin = time.Duration(v) * time.Microsecond }},
	{Env: "ONLOAD_SPIN_THREADS", Default: "1", Min: 1, Max: 1024, Unit: "waiters",
		Doc: "How many of a process's waiters (goroutines, or the threads of a program under the shim) may spin on its stack at once. Each poll serves every socket; the others sleep until a poll wakes them. More suits a program whose threads each have a processor of their own, as every Onload thread spins: a thread that spins sees its own socket turn ready without being woken. Where the threads share the processors with other work, more spinners take the processors from it (memcached -t 2 on two CPUs shared with its client gained nothing with 2).",
		set: func(c *Config, v int64, _ string) { c.SpinThreads = int(v) }},
	{Env: "ONLOAD_SOCKETS", Default: "1024", Min: 1, Max: 1 << 20, Unit: "sockets",
		Doc: "Size of the stack's socket table, TIME-WAIT included (the oldest TIME-WAIT is recycled when it is full). When 7/8 of it hold live sockets, new connections to its listeners go to the kernel (not accelerated) until it is below 3/4.",
		set: func(c *Config, v int64, _ string) { c.Sockets = int(v) }},
	{Env: "ONLOAD_UMEM_FRAMES", Default: "16384", Profiles: map[Profile]string{Throughput: "65536"},
		Min: 256, Max: 1 << 20, Unit: "frames",
		Doc: "Frames of 2 KiB in the UMEM: every packet queued for sending, retransmission or reading holds one.",
		set: func(c *Config, v int64, _ string) { c.UmemFrames = int(v) }},
	{Env: "ONLOAD_RING_SIZE", Default: "2048", Profiles: map[Profile]string{Throughput: "4096"},
		Min: 64, Max: 16384, Unit: "entries",
		Doc: "Entries in each AF_XDP ring (fill, completion, RX, TX); a power of two.",
		set: func(c *Config, v int64, _ string) { c.RingSize = int(v) }},
	{Env: "ONLOAD_FILL_DEPTH", Default: "2048", Profiles: map[Profile]string{Latency: "128", Throughput: "4096"},
		Min: 16, Max: 16384, Unit: "frames",
		Doc: "Frames kept in the fill ring for the kernel to receive into (at most the ring size and half the frames). Shallow keeps the frames in use hot in the caches; deep absorbs longer bursts while nobody polls: at 1024, iperf3 -R -P 4 under the shim on veth lost 8% of its segments to an empty fill ring (the kernel sender retransmitted 32,449 in 3 s, at 1.3 Gbit/s), at 2048 0.1% (478, at 2.4 Gbit/s), with sockperf's p50 unchanged.",
		set: func(c *Config, v int64, _ string) { c.FillDepth = int(v) }},
	{Env: "ONLOAD_MIN_RTO_MS", Default: "200", Min: 1, Max: 10000, Unit: "ms",
		Doc: "Least TCP retransmission timeout.",
		set: func(c *Config, v int64, _ string) { c.MinRTO = time.Duration(v) * time.Millisecond }},
	{Env: "ONLOAD_DELACK_MS", Default: "40", Min: 1, Max: 500, Unit: "ms",
		Doc: "How long a TCP ACK may wait for data to ride on.",
		set: func(c *Config, v int64, _ string) { c.DelayedAck = time.Duration(v) * time.Millisecond }},
	{Env: "ONLOAD_TIME_WAIT_MS", Default: "60000", Min: 1, Max: 240_000, Unit: "ms",
		Doc: "How long a connection this end closed first stays in TIME-WAIT (2 MSL; Linux's is 60 s), holding its port so that a late segment of it is not taken for a new connection's. A process's stack lives on in onloadd after the process exits until its last connection leaves TIME-WAIT.",
		set: func(c *Config, v int64, _ string) { c.TimeWait = time.Duration(v) * time.Millisecond }},
	{Env: "ONLOAD_SEND_BUFFER", Default: "262144", Profiles: map[Profile]string{Throughput: "1048576"},
		Min: 2048, Max: 64 << 20, Unit: "bytes",
		Doc: "Default send buffer of a socket (SO_SNDBUF). It should cover the path's bandwidth-delay product; beyond that a larger one only spreads the frames in use over more cache.",
		set: func(c *Config, v int64, _ string) { c.SendBuffer = int(v) }},
	{Env: "ONLOAD_RECV_BUFFER", Default: "262144", Profiles: map[Profile]string{Throughput: "1048576"},
		Min: 2048, Max: 64 << 20, Unit: "bytes",
		Doc: "Default receive buffer of a socket (SO_RCVBUF).",
		set: func(c *Config, v int64, _ string) { c.RecvBuffer = int(v) }},
	{Env: "ONLOAD_SEND_BUFFER_MAX", Default: "4194304",
		Min: 2048, Max: 64 << 20, Unit: "bytes",
		Doc: "How far a socket's send buffer grows by itself: it follows twice the congestion window (as Linux's tcp_wmem maximum). A buffer set with SetWriteBuffer stays as set.",
		set: func(c *Config, v int64, _ string) { c.SendBufferMax = int(v) }},
	{Env: "ONLOAD_RECV_BUFFER_MAX", Default: "4194304",
		Min: 2048, Max: 64 << 20, Unit: "bytes",
		Doc: "How far a socket's receive buffer grows by itself: it doubles when the peer fills the window while the application keeps up (as Linux's tcp_rmem maximum). A buffer set with SetReadBuffer stays as set.",
		set: func(c *Config, v int64, _ string) { c.RecvBufferMax = int(v) }},
	{Env: "ONLOAD_CONGESTION", Default: "cubic", Choices: []string{"cubic", "reno"},
		Doc: "Congestion control of TCP connections: CUBIC (RFC 9438) or NewReno (RFC 6582). A program's TCP_CONGESTION chooses either per connection; a connection set to another before its connect (bbr) is the kernel's.",
		set: func(c *Config, _ int64, s string) { c.Congestion = s }},
	{Env: "ONLOAD_DAEMON", Default: "auto", Choices: []string{"auto", "require", "off"},
		Doc: "Where stacks come from. `auto`: from onloadd when its control socket answers (no privilege needed), else made by the process itself (standalone: root), else the kernel. `require`: from onloadd only; without it sockets use the kernel. `off`: standalone only. A program in the dynamic loader's secure mode (set-user-ID, or exec'd with its users apart) takes stacks from onloadd only, whatever this says.",
		set: func(c *Config, _ int64, s string) { c.Daemon = s }},
	{Env: "ONLOAD_DAEMON_SOCKET", Default: "/run/onload/onloadd.sock",
		Doc: "onloadd's control socket. A program in the dynamic loader's secure mode takes a stack only from an onloadd that runs as root (or as the program's effective user) there.",
		set: func(c *Config, _ int64, s string) { c.DaemonSocket = s }},
	{Env: "ONLOAD_STACK_NAME", Default: "",
		Doc: "Through onloadd: processes that give the same name share one stack (one image, one queue), as Onload's EF_NAME. Empty: the process has a stack of its own. `onloadd run` without -n gives the processes of its command a name of their own (run-PID-NONCE), so that they share one stack, as Onload's forked children share their parent's.",
		set: func(c *Config, _ int64, s string) { c.StackName = s }},
	{Env: "ONLOAD_CLUSTER", Default: "0", Min: 0, Max: 1,
		Doc: "1: ONLOAD_STACK_NAME names a cluster, as Onload's EF_CLUSTER_NAME: each process gets a stack of its own, on a queue of its own while the interface has one free (then it shares the stack with the fewest processes), and the stacks share the ports their listeners bind with SO_REUSEPORT, and the listening sockets their processes inherited, each taking the connections that arrive on its queue. For pre-fork servers (nginx, with `listen ... reuseport` or without); a port bound without SO_REUSEPORT by the process that listens on it is one stack's, as without a cluster.",
		set: func(c *Config, v int64, _ string) { c.Cluster = v == 1 }},
	{Env: "ONLOAD_SHARED_PORTS", Default: "16", Min: 0, Max: 1024, Unit: "ports",
		Doc: "On a stack from onloadd: how many local ports a process keeps steered to its stack for the TCP connections it opens, as Onload's EF_TCP_SHARED_LOCAL_PORTS. Each port carries connections to many peers (one to each peer address and port), so a connection costs no request to onloadd; a port is added when every one kept has a connection to the peer being dialled, and a connection beyond them gets a port of its own, steered and released through onloadd (about a millisecond). At most a sixteenth of ONLOAD_SOCKETS (each port's holder takes a socket). 0: every connection a port of its own.",
		set: func(c *Config, v int64, _ string) { c.SharedPorts = int(v) }},
	{Env: "ONLOAD_TAKEOVER_US", Default: "1000", Min: 0, Max: 10_000_000, Unit: "µs",
		Doc: "onloadd's (`onloadd serve`): how long a stack with frames waiting or timers due may go unpolled by its processes (stopped, or busy elsewhere) before onloadd polls it for them: it acknowledges, retransmits, runs the timers and wakes the waiters. While a process keeps polling onloadd looks less often, so a process that stalls after polling without pause is seen up to four times this later (at most 4 ms, unless this is longer). 0: never; below 100 µs counts as 100 µs.",
		set: func(c *Config, v int64, _ string) { c.Takeover = time.Duration(v) * time.Microsecond }},
	{Env: "ONLOAD_TAKEOVER_PRIORITY", Default: "1", Min: 0, Max: 99,
		Doc: "onloadd's (`onloadd serve`): the real-time priority (SCHED_FIFO) of the threads that watch stacks and poll them for their processes, so that a takeover runs when it is due, ahead of the applications on the same processors, as the kernel's interrupt handling does for its own TCP. A watcher sleeps between polls and each poll's work is bounded. 0: normal scheduling. Needs CAP_SYS_NICE; without it onloadd says so once and runs them at normal priority.",
		set: func(c *Config, v int64, _ string) { c.TakeoverPrio = int(v) }},
	{Env: "ONLOAD_LOG", Default: "error", Choices: []string{"debug", "info", "warn", "error"},
		Doc: "Log level, to standard error (or ONLOAD_LOG_FILE). `debug` says which sockets are not accelerated and why; `info` reports stacks created and closed.",
		set: func(c *Config, _ int64, s string) { c.Log = logLevel(s) }},
	{Env: "ONLOAD_LOG_FILE", Default: "",
		Doc: "The log's file, in place of standard error: appended to, opened for each message, so that a daemon that closes or redirects its standard error (squid, a program that calls daemon(3)) still says what was not accelerated and why; the processes of a program share it, each line naming its process. Empty: standard error. Ignored in the dynamic loader's secure mode (a set-user-ID program, or one exec'd with its users apart): standard error.",
		set: func(c *Config, _ int64, s string) { c.LogFile = s }},
}

func logLevel(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn":
		return slog.LevelWarn
	}
	return slog.LevelError
}

// DefaultConfig is the configuration of a profile with no variable set.
func DefaultConfig(p Profile) (Config, error) {
	return configFrom(func(string) string { return "" }, p)
}

// ConfigFromEnv reads the ONLOAD_* environment variables. A value that is
// not valid is an error naming the variable and what it accepts. In the
// dynamic loader's secure mode ONLOAD_LOG_FILE is ignored and
// ONLOAD_DAEMON is require (secureMode).
func ConfigFromEnv() (Config, error) { return configFrom(envGetenv(), "") }

func configFrom(getenv func(string) string, p Profile) (Config, error) {
	if p == "" {
		p = Balanced
		if v := strings.TrimSpace(getenv("ONLOAD_PROFILE")); v != "" {
			p = Profile(v)
		}
	}
	var c Config
	for _, o := range Options {
		def := o.Default
		if d, ok := o.Profiles[p]; ok {
			def = d
		}
		v := strings.TrimSpace(getenv(o.Env))
		if v == "" {
			v = def
		}
		if o.Env == "ONLOAD_PROFILE" {
			v = string(p)
		}
		if err := o.apply(&c, v); err != nil {
			return Config{}, err
		}
	}
	return c, nil
}

func (o *Option) apply(c *Config, v string) error {
	switch {
	case o.Choices != nil:
		for _, ch := range o.Choices {
			if v == ch {
				o.set(c, 0, v)
				return nil
			}
		}
		return fmt.Errorf("%s=%q: must be one of %s", o.Env, v, strings.Join(o.Choices, ", "))
	case o.Min == 0 && o.Max == 0:
		o.set(c, 0, v)
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < o.Min || n > o.Max {
		unit := ""
		if o.Unit != "" {
			unit = " " + o.Unit
		}
		return fmt.Errorf("%s=%q: must be a whole number from %d to %d%s", o.Env, v, o.Min, o.Max, unit)
	}
	if o.Env == "ONLOAD_RING_SIZE" && n&(n-1) != 0 {
		return fmt.Errorf("%s=%q: must be a power of two from %d to %d", o.Env, v, o.Min, o.Max)
	}
	o.set(c, n, v)
	return nil
}

// check validates a Config made by hand: the same bounds as the table.
func (c *Config) check() error {
	if c.Profile == "" {
		c.Profile = Balanced
	}
	def, err := DefaultConfig(c.Profile)
	if err != nil {
		return err
	}
	fill := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	fill(&c.SpinThreads, def.SpinThreads)
	fill(&c.Sockets, def.Sockets)
	fill(&c.UmemFrames, def.UmemFrames)
	fill(&c.RingSize, def.RingSize)
	fill(&c.FillDepth, def.FillDepth)
	fill(&c.SendBuffer, def.SendBuffer)
	fill(&c.RecvBuffer, def.RecvBuffer)
	fill(&c.SendBufferMax, max(def.SendBufferMax, c.SendBuffer))
	fill(&c.RecvBufferMax, max(def.RecvBufferMax, c.RecvBuffer))
	if c.Congestion == "" {
		c.Congestion = def.Congestion
	}
	if c.Congestion != "cubic" && c.Congestion != "reno" {
		return fmt.Errorf("sockets config: Congestion %q: must be cubic or reno", c.Congestion)
	}
	if c.SendBufferMax < c.SendBuffer || c.RecvBufferMax < c.RecvBuffer {
		return fmt.Errorf("sockets config: the buffer maxima (%d, %d) must not be below the buffers (%d, %d)", c.SendBufferMax, c.RecvBufferMax, c.SendBuffer, c.RecvBuffer)
	}
	if c.MinRTO == 0 {
		c.MinRTO = def.MinRTO
	}
	if c.DelayedAck == 0 {
		c.DelayedAck = def.DelayedAck
	}
	if c.TimeWait == 0 {
		c.TimeWait = def.TimeWait
	}
	for _, f := range []struct {
		env string
		v   int64
	}{
		{"ONLOAD_SPIN_US", int64(c.Spin / time.Microsecond)},
		{"ONLOAD_SPIN_THREADS", int64(c.SpinThreads)},
		{"ONLOAD_SOCKETS", int64(c.Sockets)},
		{"ONLOAD_UMEM_FRAMES", int64(c.UmemFrames)},
		{"ONLOAD_RING_SIZE", int64(c.RingSize)},
		{"ONLOAD_FILL_DEPTH", int64(c.FillDepth)},
		{"ONLOAD_MIN_RTO_MS", int64(c.MinRTO / time.Millisecond)},
		{"ONLOAD_DELACK_MS", int64(c.DelayedAck / time.Millisecond)},
		{"ONLOAD_TIME_WAIT_MS", int64(c.TimeWait / time.Millisecond)},
		{"ONLOAD_SEND_BUFFER", int64(c.SendBuffer)},
		{"ONLOAD_RECV_BUFFER", int64(c.RecvBuffer)},
		{"ONLOAD_SEND_BUFFER_MAX", int64(c.SendBufferMax)},
		{"ONLOAD_RECV_BUFFER_MAX", int64(c.RecvBufferMax)},
		{"ONLOAD_SHARED_PORTS", int64(c.SharedPorts)},
	} {
		for i := range Options {
			if o := &Options[i]; o.Env == f.env {
				var scratch Config
				if err := o.apply(&scratch, strconv.FormatInt(f.v, 10)); err != nil {
					return fmt.Errorf("sockets config: %w", err)
				}
			}
		}
	}
	return nil
}

// Markdown renders the table as docs/config.md.
func Markdown() string {
	var b strings.Builder
	b.WriteString("# Configuration\n\n")
	b.WriteString("<!-- Generated from the Options table in sockets/config.go by `make docs`. DO NOT EDIT. -->\n\n")
	b.WriteString("An accelerated process reads these environment variables when it creates its stack " +
		"(the first accelerated socket). A value out of range is refused with an error naming the variable " +
		"and the range; the socket calls then fall back to the kernel and say why in the log.\n\n")
	b.WriteString("| variable | default | latency | throughput | allowed | meaning |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- |\n")
	for _, o := range Options {
		prof := func(p Profile) string {
			if v, ok := o.Profiles[p]; ok {
				return "`" + v + "`"
			}
			return "same"
		}
		def := "`" + o.Default + "`"
		if o.Default == "" {
			def = "(auto)"
		}
		allowed := "any"
		switch {
		case o.Choices != nil:
			allowed = strings.Join(o.Choices, ", ")
		case o.Min != 0 || o.Max != 0:
			allowed = fmt.Sprintf("%d to %d", o.Min, o.Max)
			if o.Unit != "" {
				allowed += " " + o.Unit
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", o.Env, def, prof(Latency), prof(Throughput), allowed, o.Doc)
	}
	return b.String()
}
