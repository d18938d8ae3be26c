// Package monotime reads CLOCK_MONOTONIC in nanoseconds through the Go
// runtime, which reads it through the vDSO (about 25 ns, no system call).
// It is the same clock in every process: the stack's image needs that
// (onloadd runs the timers of a stack another process armed), and the
// Sleeper's timerfd is set on it (interrupts.Policy.Thread).
package monotime

import _ "unsafe" // for go:linkname

// Now is CLOCK_MONOTONIC in nanoseconds.
//
//go:linkname Now runtime.nanotime
func Now() int64
