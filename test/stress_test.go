package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime/metrics"
	"runtime/trace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdp-onload/onload/sockets"
)

// TestNoLostWakeup runs our stack at both ends of a veth (so both sides
// sleep and wake through the steering program's interrupts) with many
// goroutines moving random amounts of data with random pauses, for a
// minute (ONLOAD_STRESS_SECONDS changes it). Each connection streams a
// seeded byte stream through an echo with random read and write sizes
// and random pauses, and checks every byte that comes back. A connection
// with bytes sent and not yet echoed that makes no progress for
// stallAfter is a stall: a lost wake-up. Its pauses are at most 3ms, the
// path is a veth pair that loses nothing, and the buffers fit the fill
// rings, so nothing but a wake-up that never came can hold a connection
// up for that long (a lost frame would, for a retransmission timeout:
// the test fails then too, and its dump shows the drop).
func TestNoLostWakeup(t *testing.T) {
	RequireRoot(t)
	cfg, _ := sockets.DefaultConfig(sockets.Balanced)
	stress(t, stressDuration(time.Minute, 5*time.Second), cfg)
}

// stressDuration is how long a stress test runs: full, or short under
// -short, or ONLOAD_STRESS_SECONDS.
func stressDuration(full, short time.Duration) time.Duration {
	if s := os.Getenv("ONLOAD_STRESS_SECONDS"); s != "" {
		var n int
		fmt.Sscan(s, &n)
		return time.Duration(n) * time.Second
	}
	if testing.Short() {
		return short
	}
	return full
}

