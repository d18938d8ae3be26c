package interrupts_test

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdp-onload/onload/interrupts"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// The Sleeper is tested with the real engine over an in-memory wire: the
// goroutines here never poll; only the Sleepers do.

var (
	addrA = netip.MustParsePrefix("198.18.0.1/24")
	addrB = netip.MustParsePrefix("198.18.0.2/24")
)

// end is one stack with its Sleeper and a record of the wake-ups it gave.
type end struct {
	nic *vnic.Mem
	st  *stack.Stack
	sl  *interrupts.Sleeper
	mu  sync.Mutex
	ch  map[stack.SockID]chan struct{}
	// peer describes the other end when a wait fails.
	peer func() string
}

func (e *end) wake(id stack.SockID) {
	e.mu.Lock()
	if c, ok := e.ch[id]; ok {
		close(c)
		delete(e.ch, id)
	}
	e.mu.Unlock()
}

// wait parks, as the sockets package does, until id is ready for want or
// the timeout passes.
func (e *end) wait(t *testing.T, id stack.SockID, want stack.Events, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		c := make(chan struct{})
		e.mu.Lock()
		e.ch[id] = c
		e.mu.Unlock()
		if ev := e.st.WaitFor(id, want); ev&want != 0 {
			return
		}
		e.sl.Park(false)
		select {
		case <-c:
			e.sl.Unpark()
		case <-deadline:
			e.sl.Unpark()
			var peer string
			if e.peer != nil {
				peer = e.peer()
			}
			t.Fatalf("not woken within %v: %s\nsleeper %+v\npeer: %s", timeout, e.st.DumpSocket(id), e.sl.Stats(), peer)
		}
	}
}

// udpPair is a UDP socket on b bound to port 7000 (rx) and an unbound
// one on a to send to it (tx).
func udpPair(t *testing.T, a, b *end) (rx, tx stack.SockID) {
	t.Helper()
	rx, _ = b.st.Open(stack.UDP)
	if err := b.st.Bind(rx, netip.AddrPortFrom(netip.Addr{}, 7000)); err != nil {
		t.Fatal(err)
	}
	tx, _ = a.st.Open(stack.UDP)
	return rx, tx
}

func pair(t *testing.T, mc vnic.MemConfig) (a, b *end) {
	t.Helper()
	return pairWith(t, mc, interrupts.Policy{})
}

// waiters runs a test with the Sleepers sleeping in the Go scheduler and
// on threads of their own (Policy.Thread; the in-memory NIC's interrupt
// reaches them through an eventfd).
func waiters(t *testing.T, test func(*testing.T, interrupts.Policy)) {
	for _, thread := range []bool{false, true} {
		name := "goroutine"
		if thread {
			name = "thread"
		}
		t.Run(name, func(t *testing.T) { test(t, interrupts.Policy{Thread: thread}) })
	}
}

// pairWith is pair with the Sleepers' policy.
func pairWith(t *testing.T, mc vnic.MemConfig, pol interrupts.Policy) (a, b *end) {
	t.Helper()
	na, nb, err := vnic.NewMemPair(mc)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(nic, peer *vnic.Mem, me, them netip.Prefix) *end {
		e := &end{nic: nic, ch: map[stack.SockID]chan struct{}{}}
		st, err := stack.New(nic, stack.Config{Addr: me, MAC: nic.Info().MAC, MinRTO: 20 * time.Millisecond}, stack.Options{
			Neighbours: map[netip.Addr]net.HardwareAddr{them.Addr(): peer.Info().MAC},
			Wake:       e.wake,
		})
		if err != nil {
			t.Fatal(err)
		}
		e.st = st
		if e.sl, err = interrupts.Start(st, interrupts.Mem(nic), pol); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			e.sl.Stop()
			st.Destroy()
		})
		return e
	}
	return mk(na, nb, addrA, addrB), mk(nb, na, addrB, addrA)
}

// TestSleeperArmsWhenIdle checks an idle stack is left alone: the Sleeper
// arms and stops polling.
func TestSleeperArmsWhenIdle(t *testing.T) { waiters(t, testSleeperArmsWhenIdle) }

func testSleeperArmsWhenIdle(t *testing.T, pol interrupts.Policy) {
	a, _ := pairWith(t, vnic.MemConfig{}, pol)
	time.Sleep(50 * time.Millisecond)
	before := a.sl.Stats()
	time.Sleep(200 * time.Millisecond)
	after := a.sl.Stats()
	if !a.sl.Armed() || before.Arms == 0 {
		t.Fatalf("idle Sleeper not armed: %+v", after)
	}
	if after.Polls != before.Polls {
		t.Errorf("idle Sleeper polled %d times in 200ms", after.Polls-before.Polls)
	}
}

