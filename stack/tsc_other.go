//go:build !amd64

package stack

func rdtsc() uint64   { return 0 }
func tscUsable() bool { return false }
