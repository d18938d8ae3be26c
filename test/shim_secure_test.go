package test

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestShimSecureExec runs shim/test/secure.c, a program that execs its
// worker with its real and effective users apart, as squid's master does
// (root in effect, its user in name): the dynamic loader runs such a
// worker in secure mode, which ignores the LD_PRELOAD entry with a path
// that `onloadd run` writes. Both workers echo through their connections
// as on the kernel; the worker exec'd as it is runs accelerated, the other
// on the kernel, and the shim says why, once. Before, squid under
// `onloadd run` ran wholly on the kernel and nothing said so.
func TestShimSecureExec(t *testing.T) {
	prog, a, addr, port := secureProgram(t)
	kernel, _ := runBounded(t, a.Command(prog, addr, port), 30*time.Second)
	shim, log := runBounded(t, shimCommand(t, a, nil, prog, addr, port), 30*time.Second)
	requireAccelerated(t, log, "connecting")
	for _, want := range []string{"same users: secure mode 0", "users apart: secure mode 1", "users apart: echo through", "users apart: exit 0"} {
		if !strings.Contains(kernel, want) {
			t.Fatalf("on the kernel, no %q:\n%s", want, kernel)
		}
	}
	said := "runs in the dynamic loader's secure mode (real uid 65534, effective 0"
	if shim != kernel || strings.Count(log, said) != 1 {
		t.Fatalf("under the shim it printed:\n%s\non the kernel:\n%s\nshim's log (want %q once):\n%s", shim, kernel, said, log)
	}
	t.Logf("%s\nshim's log:\n%s", shim, log)
}

// secureProgram builds shim/test/secure.c, and the echo server it talks
// to from host a at addr:port.
func secureProgram(t *testing.T) (prog string, a *Host, addr, port string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the program sets its real user apart from its effective one")
	}
	shimOnloadd(t)
	prog = buildC(t, "secure")
	a, b, ln := echoHosts(t)
	return prog, a, b.Iface0().Addr().String(), strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// TestShimSecureExecInstalled installs the shim set-user-ID in the
// system's library directory (make install-shim) and runs secure.c
// again: onloadd run preloads the shim by name, the dynamic loader's
// secure mode takes it there, and the worker exec'd with its users apart
// runs accelerated, its stack from onloadd. In that mode the environment
// is a less privileged user's and the shim trusts none of it that names
// a file: the worker's lines go to standard error with ONLOAD_LOG_FILE
// set (said), and a run with ONLOAD_CORE naming a file that is not there
// finds the core beside the shim for that worker, where the worker
// exec'd as it is, reading ONLOAD_CORE, runs on the kernel.
func TestShimSecureExecInstalled(t *testing.T) {
	prog, a, addr, port := secureProgram(t)
	libdir := shimLibDir(t)
	for _, f := range []string{"libonload.so", "libonload-core.so"} {
		if _, err := os.Stat(filepath.Join(libdir, f)); err == nil {
			t.Skipf("%s is installed already: not replacing it (make uninstall-shim removes it)", filepath.Join(libdir, f))
		}
	}
	runMake := func(target string) {
		t.Helper()
		if out, err := exec.Command("make", "-C", "..", target, "SHIM_LIBDIR="+libdir).CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}
	RequireTool(t, "make")
	runMake("install-shim")
	t.Cleanup(func() { runMake("uninstall-shim") })
	dir, _ := daemonDir(t)
	sock, _ := startDaemon(t, a, dir)
	file := filepath.Join(t.TempDir(), "onload.log")
	env := []string{"ONLOAD_DAEMON=require", "ONLOAD_DAEMON_SOCKET=" + sock, "ONLOAD_INTERFACE=" + a.Iface0().Name,
		"ONLOAD_LOG_FILE=" + file}
	cmd := shimCommand(t, a, env, prog, addr, port)
	out, stderr := runBounded(t, cmd, 30*time.Second)
	for _, want := range []string{"same users: secure mode 0", "users apart: secure mode 1", "users apart: echo through", "users apart: exit 0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q; the program printed:\n%s\nstandard error:\n%s", want, out, stderr)
		}
	}
	log, _ := os.ReadFile(file)
	pid := workerPid(t, stderr, "users apart")
	if !regexp.MustCompile(`onload\[`+pid+`\]: fd \d+: connecting, accelerated`).MatchString(stderr) ||
		!strings.Contains(stderr, "onload["+pid+"]: ONLOAD_LOG_FILE="+file+" is ignored in the dynamic loader's secure mode") ||
		strings.Contains(string(log), "onload["+pid+"]") || strings.Contains(string(log)+stderr, "runs in the dynamic loader's secure mode") {
		t.Fatalf("the worker in secure mode (pid %s) is not accelerated with its log on standard error, or the exec's loss of the shim was said:\nstandard error:\n%s\nlog file:\n%s", pid, stderr, log)
	}
	same := workerPid(t, stderr, "same users")
	if !regexp.MustCompile(`onload\[` + same + `\]: fd \d+: connecting, accelerated`).Match(log) {
		t.Fatalf("the worker exec'd as it is (pid %s) is not accelerated:\nlog file:\n%s", same, log)
	}

	// The shim preloaded by name, ONLOAD_CORE naming no file, and
	// ONLOAD_DAEMON off: the worker in secure mode takes its stack from
	// onloadd all the same (the only stack of the run: the others have
	// no core).
	bogus := filepath.Join(t.TempDir(), "libonload-core.so")
	cmd = a.Command(prog, addr, port)
	cmd.Env = append(os.Environ(), append(env[1:3:3], "ONLOAD_DAEMON=off", "ONLOAD_LOG=debug", "LD_PRELOAD=libonload.so", "ONLOAD_CORE="+bogus)...)
	out, stderr = runBounded(t, cmd, 30*time.Second)
	pid, same = workerPid(t, stderr, "users apart"), workerPid(t, stderr, "same users")
	if !strings.Contains(out, "users apart: exit 0") || !strings.Contains(out, "same users: exit 0") ||
		!regexp.MustCompile(`onload\[`+pid+`\]: fd \d+: connecting, accelerated`).MatchString(stderr) ||
		!strings.Contains(stderr, "onload["+same+"]: cannot load the core "+bogus) ||
		!strings.Contains(stderr, "onload["+pid+"]: ONLOAD_CORE="+bogus+" is ignored in the dynamic loader's secure mode") ||
		!regexp.MustCompile(`msg="onload: stack \d+ on \S+ queue \d+ \([^)]*through onloadd`).MatchString(stderr) {
		t.Fatalf("with ONLOAD_CORE=%s: the worker in secure mode (pid %s) did not load the installed core and take its stack from onloadd, or the other (pid %s) did not say it had none:\nthe program printed:\n%s\nstandard error:\n%s", bogus, pid, same, out, stderr)
	}
	t.Logf("standard error:\n%s", stderr)
}

// shimLibDir is where make install-shim installs the shim by default:
// the system's library directory for this architecture.
func shimLibDir(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("clang", "-print-multiarch").Output()
	if err != nil || len(strings.TrimSpace(string(out))) == 0 {
		Missing(t, "clang -print-multiarch: %v", err)
	}
	return "/usr/lib/" + strings.TrimSpace(string(out))
}

// workerPid is the pid secure.c's worker tag said on standard error.
func workerPid(t *testing.T, stderr, tag string) string {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(tag) + `: pid (\d+)`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no pid of the worker %q on standard error:\n%s", tag, stderr)
	}
	return m[1]
}