// TestSleeperWakesOnArrival parks a goroutine on a UDP socket; a datagram
// from the peer must wake it through the interrupt.
func TestSleeperWakesOnArrival(t *testing.T) { waiters(t, testSleeperWakesOnArrival) }

func testSleeperWakesOnArrival(t *testing.T, pol interrupts.Policy) {
	a, b := pairWith(t, vnic.MemConfig{}, pol)
	rx, tx := udpPair(t, a, b)
	time.Sleep(20 * time.Millisecond) // both Sleepers armed
	irqs := b.sl.Stats().IRQs
	go func() {
		time.Sleep(20 * time.Millisecond)
		a.st.SendTo(tx, []byte("wake up"), netip.AddrPortFrom(addrB.Addr(), 7000))
	}()
	b.wait(t, rx, stack.Readable, 2*time.Second)
	buf := make([]byte, 64)
	n, _, err := b.st.RecvFrom(rx, buf, false)
	if err != nil || string(buf[:n]) != "wake up" {
		t.Fatalf("recv: %q %v", buf[:n], err)
	}
	if b.sl.Stats().IRQs == irqs {
		t.Error("woken without an interrupt")
	}
}

// TestTimersFireWhileAsleep moves data over a lossy wire with both sides
// asleep: the first flight is lost whole, so that only the retransmission
// timer, run by the sender's Sleeper, can recover it, and the rest goes
// through 30% loss. The handshake runs on a clean wire: a lost SYN-ACK,
// resent by the server's timer, would give the client an honest
// one-second sample and RTOs of seconds.
func TestTimersFireWhileAsleep(t *testing.T) { waiters(t, testTimersFireWhileAsleep) }

func testTimersFireWhileAsleep(t *testing.T, pol interrupts.Policy) {
	a, b := pairWith(t, vnic.MemConfig{Seed: 7}, pol)
	l, _ := b.st.Open(stack.TCP)
	b.st.Bind(l, netip.AddrPortFrom(netip.Addr{}, 80))
	b.st.Listen(l, 0)
	c, _ := a.st.Open(stack.TCP)
	if err := a.st.Connect(c, netip.AddrPortFrom(addrB.Addr(), 80)); !errors.Is(err, stack.ErrInProgress) {
		t.Fatal(err)
	}
	a.sl.TimerSet(a.st.EarliestTimer()) // the SYN's timer: see below
	a.wait(t, c, stack.Writable, 10*time.Second)
	b.wait(t, l, stack.Readable, 10*time.Second)
	s, err := b.st.Accept(l)
	if err != nil {
		t.Fatal(err)
	}
	// The first flight is lost whole (no ACK comes back to start a fast
	// retransmit: only the retransmission timer, run by a's Sleeper,
	// resends it); then 30% loss each way.
	if err := a.nic.Impair(vnic.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	lossy := vnic.Impairment{Loss: 0.3}
	time.AfterFunc(50*time.Millisecond, func() {
		a.nic.Impair(lossy)
		b.nic.Impair(lossy)
	})
	b.peer = func() string {
		return fmt.Sprintf("%s\nsleeper %+v armed=%v next=%v", a.st.DumpSocket(c), a.sl.Stats(), a.sl.Armed(), fmt.Sprint(a.st.NextTimeout()))
	}
	msg := bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB
	go func() {
		for off := 0; off < len(msg); {
			n, err := a.st.Send(c, msg[off:])
			// As the sockets package does after every call: a timer
			// armed while the Sleeper sleeps must reach it.
			a.sl.TimerSet(a.st.EarliestTimer())
			off += n
			if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
				return
			}
			if err != nil {
				time.Sleep(time.Millisecond)
			}
		}
	}()
	var got []byte
	buf := make([]byte, 8192)
	for len(got) < len(msg) {
		b.wait(t, s, stack.Readable, 20*time.Second)
		for {
			n, err := b.st.Recv(s, buf, false)
			if err != nil {
				break
			}
			got = append(got, buf[:n]...)
		}
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("got %d bytes, not what was sent", len(got))
	}
	// Losses recovered by timers, fired by a Sleeper woken for them: a
	// fast retransmit (an ACK arriving) would prove nothing here.
	if c := a.st.Counters(); c.TCPRTOs+c.TCPTLPs == 0 {
		t.Errorf("no retransmission or probe timer fired (%s): the test proves nothing", &c)
	}
	if st := a.sl.Stats(); st.Timeouts == 0 {
		t.Errorf("the sender's Sleeper never woke for a timer (%+v)", st)
	}
}

