package test

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// ThreadCPU is one thread's share of a process's CPU, from the
// scheduler's own count (/proc/PID/task/TID/schedstat, to the
// nanosecond).
type ThreadCPU struct {
	TID    int
	Run    time.Duration // time on a processor
	Slices int64         // times it was given one
}

// ThreadsCPU reads the CPU each of pid's threads has run so far. A thread
// that ends while they are read is left out.
func ThreadsCPU(pid int) ([]ThreadCPU, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("threads of %d: %w", pid, err)
	}
	var out []ThreadCPU
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(dir + "/" + task.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended meanwhile
		}
		var ns, wait, n int64
		if _, err := fmt.Sscan(string(b), &ns, &wait, &n); err != nil {
			return nil, fmt.Errorf("%s/%s/schedstat: %q: %w", dir, task.Name(), b, err)
		}
		out = append(out, ThreadCPU{TID: tid, Run: time.Duration(ns), Slices: n})
	}
	return out, nil
}
