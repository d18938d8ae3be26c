package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// TestFailureSummary: a failed test's own messages come again after the
// skips, at the end of the log, without its helpers' output, and a
// message's long continuation is cut.
func TestFailureSummary(t *testing.T) {
	var in strings.Builder
	ev := func(action, test, output string) {
		in.WriteString(`{"Action":"` + action + `","Package":"p","Test":"` + test + `","Output":` + quote(output) + "}\n")
	}
	ev("output", "TestA", "=== RUN   TestA\n")
	ev("output", "TestA", "time=1 level=INFO msg=\"from a helper\"\n")
	ev("output", "TestA", "    a_test.go:12: server 0, dial 3: \"\", timed out\n")
	ev("output", "TestA", "    a_test.go:40: onloadd said:\n")
	for range 15 {
		ev("output", "TestA", "        time=2 level=INFO msg=\"port freed\"\n")
	}
	ev("output", "TestA", "--- FAIL: TestA (17.69s)\n")
	ev("fail", "TestA", "")
	ev("output", "TestB", "    b_test.go:1: skipped: no tool\n")
	ev("skip", "TestB", "")
	var out bytes.Buffer
	failed, err := summarize(strings.NewReader(in.String()), &out)
	if err != nil || !failed {
		t.Fatalf("summarize: failed %v, %v", failed, err)
	}
	_, tail, ok := strings.Cut(out.String(), "tests that failed, with their messages:\n")
	if !ok {
		t.Fatalf("no summary of failures at the end:\n%s", out.String())
	}
	want := []string{
		"p TestA (0.00s)",
		"a_test.go:12: server 0, dial 3: \"\", timed out",
		"a_test.go:40: onloadd said:",
	}
	for _, w := range want {
		if !strings.Contains(tail, w) {
			t.Errorf("the summary lacks %q:\n%s", w, tail)
		}
	}
	if strings.Contains(tail, "from a helper") || strings.Count(tail, "port freed") != 12 || !strings.Contains(tail, "...") {
		t.Errorf("the summary should hold the test's messages only, each cut at 12 more lines:\n%s", tail)
	}
	if i, j := strings.Index(out.String(), "tests skipped"), strings.Index(out.String(), "tests that failed"); i < 0 || i > j {
		t.Errorf("the failures should come after the skips:\n%s", out.String())
	}
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