// TestSleeperLeavesFramesToDirectThreads: while a thread blocks on the
// interrupt itself (ParkDirect: the LD_PRELOAD shim's threads, which poll
// when the AF_XDP socket turns readable), the Sleeper neither arms the
// interrupt nor takes the frames in, but still runs the timers; once the
// thread has been away for DirectGrace, it attends the stack as before.
func TestSleeperLeavesFramesToDirectThreads(t *testing.T) {
	waiters(t, testSleeperLeavesFramesToDirectThreads)
}

func testSleeperLeavesFramesToDirectThreads(t *testing.T, pol interrupts.Policy) {
	a, b := pairWith(t, vnic.MemConfig{}, pol)
	rx, tx := udpPair(t, a, b)
	send := func(msg string) {
		if _, err := a.st.SendTo(tx, []byte(msg), netip.AddrPortFrom(addrB.Addr(), 7000)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // both Sleepers armed
	buf := make([]byte, 64)
	b.sl.ParkDirect()
	// A frame wakes the Sleeper armed before the thread blocked; it
	// leaves the frame to the thread, which takes it in.
	send("zero")
	time.Sleep(5 * interrupts.DirectGraceForTest)
	b.st.Poll()
	if n, _, err := b.st.RecvFrom(rx, buf, false); err != nil || string(buf[:n]) != "zero" {
		t.Fatalf("recv: %q %v", buf[:n], err)
	}
	time.Sleep(5 * interrupts.DirectGraceForTest)
	// Idle, with the thread blocked: the Sleeper sleeps until a timer or
	// the thread's return, not every grace period.
	idle := b.sl.Stats()
	time.Sleep(30 * interrupts.DirectGraceForTest)
	if st := b.sl.Stats(); st.TimersOnly-idle.TimersOnly > 2 {
		t.Errorf("the Sleeper of an idle stack woke %d times in %v while a thread blocked on the interrupt",
			st.TimersOnly-idle.TimersOnly, 30*interrupts.DirectGraceForTest)
	}
	before := b.sl.Stats()
	send("first")
	time.Sleep(20 * interrupts.DirectGraceForTest)
	after := b.sl.Stats()
	if ev := b.st.WaitFor(rx, stack.Readable); ev&stack.Readable != 0 {
		t.Fatalf("the Sleeper took in a frame while a thread blocked on the interrupt itself: %+v", after)
	}
	// (An interrupt armed before the thread came may fire once.)
	if after.Arms != before.Arms || after.Polls != before.Polls {
		t.Errorf("the Sleeper armed the interrupt or polled while a thread blocked on it: %+v, then %+v", before, after)
	}
	if after.TimersOnly == 0 {
		t.Errorf("the Sleeper did not sleep for the timers alone: %+v", after)
	}
	// The thread wakes and polls, as the shim's does.
	b.st.Poll()
	if ev := b.st.WaitFor(rx, stack.Readable); ev&stack.Readable == 0 {
		t.Fatal("the direct thread's poll did not take the frame in")
	}
	b.st.RecvFrom(rx, buf, false)
	b.sl.UnparkDirect()
	// The thread went away (busy, say): the Sleeper attends the stack
	// again, a grace period after the thread's last poll.
	send("second")
	b.wait(t, rx, stack.Readable, 2*time.Second)
	if n, _, err := b.st.RecvFrom(rx, buf, false); err != nil || string(buf[:n]) != "second" {
		t.Fatalf("recv: %q %v", buf[:n], err)
	}

	// Timers still fire while a thread blocks on the interrupt: a SYN
	// into a wire that loses everything is sent again by a's retransmission
	// timer, which only its Sleeper runs here.
	a.sl.ParkDirect()
	defer a.sl.UnparkDirect()
	if err := a.nic.Impair(vnic.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	c, _ := a.st.Open(stack.TCP)
	if err := a.st.Connect(c, netip.AddrPortFrom(addrB.Addr(), 80)); !errors.Is(err, stack.ErrInProgress) {
		t.Fatal(err)
	}
	a.sl.TimerSet(a.st.EarliestTimer())
	for end := time.Now().Add(5 * time.Second); a.st.Counters().TCPRetransmits == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no retransmission timer fired in 5s while a thread blocked on the interrupt: %+v", a.sl.Stats())
		}
	}
}

// TestSleeperTakesFramesWhenItsOnlyThreadParks: the only thread of a
// process under the shim, which blocks on the interrupt itself while it
// has connections, polls and then parks without the interrupt (its
// epoll set holds a listener alone: redis between connections): the
// Sleeper, asleep for the timers alone because the thread had polled
// within DirectGrace, is woken by the park and takes in the frame that
// comes next at once. Before, the frame (a new connection's SYN) waited
// out the rest of the grace: redis served a connection a request at
// 0.76 ms at the median, against the kernel's 0.05 (a client 0.3 ms
// between connections).
func TestSleeperTakesFramesWhenItsOnlyThreadParks(t *testing.T) {
	waiters(t, testSleeperTakesFramesWhenItsOnlyThreadParks)
}

// oneShimThread is a pair whose b is a process under the shim with one
// thread, which has blocked on the interrupt itself once, and a UDP pair
// from a to b (udpPair).
func oneShimThread(t *testing.T, pol interrupts.Policy) (a, b *end, rx, tx stack.SockID) {
	t.Helper()
	a, b = pairWith(t, vnic.MemConfig{}, pol)
	rx, tx = udpPair(t, a, b)
	b.sl.SetThreads(1)
	b.sl.ParkDirect()
	b.sl.UnparkDirect()
	return a, b, rx, tx
}

func testSleeperTakesFramesWhenItsOnlyThreadParks(t *testing.T, pol interrupts.Policy) {
	a, b, rx, tx := oneShimThread(t, pol)
	buf := make([]byte, 64)
	var took []time.Duration
	for i := range 21 {
		b.st.Poll() // the thread's last poll, then it parks
		b.sl.Park(false)
		start := time.Now()
		if _, err := a.st.SendTo(tx, []byte("syn"), netip.AddrPortFrom(addrB.Addr(), 7000)); err != nil {
			t.Fatal(err)
		}
		for b.st.WaitFor(rx, stack.Readable)&stack.Readable == 0 {
			if time.Since(start) > 2*time.Second {
				t.Fatalf("frame %d not taken in within 2s while the thread was parked: %+v", i, b.sl.Stats())
			}
			runtime.Gosched() // a sleep of Go's may take a millisecond itself
		}
		took = append(took, time.Since(start))
		b.sl.Unpark()
		if _, _, err := b.st.RecvFrom(rx, buf, false); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(i%4) * 100 * time.Microsecond) // the next connection comes later or sooner
	}
	slices.Sort(took)
	if med := took[len(took)/2]; med > interrupts.DirectGraceForTest/3 {
		t.Errorf("a frame that came while the only thread was parked waited %v at the median (each: %v); "+
			"the Sleeper waited out its grace (%v) for a thread that would not come back", med, took, interrupts.DirectGraceForTest)
	}
}

