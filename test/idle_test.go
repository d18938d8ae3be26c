package test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdp-onload/onload/sockets"
)

const idleConns = 100

func init() {
	// 100 accelerated connections to an echo server, each with a
	// goroutine blocked in Read. After READY the process should cost
	// (almost) nothing; on a line on stdin it checks every connection
	// still echoes, and exits.
	helpers["idle-conns"] = func() error {
		addr := os.Getenv("ECHO_ADDR")
		conns := make([]net.Conn, idleConns)
		got := make(chan error, idleConns)
		for i := range conns {
			c, err := sockets.Dial("tcp", addr)
			if err != nil {
				return err
			}
			if _, ok := c.(*sockets.TCPConn); !ok {
				return fmt.Errorf("connection %d is not accelerated (%T)", i, c)
			}
			conns[i] = c
			go func() {
				buf := make([]byte, 16)
				_, err := io.ReadFull(c, buf)
				if err == nil && !bytes.Equal(buf, []byte(fmt.Sprintf("conn %11d", i))) {
					err = fmt.Errorf("connection %d echoed %q", i, buf)
				}
				got <- err
			}()
		}
		fmt.Println("READY")
		bufio.NewReader(os.Stdin).ReadString('\n')
		for i, c := range conns {
			if _, err := fmt.Fprintf(c, "conn %11d", i); err != nil {
				return err
			}
		}
		for range conns {
			select {
			case err := <-got:
				if err != nil {
					return err
				}
			case <-time.After(10 * time.Second):
				return fmt.Errorf("a connection did not echo within 10s of waking")
			}
		}
		return nil
	}
}

// cpuUse reads how long a process's threads have run, together
// (ThreadsCPU), and how many times they were given a processor.
func cpuUse(pid int) (run time.Duration, slices int64, err error) {
	threads, err := ThreadsCPU(pid)
	for _, t := range threads {
		run += t.Run
		slices += t.Slices
	}
	return run, slices, err
}

// cpuTicks reads a process's user and system time, in clock ticks.
func cpuTicks(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces; the fields start after its ')'.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return utime + stime, nil
}

// osThreads reads a process's thread count from /proc/<pid>/status.
func osThreads(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no Threads line in /proc/%d/status", pid)
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times.
const clockTicks = 100

// TestIdleCPU holds 100 idle accelerated connections in a process (every
// goroutine blocked in Read) and measures, from /proc, the CPU the process
// uses once the spin period is over: it must be under 1% of a core. Then
// every connection must still wake and work. The goroutines blocked in
// Read must not hold OS threads.
func TestIdleCPU(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	echo, err := a.KernelEcho(a.Iface0().Addr().String() + ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	p := startHelper(t, b, "idle-conns", "ECHO_ADDR="+echo.Addr().String())
	pid := p.cmd.Process.Pid
	time.Sleep(500 * time.Millisecond) // spin periods end, the Sleeper arms
	const window = 5 * time.Second
	t0, err := cpuTicks(pid)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(window)
	t1, err := cpuTicks(pid)
	if err != nil {
		t.Fatal(err)
	}
	used := float64(t1-t0) / clockTicks / window.Seconds()
	t.Logf("%d idle connections: %.2f%% of a core over %v (%d ticks)", idleConns, used*100, window, t1-t0)
	if used >= 0.01 {
		t.Errorf("idle process used %.2f%% of a core, want under 1%%", used*100)
	}
	// A blocked goroutine must not hold an OS thread, as in net: the
	// process needs the runtime's few threads, not one per connection.
	threads, err := osThreads(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d OS threads for %d goroutines blocked in Read", threads, idleConns)
	if threads > idleConns/4 {
		t.Errorf("%d OS threads for %d blocked goroutines: blocking pins threads", threads, idleConns)
	}
	fmt.Fprintln(p.In, "go")
	if err := p.wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
}