// listenOurs listens on our stack s in host h, on a port of its choice,
// until the test ends.
func listenOurs(t *testing.T, h *Host, s *sockets.Stack) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := h.Do(func() (err error) {
		lc := sockets.ListenConfig{Stack: s}
		ln, err = lc.Listen(context.Background(), "tcp", h.Iface0().Addr().String()+":0")
		return
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// suspectStall is a connection's stall past stallAfter that the watchdog
// has yet to judge.
type suspectStall struct {
	last    int64  // the connection's last progress before it (0: no suspect)
	stalled int64  // the process's own stalls (the heartbeat's count) at last
	dumps   string // the stacks at its detection
	brief   string // their rings and interrupt lines then (dumpBrief)
}

// dumpBrief picks out of a stack's dump its rings (frames waiting in
// each, whether a kick is owed) and its interrupt line (whether the
// Sleeper is armed, how long since the stack was polled, what the line
// holds): enough, in a verdict that a CI log's tail keeps, to tell a
// frame nobody was woken for from one that never came.
func dumpBrief(dump string) string {
	var parts []string
	for _, l := range strings.Split(dump, "\n") {
		if i := strings.Index(l, "rings: "); i >= 0 {
			parts = append(parts, l[i:])
		}
		if strings.HasPrefix(l, "sleeper ") {
			if i := strings.LastIndex(l, "} "); i >= 0 {
				parts = append(parts, l[i+2:])
			}
		}
	}
	return strings.Join(parts, "; ")
}

// schedWaits follows the Go scheduler's record of how long runnable
// goroutines waited for a processor (runtime/metrics'
// /sched/latencies:seconds), sampled by the watchdog: for each sample,
// a lower bound of the longest wait that ended since the one before.
type schedWaits struct {
	m       []metrics.Sample
	counts  []uint64
	samples []schedSample // the last few seconds'
}

type schedSample struct {
	at      int64         // UnixNano
	longest time.Duration // the longest wait that ended since the sample before
}

func (s *schedWaits) sample(now time.Time) {
	if s.m == nil {
		s.m = []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	}
	metrics.Read(s.m)
	if s.m[0].Value.Kind() != metrics.KindFloat64Histogram {
		return
	}
	h := s.m[0].Value.Float64Histogram()
	var longest time.Duration
	for i, c := range h.Counts {
		if i < len(s.counts) && c > s.counts[i] && !math.IsInf(h.Buckets[i], 0) {
			longest = max(longest, time.Duration(h.Buckets[i]*float64(time.Second)))
		}
	}
	s.counts = append(s.counts[:0], h.Counts...)
	s.samples = append(s.samples, schedSample{now.UnixNano(), longest})
	if len(s.samples) > 1000 {
		s.samples = append(s.samples[:0], s.samples[len(s.samples)-500:]...)
	}
}

// longest is the longest wait that ended after since (UnixNano).
func (s *schedWaits) longest(since int64) time.Duration {
	var d time.Duration
	for _, x := range s.samples {
		if x.at > since {
			d = max(d, x.longest)
		}
	}
	return d
}

// machineWaits follows three ways this machine keeps a packet from
// moving that neither the Go scheduler's waits nor a lost wake-up
// explain, sampled every 10ms or so:
//   - the time the hypervisor kept each CPU from running (/proc/stat's
//     steal, in ticks of 10ms);
//   - the time each CPU's softirq thread (ksoftirqd/N) waited for its CPU
//     (/proc/PID/schedstat's run_delay). A busy CPU hands its network
//     softirq to that thread, and veth's receive, the steering program
//     and the AF_XDP ring's flush wait with it; on these two CPUs shared
//     by a spinner, the thread had waited six times as long as it ran;
//   - the time each of this process's threads waited for a CPU
//     (/proc/self/task/TID/schedstat's run_delay): a thread the kernel
//     keeps off the CPUs stops the goroutine it runs, which the Go
//     scheduler counts as running, not waiting. A Sleeper, a readiness
//     goroutine or a kick held up so holds up every connection of its
//     stack: beside a race-built test binary, stalls of 60-90ms came
//     with the Sleeper's signal waiting and the Go scheduler's longest
//     wait 15-21ms. A lost wake-up leaves the threads asleep, not
//     waiting for a CPU.
type machineWaits struct {
	softirqd []string        // /proc/PID/schedstat of ksoftirqd/N, by N
	samples  []machineSample // the last few seconds'
}

type machineSample struct {
	at      int64                   // UnixNano
	steal   []time.Duration         // by CPU
	softirq []time.Duration         // by CPU: ksoftirqd's run_delay
	threads map[int64]time.Duration // by thread of this process: run_delay
}

// machineKept is what machineWaits.kept found in a window, and the
// longest hand-off of the runtime's network poller in it (the
// heartbeat's).
type machineKept struct {
	stolen  time.Duration // the most one CPU was stolen
	softirq time.Duration // the longest one softirq thread waited
	threads time.Duration // the longest one of the process's threads waited
	poller  time.Duration // the longest a byte in a pipe waited for its reader
}

// most is the largest of them.
func (k machineKept) most() time.Duration { return max(k.stolen, k.softirq, k.threads, k.poller) }

func (k machineKept) String() string {
	return fmt.Sprintf("of the network poller %v, of a softirq thread %v, of one of the process's threads for a CPU %v, the most a CPU was stolen by the hypervisor %v",
		k.poller.Round(time.Millisecond), k.softirq.Round(time.Millisecond), k.threads.Round(time.Millisecond), k.stolen)
}

// threadDelays reads run_delay of each of this process's threads.
func threadDelays() map[int64]time.Duration {
	threads, _ := ThreadsCPU(os.Getpid())
	m := make(map[int64]time.Duration, len(threads))
	for _, th := range threads {
		m[int64(th.TID)] = th.Delay
	}
	return m
}

func (m *machineWaits) sample(now time.Time) {
	if m.softirqd == nil {
		m.softirqd = []string{}
		dirs, _ := os.ReadDir("/proc")
		for _, d := range dirs {
			comm, err := os.ReadFile("/proc/" + d.Name() + "/comm")
			var cpu int
			if err == nil && strings.HasPrefix(string(comm), "ksoftirqd/") {
				if _, err := fmt.Sscanf(string(comm), "ksoftirqd/%d", &cpu); err == nil {
					for len(m.softirqd) <= cpu {
						m.softirqd = append(m.softirqd, "")
					}
					m.softirqd[cpu] = "/proc/" + d.Name() + "/schedstat"
				}
			}
		}
	}
	x := machineSample{at: now.UnixNano()}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			// cpuN user nice system idle iowait irq softirq steal ...
			if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
				continue
			}
			ticks, _ := strconv.ParseUint(f[8], 10, 64)
			x.steal = append(x.steal, time.Duration(ticks)*10*time.Millisecond) // USER_HZ is 100
		}
	}
	for _, path := range m.softirqd {
		_, delay, _, _ := schedstat(path)
		x.softirq = append(x.softirq, delay)
	}
	x.threads = threadDelays()
	m.samples = append(m.samples, x)
	if len(m.samples) > 1000 {
		m.samples = append(m.samples[:0], m.samples[len(m.samples)-500:]...)
	}
}

