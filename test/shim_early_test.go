package test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestShimEarlyCalls runs shim/test/early.c: a library the program needs
// makes calls the shim interposes (read, write, poll, fcntl, ioctl,
// sigaction, socket, close) from its constructor, which the loader runs
// before the shim's own. They go to libc as without the shim. Before,
// libc's functions were found only in the shim's constructor, and such a
// call jumped to address 0: sshd, whose libcap-ng reads a /proc file from
// its constructor, died at once under the shim.
func TestShimEarlyCalls(t *testing.T) {
	onloadd := shimOnloadd(t)
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "clang"
	}
	RequireTool(t, cc)
	dir := t.TempDir()
	src := "../shim/test/early.c"
	for _, args := range [][]string{
		{"-O2", "-Wall", "-shared", "-fPIC", "-DEARLY_LIB", "-o", filepath.Join(dir, "libearly.so"), src},
		{"-O2", "-Wall", "-o", filepath.Join(dir, "early"), src, "-L" + dir, "-learly", "-Wl,-rpath," + dir},
	} {
		if b, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", cc, args, err, b)
		}
	}
	prog := filepath.Join(dir, "early")
	want, stderr, err := runLimited(exec.Command(prog), 10*time.Second)
	if err != nil || want == "" {
		t.Fatalf("without the shim: %v\n%s%s", err, want, stderr)
	}
	cmd := exec.Command(onloadd, "run", "--", prog)
	cmd.Env = append(os.Environ(), "ONLOAD_DAEMON=off")
	got, stderr, err := runLimited(cmd, 10*time.Second)
	if err != nil || got != want {
		t.Fatalf("under the shim (%v) it printed:\n%s%s\nwithout it:\n%s", err, got, stderr, want)
	}
	t.Logf("%d lines as without the shim", strings.Count(want, "\n"))
}
