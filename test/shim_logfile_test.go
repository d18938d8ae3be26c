package test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestShimLogFile runs shim/test/secure.c with ONLOAD_LOG_FILE: the
// shim's lines (the interposer's and the core's) go to the file, from
// each process of the program, each line naming its process, a process
// that took another user since it started among them, and none to
// standard error, which a daemon may have closed or redirected (squid
// in daemon mode: its master's word that its worker runs without the
// shim went nowhere). A file that cannot be opened leaves the log on
// standard error, saying why.
func TestShimLogFile(t *testing.T) {
	prog, a, addr, port := secureProgram(t)
	file := filepath.Join(t.TempDir(), "onload.log")
	out, stderr := runBounded(t, shimCommand(t, a, []string{"ONLOAD_LOG_FILE=" + file}, prog, addr, port), 30*time.Second)
	if !strings.Contains(out, "another user: exit 0") {
		t.Fatalf("the program printed:\n%s\nstandard error:\n%s", out, stderr)
	}
	log, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("no log file: %v; standard error:\n%s", err, stderr)
	}
	if strings.Contains(stderr, "onload") {
		t.Errorf("the shim's lines went to standard error too:\n%s", stderr)
	}
	// The interposer's lines: the accelerated worker's connect, the
	// second child's exec; the core's: the worker's stack, with its pid.
	worker := regexp.MustCompile(`onload\[(\d+)\]: fd \d+: connecting, accelerated`).FindStringSubmatch(string(log))
	child := regexp.MustCompile(`onload\[(\d+)\]: exec .*secure mode`).FindStringSubmatch(string(log))
	if worker == nil || child == nil || worker[1] == child[1] ||
		!regexp.MustCompile(`level=INFO msg="onload: stack on .*" pid=`+worker[1]+`\b`).Match(log) {
		t.Fatalf("the log file lacks the worker's connect, the child's exec or the worker's stack, by process:\n%s", log)
	}
	// The child that took another user cannot open the file (root's, in
	// root's directory): its lines, the interposer's and the core's, go
	// through the file the process opened as it started.
	other := regexp.MustCompile(`onload\[(\d+)\]: fd \d+: an IPv4 UDP socket`).FindStringSubmatch(string(log))
	if other == nil || !regexp.MustCompile(`msg="onload: .*" pid=`+other[1]+`\b`).Match(log) {
		t.Fatalf("the log file lacks the lines of the child that took another user:\n%s\nstandard error:\n%s", log, stderr)
	}
	t.Logf("log file:\n%s", log)

	bad := "/nonexistent/onload.log"
	out, stderr = runBounded(t, shimCommand(t, a, []string{"ONLOAD_LOG_FILE=" + bad}, prog, addr, port), 30*time.Second)
	if !strings.Contains(out, "another user: exit 0") || !strings.Contains(stderr, "ONLOAD_LOG_FILE="+bad+": ") ||
		!strings.Contains(stderr, "the log goes to standard error") || !strings.Contains(stderr, "connecting, accelerated") {
		t.Fatalf("with an unopenable file: the program printed:\n%s\nstandard error:\n%s", out, stderr)
	}
}