// kept is, from the last sample at or before since (UnixNano) to the
// latest, the most one CPU was stolen (less a tick: the counters move in
// whole ticks, so one may be time stolen outside the window; a round trip
// of 50ms with a tick stolen was a lost wake-up, one readiness signal in
// 200 dropped on purpose), the longest one CPU's softirq thread waited
// for it, and the longest one of the process's threads waited for a CPU
// (threads that came or went in the window are not counted); and, of
// poll (a heartbeat's), the network poller's longest hand-off in it.
func (m *machineWaits) kept(since int64, poll *pollLags) (k machineKept) {
	k.poller = poll.longest(since)
	if len(m.samples) == 0 {
		return k
	}
	from := m.samples[0]
	for _, x := range m.samples {
		if x.at <= since {
			from = x
		}
	}
	to := m.samples[len(m.samples)-1]
	for i := range min(len(from.steal), len(to.steal)) {
		k.stolen = max(k.stolen, to.steal[i]-from.steal[i])
	}
	k.stolen = max(k.stolen-10*time.Millisecond, 0)
	for i := range min(len(from.softirq), len(to.softirq)) {
		k.softirq = max(k.softirq, to.softirq[i]-from.softirq[i])
	}
	for tid, d := range to.threads {
		if d0, ok := from.threads[tid]; ok {
			k.threads = max(k.threads, d-d0)
		}
	}
	return k
}

// heartbeat measures the process's own stalls: how late a 1ms sleep
// wakes. A lost wake-up leaves the process idle, with nothing to keep it
// from waking on time; a process kept off its processors (a VM's, or a
// scheduler with more runnable goroutines than it can run), or whose Go
// runtime looks at its timers late, wakes late, and its connections'
// pauses over that time are the machine's, not a wake-up's.
//
// It times the runtime's network poller too, apart: after each sleep it
// writes a byte to a pipe that another goroutine waits to read, as a
// stack's readiness goroutine waits for its interrupt, and that one
// records how long the byte took to reach it (poll). Timers and the
// poller do not wait in the same place: a processor runs its due timers
// each time it schedules, but polls the network only once its run queue
// is empty, or the runtime's monitor (every 10ms at best) does it for it.
// Beside a race-built test binary, a stall of 125ms showed B's RX ring
// 1,053 frames deep, its interrupt's event in the kernel and not yet
// taken, and the stack not polled for 14ms. A lost wake-up leaves the
// poller idle and prompt.
type heartbeat struct {
	late atomic.Int64    // ns, in all: each sleep's wake beyond 2ms
	gaps [4]atomic.Int64 // sleeps that took over 5, 20, 80 and 320ms
	poll pollLags
}

// pollLags are the network poller's hand-offs that took over a
// millisecond, the last few thousand.
type pollLags struct {
	mu   sync.Mutex
	lags []schedSample // at: UnixNano of the hand-off's end
}

func (p *pollLags) add(at int64, lag time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lags = append(p.lags, schedSample{at, lag})
	if len(p.lags) > 4000 {
		p.lags = append(p.lags[:0], p.lags[len(p.lags)-2000:]...)
	}
}

// longest is the longest hand-off that ended after since (UnixNano).
func (p *pollLags) longest(since int64) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d time.Duration
	for _, x := range p.lags {
		if x.at > since {
			d = max(d, x.longest)
		}
	}
	return d
}

// startHeartbeat runs a heartbeat until the time given.
func startHeartbeat(t testing.TB, until time.Time) *heartbeat {
	h := new(heartbeat)
	pipe, err := pipePair()
	if err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	var sent atomic.Int64 // UnixNano of the last byte's write
	go func() {           // the poller's side: each byte as it comes
		defer pipe[0].Close()
		var b [1]byte
		for {
			if _, err := pipe[0].Read(b[:]); err != nil {
				return
			}
			now := time.Now().UnixNano()
			if lag := time.Duration(now - sent.Swap(0)); lag > time.Millisecond {
				h.poll.add(now, lag)
			}
		}
	}()
	go func() {
		defer pipe[1].Close()
		last := time.Now().UnixNano()
		var b [1]byte
		for time.Now().Before(until) {
			time.Sleep(time.Millisecond)
			now := time.Now().UnixNano()
			gap := now - last
			last = now
			if late := gap - int64(2*time.Millisecond); late > 0 {
				h.late.Add(late)
			}
			for k := range h.gaps {
				if gap > int64(time.Duration(5<<(2*k))*time.Millisecond) {
					h.gaps[k].Add(1)
				}
			}
			// One byte in the pipe at most: a reader late by several
			// beats is timed from the first write it missed.
			if sent.CompareAndSwap(0, now) {
				pipe[1].Write(b[:])
			}
		}
	}()
	return h
}

