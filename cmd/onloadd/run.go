package main

import (
	"bytes"
	"crypto/rand"
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/sockets"
)

// The shim's two libraries, which make build puts beside onloadd: the C
// interposer the program preloads, and the Go core it loads on first use.
const (
	shimLib = "libonload.so"
	coreLib = "libonload-core.so"
)

// run execs a program with the shim preloaded: its TCP sockets go
// through the stack, everything else through the kernel as before.
func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	profile := fs.String("p", "", "profile: latency, balanced or throughput (ONLOAD_PROFILE)")
	name := fs.String("n", "", "the stack's name, to share it with processes of other commands (ONLOAD_STACK_NAME; only onloadd shares stacks, so ONLOAD_DAEMON=require unless set). Without it the processes of CMD share a stack of their own (a pre-fork server's workers), named run-PID-NONCE")
	cluster := fs.Bool("cluster", false, "with -n: the name is a cluster's, a stack for each process of CMD on a queue of its own, its SO_REUSEPORT ports and inherited listening sockets shared (ONLOAD_CLUSTER=1; for pre-fork servers: nginx)")
	lib := fs.String("lib", "", "the directory of "+shimLib+" and "+coreLib+" (default: onloadd's own)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: onloadd run [-p latency|balanced|throughput] [-n NAME [-cluster]] [-lib DIR] [--] CMD ARGS...\n\n"+
			"Runs CMD with the LD_PRELOAD shim: its TCP/IPv4 sockets on the stack's interface\n"+
			"are accelerated; the rest stay the kernel's (ONLOAD_LOG=debug says what and why).\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	cmd := fs.Args()
	if len(cmd) == 0 {
		fs.Usage()
		return errors.New("run: no command to run")
	}
	env := os.Environ()
	if *profile != "" {
		if _, err := sockets.DefaultConfig(sockets.Profile(*profile)); err != nil {
			return fmt.Errorf("run: -p %s: %w", *profile, err)
		}
		env = setEnv(env, "ONLOAD_PROFILE", *profile)
	}
	if *cluster {
		if *name == "" {
			return errors.New("run: -cluster needs -n NAME, the cluster's name")
		}
		env = setEnv(env, "ONLOAD_CLUSTER", "1")
	}
	if *name == "" && os.Getenv("ONLOAD_STACK_NAME") == "" {
		// The processes of CMD share one stack, as Onload's forked
		// children share their parent's: a pre-fork server's workers
		// each asked for a stack of their own, the first took the queue
		// and with it every connection, and the others stayed on the
		// kernel with none (apache's event MPM then closed kept-alive
		// connections: thousands of wrk's read errors, a third of the
		// kernel's requests a second). Without onloadd the name is
		// nothing: each process makes its own stack, as before.
		var nonce [4]byte
		rand.Read(nonce[:])
		env = setEnv(env, "ONLOAD_STACK_NAME", control.RunStackName(os.Getpid(), binary.LittleEndian.Uint32(nonce[:])))
	}
	if *name != "" {
		env = setEnv(env, "ONLOAD_STACK_NAME", *name)
		// A standalone stack is one process's: without onloadd the
		// second worker would find the queue taken. Each process then
		// says why it stays on the kernel.
		if os.Getenv("ONLOAD_DAEMON") == "" {
			env = setEnv(env, "ONLOAD_DAEMON", "require")
		}
	}
	if _, err := sockets.ConfigFromEnv(); err != nil && *profile == "" {
		return fmt.Errorf("run: %w", err)
	}
	dir := *lib
	if dir == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("run: finding the shim: %w", err)
		}
		dir = filepath.Dir(self)
		if _, err := os.Stat(filepath.Join(dir, shimLib)); err != nil {
			// An onloadd installed apart from the build: the shim
			// make install-shim put in a system directory.
			if d := installedShim("", ""); d != "" {
				dir = d
			}
		}
	}
	shim, core := filepath.Join(dir, shimLib), filepath.Join(dir, coreLib)
	for _, f := range []string{shim, core} {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("run: %s is missing (make build puts it beside onloadd, make install-shim in a system directory; or pass -lib DIR): %w", f, err)
		}
	}
	// The shim installed set-user-ID in a system directory, this build's,
	// is preloaded by name: the dynamic loader's secure mode takes it
	// there, where it ignores a path (ld.so(8)).
	entry := shim
	if d := installedShim(shim, core); d != "" {
		entry, core = shimLib, filepath.Join(d, coreLib)
	}
	pre := entry
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		pre = entry + " " + old
	}
	env = setEnv(env, "LD_PRELOAD", pre)
	env = setEnv(env, "ONLOAD_CORE", core)
	path, err := exec.LookPath(cmd[0])
	if err != nil {
		return &exitError{127, fmt.Errorf("run: %w", err)}
	}
	if why := notPreloadable(path, entry == shimLib); why != "" {
		// Not an error: the program runs, on the kernel.
		fmt.Fprintf(os.Stderr, "onloadd run: %s: %s; its sockets use the kernel\n", path, why)
	}
	err = syscall.Exec(path, cmd, env)
	return &exitError{126, fmt.Errorf("run: exec %s: %w", path, err)}
}

