package main

import (
	"io"
	"os"
	"strings"
	"testing"
)

// TestConfigDoc checks docs/config.md is what the option table renders
// (make docs regenerates it).
func TestConfigDoc(t *testing.T) {
	var b strings.Builder
	if err := config([]string{"-markdown"}, &b); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatalf("%v (make docs writes it)", err)
	}
	if string(got) != b.String() {
		t.Error("docs/config.md is out of date: run make docs")
	}
}

// TestConfigErrors checks that a bad variable is refused with its name and
// what it accepts.
func TestConfigErrors(t *testing.T) {
	for env, want := range map[string]string{
		"ONLOAD_SPIN_US=abc":           "ONLOAD_SPIN_US=\"abc\": must be a whole number from 0 to 10000000 µs",
		"ONLOAD_PROFILE=fast":          "ONLOAD_PROFILE=\"fast\": must be one of latency, balanced, throughput",
		"ONLOAD_RING_SIZE=1000":        "ONLOAD_RING_SIZE=\"1000\": must be a power of two from 64 to 16384",
		"ONLOAD_MIN_RTO_MS=0":          "ONLOAD_MIN_RTO_MS=\"0\": must be a whole number from 1 to 10000 ms",
		"ONLOAD_LOG=verbose":           "ONLOAD_LOG=\"verbose\": must be one of debug, info, warn, error",
		"ONLOAD_SEND_BUFFER=999999999": "ONLOAD_SEND_BUFFER=\"999999999\": must be a whole number from 2048 to 67108864 bytes",
	} {
		k, v, _ := strings.Cut(env, "=")
		t.Setenv(k, v)
		err := config(nil, io.Discard)
		if err == nil || err.Error() != want {
			t.Errorf("%s: error %v, want %q", env, err, want)
		}
		os.Unsetenv(k)
	}
	t.Setenv("ONLOAD_PROFILE", "latency")
	var b strings.Builder
	if err := config(nil, &b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "Spin:100ms") {
		t.Errorf("latency profile: %s, want a 100ms spin", b.String())
	}
}