// pipePair is os.Pipe's two ends, read end first: files the runtime's
// network poller waits on.
func pipePair() ([2]*os.File, error) {
	r, w, err := os.Pipe()
	return [2]*os.File{r, w}, err
}

// stallAfter is how long a connection with data outstanding may go
// without progress. The race detector slows everything several times
// over and its runs are short: it gets more room.
var stallAfter = map[bool]time.Duration{false: 50 * time.Millisecond, true: time.Second}[raceEnabled]

func stress(t *testing.T, dur time.Duration, cfg sockets.Config) {
	const conns = 12
	// Every frame the peer may send unacknowledged (the receive windows,
	// fixed at 256 KiB, and the ACKs for the other direction: about 3,300
	// frames) fits the fill ring even when it is down to half its depth
	// (the NIC tops it up only then), so that nothing is dropped while a
	// stack sleeps: a stall can only be a wake-up that never came.
	cfg.RingSize, cfg.FillDepth, cfg.UmemFrames = 8192, 8192, 65536
	cfg.SendBuffer, cfg.SendBufferMax = 256<<10, 256<<10
	cfg.RecvBuffer, cfg.RecvBufferMax = 256<<10, 256<<10
	a, b := Pair(t, LinkOptions{})
	sa := ourSocketsConfig(t, a, cfg)
	sb := ourSocketsConfig(t, b, cfg)

	ln := listenOurs(t, b, sb)
	flight := startFlight(t)

	var serverRead sync.Map                 // client address -> *atomic.Int64, bytes the server read
	written := make([]atomic.Int64, conns)  // bytes each connection's writer has sent
	progress := make([]atomic.Int64, conns) // UnixNano of each connection's last progress
	// The process's own stalls (the heartbeat's, below), and their sum at
	// each connection's last progress.
	beat := startHeartbeat(t, time.Now().Add(dur+time.Minute))
	stalled := &beat.late
	stalledAt := make([]atomic.Int64, conns)
	noteProgress := func(i int) {
		stalledAt[i].Store(stalled.Load())
		progress[i].Store(time.Now().UnixNano())
	}
	moved := make([]atomic.Int64, conns)
	var wg sync.WaitGroup
	errs := make(chan error, 4*conns)
	// Servers: echo with random chunk sizes and pauses.
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				rng := rand.New(rand.NewPCG(uint64(i), 99))
				buf := make([]byte, 256<<10)
				var got atomic.Int64
				serverRead.Store(c.RemoteAddr().String(), &got)
				for {
					n, err := c.Read(buf[:1+rng.IntN(len(buf))])
					got.Add(int64(n))
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							errs <- fmt.Errorf("server write: %w", werr)
							return
						}
					}
					if err == io.EOF {
						c.(interface{ CloseWrite() error }).CloseWrite()
						return
					}
					if err != nil {
						errs <- fmt.Errorf("server read: %w", err)
						return
					}
					pause(rng)
				}
			}()
		}
	}()

	stop := time.Now().Add(dur)
	d := sockets.Dialer{Stack: sa}
	for i := range conns {
		var c net.Conn
		if err := a.Do(func() (err error) { c, err = d.Dial("tcp", ln.Addr().String()); return }); err != nil {
			t.Fatal(err)
		}
		noteProgress(i)
		seed := [32]byte{byte(i)}
		wdone := make(chan struct{})
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			defer close(wdone)
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			src := rand.NewChaCha8(seed)
			buf := make([]byte, 128<<10)
			for time.Now().Before(stop) {
				n := randSize(rng, len(buf))
				src.Read(buf[:n])
				if _, err := c.Write(buf[:n]); err != nil {
					errs <- fmt.Errorf("conn %d write: %w", i, err)
					return
				}
				written[i].Add(int64(n))
				noteProgress(i)
				pause(rng)
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
		}()
		go func() { // reader: checks the echo against the same stream
			defer wg.Done()
			defer c.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			want := rand.NewChaCha8(seed)
			buf := make([]byte, 128<<10)
			exp := make([]byte, len(buf))
			var total int64
			for {
				n, err := c.Read(buf[:randSize(rng, len(buf))])
				if n > 0 {
					want.Read(exp[:n])
					if !bytes.Equal(buf[:n], exp[:n]) {
						errs <- fmt.Errorf("conn %d: echo differs from what was sent at byte %d+%d", i, total, firstDiff(buf[:n], exp[:n]))
						return
					}
					total += int64(n)
					moved[i].Store(total)
					noteProgress(i)
				}
				if errors.Is(err, io.EOF) {
					<-wdone
					if total != written[i].Load() {
						var sr int64 = -1
						if v, ok := serverRead.Load(c.LocalAddr().String()); ok {
							sr = v.(*atomic.Int64).Load()
						}
						errs <- fmt.Errorf("conn %d (%v): %d bytes came back of %d sent; the server read %d\na: %s\nb: %s", i, c.LocalAddr(), total, written[i].Load(), sr, sa.Dump(), sb.Dump())
					}
					return
				}
				if err != nil {
					errs <- fmt.Errorf("conn %d read: %w", i, err)
					return
				}
				pause(rng)
			}
		}()
	}

	beatGaps := &beat.gaps
	// The watchdog. A stall longer than stallAfter (beyond the process's
	// own stalls) is a suspect until its connection moves again, or for
	// at most a second: a goroutine that was runnable all along, in a Go
	// scheduler with more runnable goroutines than processors, is only
	// known to have waited once it runs (the runtime's
	// /sched/latencies:seconds records how long it waited, then). A stall
	// the scheduler's longest wait in it explains is the machine's, as is
	// one a softirq thread's wait for its CPU, or a CPU stolen by the
	// hypervisor, explains (machineWaits, as in the ping-pong below: the
	// frames wait in the kernel then, not in a ring nobody looks at); a
	// lost wake-up leaves the goroutine parked, not runnable, waiting for
	// a timer to rescue it, and none of these explain it.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tick := time.NewTicker(stallAfter / 5)
	defer tick.Stop()
	deadline := stop.Add(time.Minute)
	var sched schedWaits
	var machine machineWaits
	suspect := make([]suspectStall, conns)
	for {
		select {
		case err := <-errs:
			t.Fatal(err)
		case <-finished:
			var sum int64
			for i := range moved {
				sum += moved[i].Load()
			}
			t.Logf("%d connections for %v: %d MiB echoed; the process's own stalls %v in all; sleeper a %+v, b %+v",
				conns, dur, sum>>20, time.Duration(stalled.Load()).Round(time.Millisecond), sa.Sleeper().Stats(), sb.Sleeper().Stats())
			return
		case now := <-tick.C:
			sched.sample(now)
			machine.sample(now)
			for i := range progress {
				// Read moved after progress: a connection whose last byte
				// came back just now is not taken for one waiting.
				last := progress[i].Load()
				out := written[i].Load() - moved[i].Load()
				idle := now.Sub(time.Unix(0, last))
				own := time.Duration(stalled.Load() - stalledAt[i].Load())
				sus := &suspect[i]
				if sus.last != 0 && sus.last != last {
					// The suspect stall ended: judge it whole, with the
					// process's own stalls up to the progress that ended
					// it, not only up to its detection.
					stall := time.Duration(last - sus.last)
					ownAll := time.Duration(stalledAt[i].Load() - sus.stalled)
					waited := sched.longest(sus.last)
					kept := machine.kept(sus.last, &beat.poll)
					if stall-max(ownAll, waited, kept.most()) > stallAfter {
						t.Logf("%s", sus.dumps)
						flight()
						t.Fatalf("conn %d made no progress for %v (in it the process's own stalls %v, the longest wait of a runnable goroutine %v, %v): a lost wake-up (the stacks' dumps are above; at its detection %s)",
							i, stall.Round(time.Millisecond), ownAll.Round(time.Millisecond), waited.Round(time.Millisecond), kept, sus.brief)
					}
					t.Logf("conn %d waited %v (in it the process's own stalls %v, the longest wait of a runnable goroutine %v, %v): not a lost wake-up",
						i, stall.Round(time.Millisecond), ownAll.Round(time.Millisecond), waited.Round(time.Millisecond), kept)
					sus.last = 0
				}
				if out > 0 && idle-own > stallAfter && sus.last == 0 {
					// Whether the others moved meanwhile, and how late a 1ms
					// sleep has woken: a stall of the whole process (the
					// machine's) shows in both.
					var b strings.Builder
					fmt.Fprintf(&b, "conn %d stalled with %d bytes outstanding (after %d echoed); the process's own stalls (1ms sleeps woken late): over 5ms %d, over 20ms %d, over 80ms %d, over 320ms %d\n",
						i, out, moved[i].Load(), beatGaps[0].Load(), beatGaps[1].Load(), beatGaps[2].Load(), beatGaps[3].Load())
					for j := range progress {
						fmt.Fprintf(&b, "conn %d: last progress %v ago, %d bytes outstanding\n", j, now.Sub(time.Unix(0, progress[j].Load())).Round(time.Millisecond), written[j].Load()-moved[j].Load())
					}
					da, db := sa.Dump(), sb.Dump()
					fmt.Fprintf(&b, "a: %s\nb: %s", da, db)
					*sus = suspectStall{last, stalledAt[i].Load(), b.String(), fmt.Sprintf("a: %s; b: %s", dumpBrief(da), dumpBrief(db))}
				}
				if sus.last != 0 && idle > time.Second {
					// The dumps first, the verdict last: a CI log's tail
					// shows the verdict.
					t.Logf("%s", sus.dumps)
					flight()
					t.Fatalf("conn %d made no progress for %v (%v of it the process's own stalls) with %d bytes outstanding (after %d echoed): a lost wake-up (the stacks' dumps are above; at its detection %s)",
						i, idle.Round(time.Millisecond), own.Round(time.Millisecond), out, moved[i].Load(), sus.brief)
				}
			}
			if now.After(deadline) {
				t.Fatal("connections did not finish a minute after the end")
			}
		}
	}
}

