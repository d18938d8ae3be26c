package stack

import (
	"os"
	"strings"
)

func rdtsc() uint64

// tscUsable reports whether the TSC ticks at a constant rate through
// frequency changes and sleep states, so that it can stand in for
// CLOCK_MONOTONIC.
func tscUsable() bool {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	s := string(b)
	return strings.Contains(s, " constant_tsc") && strings.Contains(s, " nonstop_tsc")
}
