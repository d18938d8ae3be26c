package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
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

// machineCPU is the machine's CPU time by state since boot, in ticks
// (/proc/stat's first line).
type machineCPU struct{ idle, steal, total uint64 }

func readMachineCPU() (machineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, fmt.Errorf("machine cpu: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("machine cpu: unexpected /proc/stat line %q", line)
	}
	var m machineCPU
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("machine cpu: %q: %w", line, err)
		}
		m.total += v
		switch i {
		case 3, 4: // idle, iowait
			m.idle += v
		case 7:
			m.steal += v
		}
	}
	return m, nil
}

// machineShare is what the machine's CPUs did over a round: the share of
// their time they were idle, and the share the hypervisor ran something
// else while they had work (steal). On this virtual machine a CPU that
// halts is woken through the host, and the wait shows as steal: a
// contender whose threads block and wake often draws more of it, which
// a ratio of requests a second does not show by itself.
type machineShare struct{ Idle, Stolen float64 }

func (m machineCPU) since(m0 machineCPU) machineShare {
	t := float64(m.total - m0.total)
	if t <= 0 {
		return machineShare{}
	}
	return machineShare{Idle: float64(m.idle-m0.idle) / t, Stolen: float64(m.steal-m0.steal) / t}
}

// machineWatch records the machine's shares over rounds, by contender.
type machineWatch map[string][]machineShare

// start reads the machine's CPU time; the function it returns reads it
// again and records the round for id. A machine without /proc/stat
// records nothing.
func (w machineWatch) start(id string) func() {
	m0, err := readMachineCPU()
	return func() {
		m, err2 := readMachineCPU()
		if err == nil && err2 == nil {
			w[id] = append(w[id], m.since(m0))
		}
	}
}

// rounds is id's rounds' idle and stolen shares, rounded.
func (w machineWatch) rounds(id string) (idle, stolen []float64) {
	for _, s := range w[id] {
		idle = append(idle, round3(s.Idle))
		stolen = append(stolen, round3(s.Stolen))
	}
	return idle, stolen
}