// exitError is an error that ends onloadd with its own status: as env(1)
// and nice(1) do, 127 when the command is not found and 126 when it is
// found but cannot be run, so that a script tells those from the
// command's own failure.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// systemLibDirs are the dynamic loader's system directories, where its
// secure mode takes a preloaded library named without a path from, if
// the library is set-user-ID (ld.so(8)); the shim's C half has the same
// list (shim/core.c, trusted_dir).
func systemLibDirs() []string {
	dirs := []string{"/lib64", "/usr/lib64", "/lib", "/usr/lib"}
	switch runtime.GOARCH {
	case "amd64":
		return append([]string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}, dirs...)
	case "arm64":
		return append([]string{"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"}, dirs...)
	}
	return dirs
}

// installedShim is the system directory where make install-shim put the
// shim (set-user-ID, root's) and its core, or "". With shim and core set
// it must be their copy, byte for byte: another build's would not match
// the onloadd it talks to.
func installedShim(shim, core string) string {
	for _, d := range systemLibDirs() {
		s, c := filepath.Join(d, shimLib), filepath.Join(d, coreLib)
		st, err := os.Stat(s)
		if err != nil {
			continue
		}
		sys, _ := st.Sys().(*syscall.Stat_t)
		if st.Mode()&os.ModeSetuid == 0 || sys == nil || sys.Uid != 0 {
			continue
		}
		if shim == "" || sameFile(shim, s) && sameFile(core, c) {
			return d
		}
	}
	return ""
}

// sameFile says whether the files at a and b are one file or hold the
// same bytes.
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	if err != nil {
		return false
	}
	if os.SameFile(sa, sb) {
		return true
	}
	if sa.Size() != sb.Size() {
		return false
	}
	ba, err := os.ReadFile(a)
	if err != nil {
		return false
	}
	bb, err := os.ReadFile(b)
	return err == nil && bytes.Equal(ba, bb)
}

// notPreloadable says why the shim cannot accelerate the program at path,
// or "" when it can (or path is not an ELF program: a script's
// interpreter is preloaded as any program is). The dynamic loader is
// what preloads the shim, so a statically linked program never loads it;
// nor does a set-user-ID or set-group-ID one run by another user, unless
// the shim is installed set-user-ID (setuid: the loader's secure mode
// ignores an LD_PRELOAD with a path); and a Go program makes its own
// system calls, which the shim does not see.
func notPreloadable(path string, setuid bool) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := buildinfo.Read(f); err == nil {
		return "a Go program, whose net package makes its own system calls where the shim does not see them (a Go program uses the library instead: github.com/xdp-onload/onload/sockets)"
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return ""
	}
	if ef.Type == elf.ET_EXEC || ef.Type == elf.ET_DYN {
		interp := false
		for _, p := range ef.Progs {
			interp = interp || p.Type == elf.PT_INTERP
		}
		if !interp {
			return "statically linked: the dynamic loader, which preloads the shim, never runs"
		}
	}
	if st, err := f.Stat(); err == nil {
		m := st.Mode()
		sys, _ := st.Sys().(*syscall.Stat_t)
		if !setuid && sys != nil && (m&os.ModeSetuid != 0 && int(sys.Uid) != os.Geteuid() || m&os.ModeSetgid != 0 && int(sys.Gid) != os.Getegid()) {
			return "set-user-ID or set-group-ID: the dynamic loader ignores LD_PRELOAD=" + shimLib + " with a path for it (make install-shim installs the shim where it takes it from)"
		}
	}
	return ""
}
