package main

import (
	"time"

	"github.com/xdp-onload/onload/test"
)

// cpuUse is the CPU a server process's threads have run: its main
// thread's, and its other threads' together (under the shim, the Go
// runtime's; redis-server's own background threads idle under this
// load). From test.ThreadsCPU.
type cpuUse struct {
	main, others time.Duration
	requests     int // what the load asked in that time
}

// threadsCPU reads pid's threads' CPU time now.
func threadsCPU(pid int) (cpuUse, error) {
	threads, err := test.ThreadsCPU(pid)
	if err != nil {
		return cpuUse{}, err
	}
	var u cpuUse
	for _, t := range threads {
		if t.TID == pid {
			u.main += t.Run
		} else {
			u.others += t.Run
		}
	}
	return u, nil
}

// since is what ran from u0 to u (threads that exited between the two
// readings drop out of u: a server's threads here live as long as it).
func (u cpuUse) since(u0 cpuUse) cpuUse {
	return cpuUse{main: u.main - u0.main, others: u.others - u0.others}
}

// perRequest is the µs of CPU all the threads ran a request.
func (u cpuUse) perRequest() float64 {
	if u.requests == 0 {
		return 0
	}
	return float64(u.main+u.others) / float64(time.Microsecond) / float64(u.requests)
}

// othersShare is the other threads' CPU over the main thread's.
func (u cpuUse) othersShare() float64 {
	if u.main == 0 {
		return 0
	}
	return float64(u.others) / float64(u.main)
}
