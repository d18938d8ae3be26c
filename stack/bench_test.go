package stack_test

import (
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// BenchmarkPollIdle is the cost of one poll that finds nothing to do: the
// busy-poll loop's period.
func BenchmarkPollIdle(b *testing.B) {
	s, _, _ := memPair(&testing.T{}, vnic.MemConfig{})
	for b.Loop() {
		s.Poll()
	}
}

// BenchmarkPingPong is the CPU cost of one 64-byte round trip through two
// of our stacks (both in this goroutine, over the in-memory wire): send,
// receive, echo, receive.
func BenchmarkPingPong(b *testing.B) {
	t := &testing.T{}
	// A wire whose clock stands still: the wire's own timekeeping (for
	// delays it does not apply here) stays out of the figure.
	a, c := twoStacks(t, vnic.MemConfig{Now: func() time.Duration { return 0 }})
	poll := pollBoth(a, c)
	ca, cb := connectPair(t, a, c, poll)
	a.SetOption(ca, stack.NoDelay, 1)
	c.SetOption(cb, stack.NoDelay, 1)
	msg := make([]byte, 64)
	buf := make([]byte, 4096)
	for b.Loop() {
		a.Send(ca, msg)
		c.Poll()
		n, _ := c.Recv(cb, buf, false)
		c.Send(cb, buf[:n])
		a.Poll()
		a.Recv(ca, buf, false)
	}
}