// startFlight, with ONLOAD_STRESS_TRACE set to a file's path, keeps the
// last seconds of the Go runtime's execution trace (a flight recorder),
// and returns a function that writes them to that file, once: at a
// suspect stall, to see which goroutines ran, waited or were runnable
// in it (go tool trace). Without it, nothing.
func startFlight(t *testing.T) func() {
	path := os.Getenv("ONLOAD_STRESS_TRACE")
	if path == "" {
		return func() {}
	}
	fr := trace.NewFlightRecorder(trace.FlightRecorderConfig{MinAge: 2 * time.Second, MaxBytes: 256 << 20})
	if err := fr.Start(); err != nil {
		t.Fatalf("flight recorder: %v", err)
	}
	t.Cleanup(fr.Stop)
	var once sync.Once
	return func() {
		once.Do(func() {
			f, err := os.Create(path)
			if err != nil {
				t.Errorf("flight recorder: %v", err)
				return
			}
			defer f.Close()
			if _, err := fr.WriteTo(f); err != nil {
				t.Errorf("flight recorder: %v", err)
			}
			t.Logf("the execution trace of the last seconds is in %s", path)
		})
	}
}

// randSize is mostly small, sometimes up to max.
func randSize(rng *rand.Rand, max int) int {
	switch rng.IntN(4) {
	case 0:
		return 1 + rng.IntN(16)
	case 1:
		return 1 + rng.IntN(1500)
	case 2:
		return 1 + rng.IntN(16<<10)
	}
	return 1 + rng.IntN(max)
}

