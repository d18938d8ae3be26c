package daemon

import (
	"strings"
	"testing"
)

// TestSteeringFor: how onloadd steers a port's frames to its stack's
// queue, by what the interface offers.
func TestSteeringFor(t *testing.T) {
	for _, c := range []struct {
		driver string
		queues int
		ntuple bool
		want   steering
	}{
		{"veth", 1, false, steerOneQueue},
		{"mlx5_core", 1, true, steerOneQueue},
		{"mlx5_core", 8, true, steerNtuple},
		{"veth", 2, false, steerSender},
		{"veth", 2, true, steerNtuple},
		{"virtio_net", 4, false, steerNone},
		{"", 4, false, steerNone},
	} {
		if got := steeringFor(c.driver, c.queues, c.ntuple); got != c.want {
			t.Errorf("driver %q, %d queues, n-tuple %v: %v, want %v", c.driver, c.queues, c.ntuple, got, c.want)
		}
	}
}

// TestKernelConnects: the connections a stack's processes open go to the
// kernel where nothing puts a peer's replies on the stack's queue (a veth
// of several queues), and are the stack's elsewhere.
func TestKernelConnects(t *testing.T) {
	for _, c := range []struct {
		steering steering
		queues   int
		kernel   bool
	}{
		{steerOneQueue, 1, false},
		{steerNtuple, 8, false},
		{steerSender, 2, true},
		{steerNone, 1, false}, // one stack on queue 0: onloadd warns at attach
	} {
		s := &dstack{id: 3, queue: 1, ifc: &iface{name: "vA", steering: c.steering, queues: make([]*dstack, c.queues)}}
		got := s.kernelConnects()
		if (got != "") != c.kernel {
			t.Errorf("%v, %d queues: kernel connects %q, want kernel %v", c.steering, c.queues, got, c.kernel)
		}
		if c.kernel && !strings.Contains(got, "vA has 2 receive queues") {
			t.Errorf("%v: %q does not name the interface and its queues", c.steering, got)
		}
	}
}
