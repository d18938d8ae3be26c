package bpf

import (
	"fmt"
	"strings"
)

// Counter indices, in the order of enum counter in steer.c.
const (
	CounterRX               = iota // frames seen
	CounterRedirectFlow            // redirected by a flow entry
	CounterRedirectListener        // redirected by a listener entry
	CounterPassNotIPv4             // ARP, IPv6, other ethertypes
	CounterPassVLAN                // 802.1Q / 802.1ad tagged
	CounterPassNotUnicast          // broadcast or multicast destination MAC
	CounterPassOtherProto          // ICMP and every protocol but TCP and UDP
	CounterPassFragment            // IPv4 fragments
	CounterPassMalformed           // truncated or inconsistent headers
	CounterPassNoMatch             // TCP/UDP with no flow or listener entry
	CounterPassBadEntry            // an entry names a stack id out of range
	CounterDropNoXSK               // matched, but no socket for that stack and queue
	CounterWakeup                  // wake events posted
	CounterWakeupLost              // wake events lost: ring buffer full
	CounterPassKernelFlow          // a listener's port, but a connection of the kernel's
	CounterRedirectLane            // of the redirected frames, those that went to a lane
	CounterPassFull                // a SYN for a listener of a stack whose socket table is full
	CounterPassNoMember            // a cluster's port, on a queue no member stack has
	CounterDropHeld                // a SYN for a cluster's port, on a queue held for its member (SetClusterHeld)
	NumCounters
)

var counterNames = [NumCounters]string{
	"rx", "redirect_flow", "redirect_listener",
	"pass_not_ipv4", "pass_vlan", "pass_not_unicast", "pass_other_proto",
	"pass_fragment", "pass_malformed", "pass_no_match", "pass_bad_entry",
	"drop_no_xsk", "wakeup", "wakeup_lost", "pass_kernel_flow", "redirect_lane",
	"pass_full", "pass_no_member", "drop_held",
}

// CounterName is the snake_case name of counter i, as shown in metrics.
func CounterName(i int) string {
	if i < 0 || i >= NumCounters {
		return fmt.Sprintf("counter_%d", i)
	}
	return counterNames[i]
}

// Counters are the program's counters summed over CPUs.
type Counters [NumCounters]uint64

// Redirected is the number of frames sent to a stack.
func (c Counters) Redirected() uint64 { return c[CounterRedirectFlow] + c[CounterRedirectListener] }

// Passed is the number of frames left to the kernel.
func (c Counters) Passed() uint64 {
	var n uint64
	for i := CounterPassNotIPv4; i <= CounterPassBadEntry; i++ {
		n += c[i]
	}
	return n
}

// Dropped is the number of frames dropped.
func (c Counters) Dropped() uint64 { return c[CounterDropNoXSK] }

// Sub returns c - old, counter by counter.
func (c Counters) Sub(old Counters) Counters {
	for i := range c {
		c[i] -= old[i]
	}
	return c
}

// String lists the non-zero counters, "name=value" separated by spaces.
func (c Counters) String() string {
	var b strings.Builder
	for i, v := range c {
		if v == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", counterNames[i], v)
	}
	if b.Len() == 0 {
		return "(all zero)"
	}
	return b.String()
}

// Counters reads the program's counters.
func (s *Steering) Counters() (Counters, error) {
	var c Counters
	var perCPU []uint64
	for i := range c {
		if err := s.objs.Counters.Lookup(uint32(i), &perCPU); err != nil {
			return c, fmt.Errorf("read counter %s: %w", counterNames[i], err)
		}
		for _, v := range perCPU {
			c[i] += v
		}
	}
	return c, nil
}