// pause sleeps, now and then, long enough for the spin to end and the
// goroutine to park.
func pause(rng *rand.Rand) {
	if rng.IntN(8) == 0 {
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
}

// TestNoLostWakeupPingPong hunts the one interleaving that loses a
// wake-up: the steering program sees a stack's armed flag clear, a frame
// is redirected, the stack's Sleeper arms and finds the ring empty (the
// driver flushes the frame into it only at the end of its batch), and
// sleeps. One connection, so that no other traffic rescues the frame:
// host A's stack spins (its replies go out microseconds after a response
// arrives), host B's does not (every message must wake it), and A waits
// a random 0-30µs before each request so that requests land all over
// B's arm-and-sleep sequence. A frame left in B's ring would wait for a
// timer: B's delayed ACK is put off to 500ms, so that A's tail loss
// probe (40ms for one segment in flight; 200ms once a needless probe has
// shown A that B delays its ACK) or its retransmission timeout comes
// first. On this clean path the test allows no round trip over
// stallAfter that neither the process's own stalls (heartbeat), the Go
// scheduler's waits nor the machine's (machineWaits: a CPU stolen, a
// softirq thread or one of the process's threads kept waiting for a
// CPU) explain, ten a minute over a fifth of
// that, and one retransmission a minute (below). (With the wake event
// alone and no readiness, a 30-second run saw about 260 round trips of
// 18-38ms, rescued by B's delayed ACK timer before it was put off; with
// readiness, none over 15ms.) A minute, 3s with -short.
func TestNoLostWakeupPingPong(t *testing.T) {
	RequireRoot(t)
	dur := stressDuration(time.Minute, 3*time.Second)
	a, b := Pair(t, LinkOptions{})
	fast, _ := sockets.DefaultConfig(sockets.Latency)
	sleepy, _ := sockets.DefaultConfig(sockets.Balanced)
	sleepy.Spin = 0
	sleepy.DelayedAck = 500 * time.Millisecond
	sa := ourSocketsConfig(t, a, fast)
	sb := ourSocketsConfig(t, b, sleepy)

	ln := listenOurs(t, b, sb)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	var c net.Conn
	d := sockets.Dialer{Stack: sa}
	if err := a.Do(func() (err error) { c, err = d.Dial("tcp", ln.Addr().String()); return }); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := sa.Engine().Counters()
	beforeB := sb.Engine().Counters()
	rng := rand.New(rand.NewPCG(7, 7))
	msg, buf := make([]byte, 64), make([]byte, 64)
	var n, forgiven, rescued int
	var worst time.Duration
	rescueAfter := stallAfter / 5
	// A watchdog takes both stacks' dumps while a round trip is slow (over
	// 20ms), so that a failure shows the stall as it was: whether the
	// request waited in B's ring with B's Sleeper armed, or elsewhere. The
	// dumps taken after it show only that it ended.
	type stallDump struct {
		start int64 // the round trip's, UnixNano
		text  string
	}
	var inFlight atomic.Int64 // the current round trip's start, UnixNano (0: none)
	var during atomic.Pointer[stallDump]
	watchdogDone := make(chan struct{})
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-watchdogDone:
				return
			case now := <-tick.C:
				st := inFlight.Load()
				if d := during.Load(); st == 0 || d != nil && d.start == st || now.Sub(time.Unix(0, st)) < 20*time.Millisecond {
					continue
				}
				during.Store(&stallDump{st, fmt.Sprintf("after %v:\na: %s\nb: %s", now.Sub(time.Unix(0, st)).Round(time.Millisecond), sa.Dump(), sb.Dump())})
			}
		}
	}()
	defer close(watchdogDone)
	// The Go scheduler's waits, sampled every millisecond at most (as in
	// stress): a slow round trip that a runnable goroutine's wait in it
	// explains is the machine's.
	var sched schedWaits
	var machine machineWaits
	// The process's own stalls: B's stack shares this process's Go
	// runtime with A's spinner, and a runtime that looks at its network
	// poller late (where B's interrupt arrives) looks at its timers late
	// too (both wait in the same place): a heartbeat's sleeps show it.
	// Without the heartbeat, one round trip in a few hundred thousand
	// took 55-62ms, in CI and by hand, at this commit and before it; the
	// stacks' dumps during one showed the request in B's RX ring, the
	// kernel's readiness set readable, the readiness goroutine not woken,
	// and the watchdog's own 5ms ticker 16ms late: the runtime had looked
	// at neither its poller nor its timers (A's spinner kept its
	// processors busy, and a processor whose run queue is never empty
	// does not poll the network). With the heartbeat's 1ms sleeps, which
	// keep the runtime looking, none in 10 runs. It stops a second after
	// the round trips, not to disturb the tests after this one.
	beat := startHeartbeat(t, time.Now().Add(dur+time.Second))
	sampled := time.Now()
	sched.sample(sampled)
	machine.sample(sampled)
	machineSampled := sampled
	for end := time.Now().Add(dur); time.Now().Before(end); n++ {
		for wait := time.Now().Add(time.Duration(rng.IntN(30_000))); time.Now().Before(wait); {
		}
		binary.BigEndian.PutUint64(msg, uint64(n))
		start := time.Now()
		lateAt := beat.late.Load()
		inFlight.Store(start.UnixNano())
		c.SetDeadline(start.Add(10 * time.Second))
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("round trip %d: write: %v", n, err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatalf("round trip %d: read: %v", n, err)
		}
		inFlight.Store(0)
		if !bytes.Equal(buf, msg) {
			t.Fatalf("round trip %d: the echo differs", n)
		}
		now := time.Now()
		rtt := now.Sub(start)
		worst = max(worst, rtt)
		if rtt > rescueAfter {
			before := sampled
			sched.sample(now)
			machine.sample(now)
			sampled, machineSampled = now, now
			waited := sched.longest(before.UnixNano())
			kept := machine.kept(start.UnixNano(), &beat.poll)
			own := time.Duration(beat.late.Load() - lateAt)
			explained := max(waited, kept.most(), own)
			if rtt <= stallAfter {
				if rtt-explained > rescueAfter {
					rescued++
				}
				continue
			}
			if rtt-explained > stallAfter {
				if d := during.Load(); d != nil && d.start == start.UnixNano() {
					t.Logf("the stacks during the round trip, %s", d.text)
				}
				t.Fatalf("round trip %d took %v (in it the process's own stalls %v, the longest wait of a runnable goroutine %v, %v): a lost wake-up (the stacks during it are above)\nafter it:\na: %s\nb: %s",
					n, rtt.Round(time.Millisecond), own.Round(time.Millisecond), waited.Round(time.Millisecond), kept, sa.Dump(), sb.Dump())
			} else {
				forgiven++
				t.Logf("round trip %d took %v: the process's own stalls %v, the longest wait of a runnable goroutine %v, %v: the machine's, not a lost wake-up",
					n, rtt.Round(time.Millisecond), own.Round(time.Millisecond), waited.Round(time.Millisecond), kept)
			}
		} else {
			if now.Sub(sampled) > time.Millisecond {
				sched.sample(now)
				sampled = now
			}
			if now.Sub(machineSampled) > 10*time.Millisecond {
				machine.sample(now)
				machineSampled = now
			}
		}
	}
	after, afterB := sa.Engine().Counters(), sb.Engine().Counters()
	t.Logf("%d round trips in %v, the slowest %v (%d over %v the machine's; %d over %v it does not explain); B's sleeper %+v",
		n, dur, worst.Round(time.Microsecond), forgiven, stallAfter, rescued, rescueAfter, sb.Sleeper().Stats())
	// One retransmission a minute is allowed, and one in a shorter run:
	// this VM's scheduler alone now and then keeps a process off its CPU
	// for longer than A's tail loss probe waits (40ms; one such run in
	// about ten, its slowest round trip 42ms, under stallAfter; the 3s
	// run under the race detector met one too, its slowest round trip
	// 45ms). A lost wake-up gave dozens (17 in 30 seconds with the wake
	// event alone), and the minute's run still allows one. But after one
	// needless probe A allows B 200ms for a lone segment (tfPeerDelAck in
	// the stack), and B's own timers rescue a lost wake-up first: the
	// round trips over rescueAfter that the machine does not explain
	// count them instead. Clean runs had 1 a minute; with one readiness
	// signal in 200 dropped on purpose, 1,231 (and no retransmission
	// beyond the one allowed, the slowest round trip 45ms).
	if allowedRescued := 10 * max(1, int(dur/time.Minute)); rescued > allowedRescued {
		t.Errorf("%d round trips took over %v that neither the process's own stalls, the Go scheduler, the network poller, a thread's wait for a CPU nor the hypervisor explain (%d allowed): frames waited in a ring until a timer rescued them",
			rescued, rescueAfter, allowedRescued)
	}
	allowed := max(1, uint64(dur/time.Minute))
	if r := after.TCPRetransmits - before.TCPRetransmits + afterB.TCPRetransmits - beforeB.TCPRetransmits; r > allowed {
		t.Errorf("%d segments were retransmitted on a path that loses nothing (tail loss probes %d, timeouts %d; %d allowed for the machine's own stalls): a frame waited in a ring until a timer rescued it",
			r, after.TCPTLPs-before.TCPTLPs+afterB.TCPTLPs-beforeB.TCPTLPs, after.TCPRTOs-before.TCPRTOs+afterB.TCPRTOs-beforeB.TCPRTOs, allowed)
	}
	if irqs := sb.Sleeper().Stats().IRQs; irqs < uint64(n)/2 {
		t.Errorf("B's stack was woken by its interrupt %d times in %d round trips: the test did not exercise the wake path", irqs, n)
	}
}
