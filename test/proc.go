package test

import (
	"errors"
	"fmt"
	"io/fs"
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
	Delay  time.Duration // time waiting for one (run_delay)
	Slices int64         // times it was given one
}

// schedstat reads a schedstat file (/proc/.../schedstat): a thread's time
// on a processor, its time waiting for one, and how many times it was
// given one.
func schedstat(path string) (run, delay time.Duration, slices int64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, 0, err
	}
	var ns, wait int64
	if _, err := fmt.Sscan(string(b), &ns, &wait, &slices); err != nil {
		return 0, 0, 0, fmt.Errorf("%s: %q: %w", path, b, err)
	}
	return time.Duration(ns), time.Duration(wait), slices, nil
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
		run, delay, n, err := schedstat(dir + "/" + task.Name() + "/schedstat")
		if pe := (*fs.PathError)(nil); errors.As(err, &pe) {
			continue // the thread ended meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, ThreadCPU{TID: tid, Run: run, Delay: delay, Slices: n})
	}
	return out, nil
}
