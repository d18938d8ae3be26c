package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunExitStatus: a command that is not found ends onloadd run with
// 127, and one found but not runnable with 126, as env(1) and nice(1)
// end, each with an error that names the command.
func TestRunExitStatus(t *testing.T) {
	lib := t.TempDir()
	for _, f := range []string{shimLib, coreLib} {
		if err := os.WriteFile(filepath.Join(lib, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	notExec := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(notExec, []byte("not a program"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cmd  string
		code int
	}{
		{filepath.Join(t.TempDir(), "missing"), 127},
		{"no-such-command-onloadd-test", 127},
		{notExec, 126},
	} {
		err := run([]string{"-lib", lib, "--", c.cmd})
		var ee *exitError
		if !errors.As(err, &ee) || ee.code != c.code {
			t.Errorf("onloadd run -- %s: %v, want exit status %d", c.cmd, err, c.code)
			continue
		}
		if !strings.Contains(err.Error(), filepath.Base(c.cmd)) {
			t.Errorf("onloadd run -- %s: %q does not name the command", c.cmd, err)
		}
	}
}

// TestNotPreloadable: onloadd run says when the shim cannot load into the
// program (it still runs it, on the kernel): a statically linked program
// and a Go program are named, a dynamically linked C program and a
// script are not.
func TestNotPreloadable(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "p.c")
	if err := os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	static := filepath.Join(dir, "static")
	if out, err := exec.Command("clang", "-static", "-o", static, src).CombinedOutput(); err != nil {
		t.Fatalf("clang -static (clang's libc6-dev has libc.a): %v\n%s", err, out)
	}
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	goProg, err := os.Executable() // this test, a Go program
	if err != nil {
		t.Fatal(err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path, want string
		setuid     bool // the shim is installed set-user-ID
	}{
		{static, "statically linked", false},
		{goProg, "a Go program", false},
		{sh, "", false},
		{script, "", false},
	}
	if os.Geteuid() == 0 {
		// A program set-user-ID for another user: the loader's secure
		// mode takes only a set-user-ID shim, from a system directory.
		suid := filepath.Join(dir, "suid")
		b, err := os.ReadFile(sh)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(suid, b, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(suid, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(suid, 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			path, want string
			setuid     bool
		}{suid, "set-user-ID", false}, struct {
			path, want string
			setuid     bool
		}{suid, "", true})
	} else {
		t.Log("not root: a set-user-ID program of another user's is not tried")
	}
	for _, c := range cases {
		got := notPreloadable(c.path, c.setuid)
		if c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("notPreloadable(%s, shim set-user-ID %v) = %q, want %q", c.path, c.setuid, got, c.want)
		}
	}
}
