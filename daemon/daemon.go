// Package daemon is onloadd's work: it owns the data path's privileged
// half on the host (the steering program and its maps on every interface
// it serves, the AF_XDP sockets and UMEMs, the queues) and hands stacks to
// processes that need no privilege of their own. A process asks over the
// control socket (package control); onloadd makes the stack's memory and
// socket and passes their descriptors; the process runs TCP in its own
// context. The data path never goes through the daemon.
//
// Every request is checked against what its client may do: the client is
// known by SO_PEERCRED, a port is steered only to a process that proves it
// owns the port with a kernel socket bound to it, and a stack is joined
// only by processes of the user that made it.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
)

// Config is how onloadd serves.
type Config struct {
	// Socket is the control socket's path (control.DefaultSocket).
	Socket string
	// Mode and Group govern who may connect, and so who may have a stack:
	// a stack's AF_XDP socket can send any frame on its interface, a
	// privilege like raw sending (the docs say so). Mode defaults to
	// 0660; Group (a name or number) is the socket's group, "" root's.
	Mode  os.FileMode
	Group string
	// Interfaces, if set, are the only ones served; otherwise any
	// interface a client asks for is.
	Interfaces []string
	// Log receives the daemon's structured log.
	Log *slog.Logger
	// Takeover is how long a stack with frames waiting or timers due may
	// go unpolled by its processes before onloadd polls it (0:
	// DefaultTakeover; negative: never).
	Takeover time.Duration
	// TakeoverPriority is the SCHED_FIFO priority of the threads that
	// watch stacks and poll them (0: DefaultTakeoverPriority; negative:
	// normal scheduling).
	TakeoverPriority int
}

// Daemon is a running onloadd.
type Daemon struct {
	cfg  Config
	log  *slog.Logger
	ln   *net.UnixListener
	lock *os.File // the instance lock, held while the daemon runs

	mu       sync.Mutex
	ifaces   map[string]*iface
	stacks   map[bpf.StackID]*dstack
	named    map[string]*dstack  // shared stacks by name
	clusters map[string]*cluster // clusters by name (clusters.go)
	clients  map[*client]struct{}
	nextID   bpf.StackID
	closed   bool
	wg       sync.WaitGroup

	prioWarned sync.Once    // the watchers' priority could not be set
	watchers   atomic.Int32 // watchers running (watch.go)

	reapKick chan struct{} // wakes the reaper (kickReaper)
}

// ErrRunning is returned by New when another onloadd holds the socket.
var ErrRunning = errors.New("onloadd is already running")

// New takes the instance lock and opens the control socket. Serve then
// answers clients; Close undoes everything.
func New(cfg Config) (*Daemon, error) {
	if cfg.Socket == "" {
		cfg.Socket = control.DefaultSocket
	}
	if cfg.Mode == 0 {
		cfg.Mode = 0o660
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if cfg.Takeover == 0 {
		cfg.Takeover = DefaultTakeover
	}
	if cfg.TakeoverPriority == 0 {
		cfg.TakeoverPriority = DefaultTakeoverPriority
	}
	gid := -1
	if cfg.Group != "" {
		var err error
		if gid, err = lookupGroup(cfg.Group); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(cfg.Socket), 0o755); err != nil {
		return nil, fmt.Errorf("control socket directory: %w", err)
	}
	d := &Daemon{
		cfg: cfg, log: cfg.Log,
		ifaces: map[string]*iface{}, stacks: map[bpf.StackID]*dstack{}, named: map[string]*dstack{}, clusters: map[string]*cluster{},
		clients: map[*client]struct{}{}, nextID: 1, reapKick: make(chan struct{}, 1),
	}
	lockPath := cfg.Socket + ".lock"
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("instance lock %s: %w", lockPath, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(lockPath)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (pid %s, socket %s): stop it first, or give this one another -socket", ErrRunning, trimPID(pid), cfg.Socket)
		}
		return nil, fmt.Errorf("instance lock %s: %w", lockPath, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	d.lock = f
	// The lock is ours: a socket file left by a daemon that died is stale.
	os.Remove(cfg.Socket)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: cfg.Socket, Net: "unixpacket"})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("control socket %s: %w", cfg.Socket, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(cfg.Socket, cfg.Mode); err == nil && gid >= 0 {
		err = os.Chown(cfg.Socket, 0, gid)
	}
	if err != nil {
		ln.Close()
		f.Close()
		return nil, fmt.Errorf("control socket %s: %w", cfg.Socket, err)
	}
	d.ln = ln
	d.log.Info("serving", "socket", cfg.Socket, "mode", fmt.Sprintf("%#o", cfg.Mode), "group", cfg.Group, "pid", os.Getpid())
	return d, nil
}

func trimPID(b []byte) string {
	s := string(b)
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	if s == "" {
		return "unknown"
	}
	return s
}

func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil {
		return n, nil
	}
	grp, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("control socket group %q: %w", g, err)
	}
	return strconv.Atoi(grp.Gid)
}

// Serve answers clients until ctx is done or Close is called.
func (d *Daemon) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { d.ln.Close() })
	defer stop()
	reaped := make(chan struct{})
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		d.reap(reaped)
	}()
	defer close(reaped)
	for {
		uc, err := d.ln.AcceptUnix()
		if err != nil {
			d.mu.Lock()
			closed := d.closed
			d.mu.Unlock()
			if closed || ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			d.log.Warn("accept", "err", err)
			continue
		}
		c, err := d.newClient(uc)
		if err != nil {
			d.log.Warn("client refused", "err", err)
			uc.Close()
			continue
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			c.serve()
		}()
	}
}

// Close stops serving: every connection is handed over to the kernel
// (handOverAll), every client disconnected, every stack released, every
// filter removed and every interface's program detached.
func (d *Daemon) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	// The connections go to the kernel while the steering program still
	// brings their frames to the stacks.
	d.handOverAll()
	d.mu.Lock()
	clients := make([]*client, 0, len(d.clients))
	for c := range d.clients {
		clients = append(clients, c)
	}
	d.mu.Unlock()
	d.ln.Close()
	for _, c := range clients {
		c.conn.Close()
	}
	d.wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.stacks {
		d.releaseStackLocked(s)
	}
	var errs []error
	for name, ifc := range d.ifaces {
		errs = append(errs, ifc.close())
		delete(d.ifaces, name)
	}
	d.lock.Close()
	d.log.Info("stopped")
	return errors.Join(errs...)
}