// TestSleeperBacksOffFromAPollingThread: while a thread of a process
// under the shim keeps polling the stack, the Sleeper leaves the stack to
// it and looks less and less often, up to MaxLook apart, whatever timers
// the thread's sends set; once the thread goes away, a frame that comes
// is taken in within MaxLook of the thread's last poll or so. Looking
// every DirectGrace woke the Sleeper's thread a thousand times a second
// under pipelined redis, and every timer the stack armed (TimerSet) woke
// it more.
func TestSleeperBacksOffFromAPollingThread(t *testing.T) {
	waiters(t, testSleeperBacksOffFromAPollingThread)
}

func testSleeperBacksOffFromAPollingThread(t *testing.T, pol interrupts.Policy) {
	a, b, rx, tx := oneShimThread(t, pol)
	buf := make([]byte, 64)
	send := func(msg string) {
		if _, err := a.st.SendTo(tx, []byte(msg), netip.AddrPortFrom(addrB.Addr(), 7000)); err != nil {
			t.Fatal(err)
		}
	}
	// The thread polls every 100 µs for 300 ms, taking in a frame a
	// millisecond, and after each poll tells an armed Sleeper of a timer
	// due in 1 ms, as a send's way out does (sockets.Stack.leave).
	const busy = 300 * time.Millisecond
	before := b.sl.Stats()
	start := time.Now()
	for i := 0; time.Since(start) < busy; i++ {
		if i%10 == 0 {
			send("busy")
		}
		b.st.Poll()
		b.st.RecvFrom(rx, buf, false)
		if b.sl.Armed() {
			b.sl.TimerSet(b.st.Clock() + int64(time.Millisecond))
		}
		// A sleep of Go's may take a millisecond itself.
		for t0 := time.Now(); time.Since(t0) < 100*time.Microsecond; {
			runtime.Gosched()
		}
	}
	after := b.sl.Stats()
	wakes := (after.Timeouts + after.Kicks + after.IRQs) - (before.Timeouts + before.Kicks + before.IRQs)
	// A look every MaxLook is 75 in the 300 ms, and the first looks
	// come sooner; one every DirectGrace, 300.
	if limit := uint64(busy/interrupts.MaxLook) * 2; wakes > limit {
		t.Errorf("the Sleeper woke %d times in %v while a thread polled the stack every 100 µs (at most %d: a look every %v): %+v",
			wakes, busy, limit, interrupts.MaxLook, after)
	}
	// The thread goes away without blocking: the next look finds it gone
	// and the Sleeper takes the frame in.
	b.st.Poll()
	left := time.Now()
	send("gone")
	for b.st.WaitFor(rx, stack.Readable)&stack.Readable == 0 {
		if time.Since(left) > 2*time.Second {
			t.Fatalf("a frame that came after the polling thread went away was not taken in within 2s: %+v", b.sl.Stats())
		}
		time.Sleep(100 * time.Microsecond)
	}
	// The bound is MaxLook and a grace period past the last poll; a
	// loaded machine's wake-ups come later.
	if took := time.Since(left); took > 10*interrupts.MaxLook {
		t.Errorf("a frame that came after the polling thread went away waited %v (a look is at most %v apart): %+v",
			took, interrupts.MaxLook, b.sl.Stats())
	}
}

