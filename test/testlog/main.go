// Command testlog reads `go test -json` on its standard input and writes
// what plain `go test` would (each package's result, and the output of
// the tests that failed), then every test that was skipped, with its
// reason: a skipped test is reported, never silent. It exits 1 if a test
// or a package failed or the build did not; `make test` pipes every run
// through it.
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
	var skipped []string
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
	return failed, nil
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
