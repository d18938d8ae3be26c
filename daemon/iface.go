package daemon

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/ethtool"
	"github.com/xdp-onload/onload/xdp"
)

// iface is an interface onloadd serves: the steering program attached to
// it, its maps, and which stack has each of its queues (the kernel binds
// one UMEM to a queue).
type iface struct {
	name     string
	steer    *bpf.Steering
	att      *xdp.Attachment
	queues   []*dstack // by queue; nil: free
	steering steering  // how a port's frames reach its stack's queue
	// filters: every port steered on the interface, whichever stack has
	// it, so that no two stacks claim one.
	filters map[bpf.Listener]*filter
}

// steering is how the frames of a port reach the queue of the stack that
// has it. The steering program can only hand a frame to the AF_XDP
// socket of the queue it arrived on, so with several queues something
// before it must put each flow on the right one.
type steering int

const (
	steerOneQueue steering = iota // one queue: every frame arrives on it
	steerNtuple                   // an n-tuple rule per filter (ethtool -N), installed by onloadd
	steerSender                   // veth: a frame arrives on the queue its sender sent it from
	steerNone                     // several queues, no way to steer: one stack, on queue 0
)

func (m steering) String() string {
	return [...]string{"one queue", "n-tuple rules", "the sender's queue (veth)", "none"}[m]
}

// steeringFor decides how an interface with queues receive queues, whose
// driver is driver and whose n-tuple filters are on or not, is steered.
func steeringFor(driver string, queues int, ntuple bool) steering {
	switch {
	case queues <= 1:
		return steerOneQueue
	case ntuple:
		return steerNtuple
	case driver == "veth":
		// The receive queue of a veth frame is the transmit queue its
		// sender used: the test hosts pick it per port (test.QueueSteer).
		return steerSender
	}
	return steerNone
}

// ifaceLocked returns the interface, attaching the steering program the
// first time a stack is asked for on it.
func (d *Daemon) ifaceLocked(name string) (*iface, error) {
	if ifc := d.ifaces[name]; ifc != nil {
		return ifc, nil
	}
	if len(d.cfg.Interfaces) > 0 && !slices.Contains(d.cfg.Interfaces, name) {
		return nil, refuse(codeUnavailable, "onloadd does not serve interface %s (it serves %s)", name, strings.Join(d.cfg.Interfaces, ", "))
	}
	if _, err := net.InterfaceByName(name); err != nil {
		return nil, refuse(codeUnavailable, "no interface %s in onloadd's network namespace (see ip link)", name)
	}
	n := rxQueues(name)
	driver, _ := ethtool.Driver(name)
	ntuple, _ := ethtool.NtupleOn(name)
	mode := steeringFor(driver, n, ntuple)
	if mode == steerNone {
		d.log.Warn(fmt.Sprintf("interface %s has %d receive queues and its driver (%s) cannot steer a flow to one of them "+
			"(no n-tuple filters; if the driver has them, ethtool -K %s ntuple on): one stack serves it, on queue 0, "+
			"and frames the NIC's hashing puts on other queues go to the kernel (ethtool -X %s equal 1 puts them all on queue 0)",
			name, n, driver, name, name), "interface", name)
		n = 1
	}
	steer, err := bpf.Load()
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	att, err := xdp.Attach(steer.Program(), name, xdp.AttachAuto)
	if err != nil {
		steer.Close()
		return nil, fmt.Errorf("interface %s: %w", name, err)
	}
	ifc := &iface{name: name, steer: steer, att: att, queues: make([]*dstack, n), steering: mode, filters: map[bpf.Listener]*filter{}}
	d.ifaces[name] = ifc
	d.log.Info("interface attached", "interface", name, "queues", n, "attach", att.Mode.String(), "driver", driver, "steering", mode.String())
	return ifc, nil
}

// rxQueues is how many receive queues the interface uses now (at least
// one).
func rxQueues(name string) int {
	if n, err := ethtool.RxQueues(name); err == nil && n > 0 {
		return min(n, bpf.MaxQueues)
	}
	return 1
}

// freeQueue is a queue no stack has, or -1.
func (ifc *iface) freeQueue() int {
	for q, s := range ifc.queues {
		if s == nil {
			return q
		}
	}
	return -1
}

// holders describes who has the interface's queues, for a refusal.
func (ifc *iface) holders() string {
	var b []string
	for q, s := range ifc.queues {
		if s != nil {
			b = append(b, fmt.Sprintf("queue %d: stack %d (%s)", q, s.id, s.clientNames()))
		}
	}
	return strings.Join(b, "; ")
}

// close removes the filters and detaches the program.
func (ifc *iface) close() error {
	return errors.Join(ifc.att.Close(), ifc.steer.Close())
}