// tcpPair connects a TCP socket of a's (TCP_NODELAY) to a listener of
// b's on port 80, with the Sleepers alone polling, and accepts.
func tcpPair(t *testing.T, a, b *end) (c, srv stack.SockID) {
	t.Helper()
	l, _ := b.st.Open(stack.TCP)
	if err := b.st.Bind(l, netip.AddrPortFrom(netip.Addr{}, 80)); err != nil {
		t.Fatal(err)
	}
	if err := b.st.Listen(l, 8); err != nil {
		t.Fatal(err)
	}
	c, _ = a.st.Open(stack.TCP)
	a.st.SetOption(c, stack.NoDelay, 1)
	if err := a.st.Connect(c, netip.AddrPortFrom(addrB.Addr(), 80)); !errors.Is(err, stack.ErrInProgress) {
		t.Fatal(err)
	}
	a.wait(t, c, stack.Writable, 2*time.Second)
	b.wait(t, l, stack.Readable, 2*time.Second)
	srv, err := b.st.Accept(l)
	if err != nil {
		t.Fatal(err)
	}
	return c, srv
}

// TestSleeperSendsWhatSendMoreLeft checks the bound on a send whose
// caller owes its kick to a wait it does not come back to: a segment
// SendCorked left waiting (autocorking) goes when the Sleeper's timer, set
// as sockets.Desc.SendMore sets it, comes, though another thread blocks
// on the interrupt itself and the Sleeper sleeps for the timers alone.
func TestSleeperSendsWhatSendMoreLeft(t *testing.T) { waiters(t, testSleeperSendsWhatSendMoreLeft) }

func testSleeperSendsWhatSendMoreLeft(t *testing.T, pol interrupts.Policy) {
	a, b := pairWith(t, vnic.MemConfig{}, pol)
	c, srv := tcpPair(t, a, b)
	// Another thread of a's blocks on the interrupt itself, and stays.
	a.sl.ParkDirect()
	defer a.sl.UnparkDirect()
	time.Sleep(5 * interrupts.DirectGraceForTest)
	if n, err := a.st.SendCorked(c, []byte("hello")); n != 5 || err != nil {
		t.Fatalf("SendCorked: %d, %v", n, err)
	}
	if !a.st.KickOwed() {
		t.Fatal("SendCorked's small segment owes nothing to the sender's next wait")
	}
	if a.sl.Armed() {
		a.sl.TimerSet(a.st.Clock() + int64(time.Millisecond))
	}
	// The sender does not come back to a wait.
	start := time.Now()
	b.wait(t, srv, stack.Readable, 2*time.Second)
	// The bound is a millisecond (sockets' heldKickWait); a timer of the
	// connection's, a second away, sent it before the Sleeper looked.
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("a segment SendCorked left arrived after %v, want within about a millisecond", d)
	}
	buf := make([]byte, 16)
	if n, err := b.st.Recv(srv, buf, false); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("recv: %q, %v", buf[:n], err)
	}
}

