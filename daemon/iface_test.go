package daemon

import "testing"

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
