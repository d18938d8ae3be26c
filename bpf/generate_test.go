package bpf_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/xdp-onload/onload/test"
)

// TestGeneratedUpToDate rebuilds the program with the //go:generate line
// of gen.go into a scratch directory and checks that the committed object
// and Go bindings are byte for byte what it produces: steer.c and the
// committed output never drift apart, and `make generate` on a clean tree
// changes nothing.
func TestGeneratedUpToDate(t *testing.T) {
	for _, tool := range []string{"clang", "llvm-strip"} {
		test.RequireTool(t, tool)
	}
	src, err := os.ReadFile("gen.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^//go:generate go tool bpf2go (.*)$`).FindSubmatch(src)
	if m == nil {
		t.Fatal("no bpf2go //go:generate line in gen.go")
	}
	args := splitArgs(string(m[1]))
	out := t.TempDir()
	cmd := exec.Command("go", append([]string{"tool", "bpf2go", "-go-package", "bpf", "-output-dir", out}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("bpf2go: %v\n%s", err, b)
	}
	for _, f := range []string{"steer_bpfel.o", "steer_bpfel.go"} {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: steer.c (or the toolchain) produces different bytes; run `make generate` and commit", f)
		}
	}
}

// splitArgs splits a command line on spaces, keeping double-quoted parts
// together.
func splitArgs(s string) []string {
	var args []string
	for _, m := range regexp.MustCompile(`"[^"]*"|\S+`).FindAllString(s, -1) {
		if len(m) >= 2 && m[0] == '"' {
			m = m[1 : len(m)-1]
		}
		args = append(args, m)
	}
	return args
}