// TestSpinSlots checks the spin slots: Policy.Spinners admit that many
// spinners and no more, a slot given back admits the next, a slot given
// back that was never taken does not make room for one more, and a count
// out of bounds is refused.
func TestSpinSlots(t *testing.T) {
	a, _ := pair(t, vnic.MemConfig{})
	if got := a.sl.Policy().Spinners; got != 1 {
		t.Fatalf("default spinners %d, want 1", got)
	}
	if !a.sl.TrySpin() || a.sl.TrySpin() {
		t.Fatal("one slot: want the first TrySpin to succeed and the second to fail")
	}
	a.sl.EndSpin()
	b, _ := pairWith(t, vnic.MemConfig{}, interrupts.Policy{Spinners: 2})
	two := b.sl
	if !two.TrySpin() || !two.TrySpin() || two.TrySpin() {
		t.Fatal("two slots: want two spinners and no third")
	}
	two.EndSpin()
	if !two.Spinning() {
		t.Fatal("one spinner left, but Spinning says none")
	}
	if !two.TrySpin() {
		t.Fatal("a slot given back was not admitted again")
	}
	two.EndSpin()
	two.EndSpin()
	two.EndSpin() // one more than taken
	if two.Spinning() {
		t.Fatal("every slot given back, but Spinning says one is held")
	}
	if !two.TrySpin() || !two.TrySpin() || two.TrySpin() {
		t.Fatal("after an extra EndSpin: want exactly two spinners admitted")
	}
	two.EndSpin()
	two.EndSpin()
	for _, n := range []int{-1, interrupts.MaxSpinners + 1} {
		if _, err := interrupts.Start(nil, nil, interrupts.Policy{Spinners: n}); err == nil {
			t.Errorf("Policy.Spinners %d accepted", n)
		}
	}
}

// TestSleeperSendMoreRacesArm sends a segment that SendCorked leaves for
// its sender's next wait, which the sender never comes back to, at the
// moment the Sleeper, while another thread blocks on the interrupt
// itself, is about to sleep for the timers alone with no bound: the send
// looks at the Sleeper before it says it sleeps, so it sets no timer
// (sockets.Desc.SendMore sets one only on an armed Sleeper). The Sleeper
// must see the owed kick itself and send the segment within its bound;
// it had slept until the blocked thread came back (5s in the shim's
// conformance program, TestShimMixed, whose sender thread then exited).
func TestSleeperSendMoreRacesArm(t *testing.T) { waiters(t, testSleeperSendMoreRacesArm) }

func testSleeperSendMoreRacesArm(t *testing.T, pol interrupts.Policy) {
	a, b := pairWith(t, vnic.MemConfig{}, pol)
	c, srv := tcpPair(t, a, b)
	// Another thread of a's blocks on the interrupt itself, and stays.
	// Woken (a timer due now), the Sleeper leaves the frames to it and
	// sleeps for the timers alone, first for the grace, then, nothing
	// polled meanwhile, without a bound.
	a.sl.ParkDirect()
	defer a.sl.UnparkDirect()
	a.sl.TimerSet(a.st.Clock())
	time.Sleep(5 * interrupts.DirectGraceForTest)
	var fire atomic.Bool
	sent := make(chan error, 1)
	interrupts.SetBeforeTimersOnly(func() {
		if !fire.CompareAndSwap(true, false) {
			return
		}
		n, err := a.st.SendCorked(c, []byte("hello"))
		if err == nil && n != 5 {
			err = fmt.Errorf("sent %d bytes", n)
		}
		if a.sl.Armed() && a.st.KickOwed() { // as sockets.Desc.SendMore
			err = errors.New("the Sleeper says it sleeps before it does")
		}
		sent <- err
	})
	defer interrupts.SetBeforeTimersOnly(nil)
	fire.Store(true)
	// Wake it again, so that it goes back to that sleep.
	a.sl.TimerSet(a.st.Clock())
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("the Sleeper did not go back to sleep for the timers alone: %+v", a.sl.Stats())
	}
	start := time.Now()
	b.wait(t, srv, stack.Readable, 2*time.Second)
	if d := time.Since(start); d > 100*time.Millisecond {
		t.Errorf("the segment arrived after %v, want within about a millisecond (sleeper %+v)", d, a.sl.Stats())
	}
	buf := make([]byte, 16)
	if n, err := b.st.Recv(srv, buf, false); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("recv: %q, %v", buf[:n], err)
	}
}
