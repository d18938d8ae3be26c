// Command testlog reads `go test -json` on its standard input and writes
// what plain `go test` would (each package's result, and the output of
// the tests that failed), then every test that was skipped, with its
// reason: a skipped test is reported, never silent, and last each test
// that failed with its own messages (t.Error's lines, without the logs
// its helpers printed), so that the tail of a long log still says what
// failed and why. It exits 1 if a test or a package failed or the build
// did not; `make test` pipes every run through it.
//
//	go test -json ./... | go run ./test/testlog
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of test2json's output.
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type key struct{ pkg, test string }

func main() {
	failed, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// summarize copies r's events to w as plain text and reports whether
// anything failed.
func summarize(r io.Reader, w io.Writer) (failed bool, err error) {
	out := map[key][]string{} // output of tests still running
	var skipped, failures []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if json.Unmarshal(line, &e) != nil || e.Action == "" {
			// Not an event (the build's own errors): pass it on.
			fmt.Fprintln(w, string(line))
			if len(line) > 0 {
				failed = true
			}
			continue
		}
		k := key{e.Package, e.Test}
		switch e.Action {
		case "output":
			if e.Test == "" {
				// The package's own lines: ok, FAIL, panics, fuzz progress.
				if !strings.HasPrefix(e.Output, "=== ") && !strings.HasPrefix(e.Output, "--- ") &&
					e.Output != "PASS\n" && e.Output != "FAIL\n" {
					fmt.Fprint(w, e.Output)
				}
				if strings.HasPrefix(e.Output, "FAIL") || strings.HasPrefix(e.Output, "panic:") {
					failed = true
				}
				continue
			}
			out[k] = append(out[k], e.Output)
		case "fail":
			if e.Test != "" {
				for _, l := range out[k] {
					fmt.Fprint(w, l)
				}
				failures = append(failures, fmt.Sprintf("%s %s (%.2fs)", e.Package, e.Test, e.Elapsed))
				for _, m := range messages(out[k]) {
					failures = append(failures, "    "+m)
				}
			}
			failed = true
			delete(out, k)
		case "skip":
			if e.Test != "" {
				skipped = append(skipped, fmt.Sprintf("%s %s: %s", e.Package, e.Test, reason(out[k])))
			}
			delete(out, k)
		case "pass":
			delete(out, k)
		}
	}
	if err := sc.Err(); err != nil {
		return true, err
	}
	sort.Strings(skipped)
	if len(skipped) > 0 {
		fmt.Fprintf(w, "\n%d tests skipped:\n", len(skipped))
		for _, s := range skipped {
			fmt.Fprintln(w, "  "+s)
		}
	} else {
		fmt.Fprintln(w, "\nno test skipped")
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "\ntests that failed, with their messages:\n")
		for _, f := range failures {
			fmt.Fprintln(w, "  "+f)
		}
	}
	return failed, nil
}

// messages are a failed test's own lines: those the testing package
// prefixed with the file and line of t.Error or t.Fatal ("x_test.go:12:
// ..."), with the lines that continue them (indented deeper), and none
// of the output its helpers and the code under test printed. A message
// keeps its first 12 continuation lines (a t.Log of a helper's output can
// have thousands); there are at most 40 lines in all.
func messages(lines []string) []string {
	var msg []string
	cont := -1 // continuation lines of the current message; -1: none
	for _, l := range lines {
		t := strings.TrimRight(l, "\n")
		s := strings.TrimLeft(t, " ")
		switch {
		case isTestLine(s):
			cont = 0
			msg = append(msg, s)
		case cont >= 0 && len(t)-len(s) > 4 && s != "":
			if cont++; cont <= 12 {
				msg = append(msg, "    "+s)
			} else if cont == 13 {
				msg = append(msg, "    ...")
			}
		default:
			cont = -1
		}
		if len(msg) == 40 {
			return append(msg, "...")
		}
	}
	return msg
}

// isTestLine reports that s begins as the testing package's report of a
// t.Error, t.Fatal or t.Log does: "name_test.go:123: ".
func isTestLine(s string) bool {
	f, rest, ok := strings.Cut(s, ":")
	if !ok || !strings.HasSuffix(f, "_test.go") || strings.Contains(f, " ") {
		return false
	}
	n, _, ok := strings.Cut(rest, ":")
	return ok && n != "" && strings.Trim(n, "0123456789") == ""
}

// reason is the skip message from a test's output: the lines between
// its "=== RUN" and "--- SKIP" lines.
func reason(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		// "file_test.go:12: skipped: why" -> "skipped: why"
		if i := strings.Index(t, ": "); i > 0 && strings.Contains(t[:i], ".go:") {
			t = t[i+2:]
		}
		msg = append(msg, t)
	}
	if len(msg) == 0 {
		return "(no reason given)"
	}
	return strings.Join(msg, " / ")
}
