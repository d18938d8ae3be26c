package main

import (
	"errors"
	"os"
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
