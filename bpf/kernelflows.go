package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The kernel's connections on a listener's port (steer.c, KERNEL_BIT and
// kernel_flows). A listener entry's port can carry connections the
// kernel has: those its kernel half accepted before the stack took the
// port, those it took while the stack was full or a cluster's queue had
// no member, and those handed over to it. The program looks every
// non-SYN segment of a listener entry up in the kernel's socket tables
// for them, and that look-up is the dearest step of a frame's way
// through it. So every entry starts with KERNEL_BIT, which asks for the
// look-up; CheckKernelFlows clears it once it has found no connection of
// the kernel's on the port; and kernel_flows, set by the program when it
// passes a new connection to the kernel and by MarkKernelFlows at a
// handover, asks for the look-up on every entry from then on.

const kernelBit = 0x40000000 // KERNEL_BIT in steer.c

// KernelFlowsGrace is the wait CheckKernelFlows's callers give: the
// segments the program passed to the kernel before an entry was made
// are in the kernel's tables well within it.
const KernelFlowsGrace = 50 * time.Millisecond

// MarkKernelFlows records that the kernel now has, or is about to have,
// a connection on a port that a listener entry steers (a handover): the
// program looks every listener entry's non-SYN segments up in the
// kernel's tables from then on.
func (s *Steering) MarkKernelFlows() error {
	if err := s.objs.KernelFlows.Put(uint32(0), uint32(1)); err != nil {
		return fmt.Errorf("mark the kernel's flows on listener ports: %w", err)
	}
	return nil
}

// KernelFlowsMarked reports whether MarkKernelFlows, or the program, has
// recorded a connection of the kernel's on a listener entry's port.
func (s *Steering) KernelFlowsMarked() (bool, error) {
	var v uint32
	if err := s.objs.KernelFlows.Lookup(uint32(0), &v); err != nil {
		return false, fmt.Errorf("read the kernel's flows mark: %w", err)
	}
	return v != 0, nil
}

// CheckKernelFlows clears l's KERNEL_BIT if, after grace, the kernel has
// no TCP socket on l's address and port but in LISTEN or TIME-WAIT (the
// states the program's look-up lets through anyway) or CLOSE. The kernel
// looked at is that of the network namespace of the calling thread,
// which must be the interface's. grace lets segments the program passed
// before the entry was made reach the kernel's tables. The check runs in
// the background; the channel returns its error (nil when the bit was
// cleared or stays rightly) and is closed. An entry replaced or removed
// meanwhile is left as it is.
func (s *Steering) CheckKernelFlows(l Listener, grace time.Duration) <-chan error {
	done := make(chan error, 1)
	// ended is done with err, for a check that ends before it starts.
	ended := func(err error) <-chan error {
		done <- err
		close(done)
		return done
	}
	if l.Proto != TCP {
		return ended(nil)
	}
	k, err := listenerKey(l)
	if err != nil {
		return ended(err)
	}
	s.mu.Lock()
	gen := s.gens[k]
	s.mu.Unlock()
	runtime.LockOSThread()
	ns, err := netns.Get()
	runtime.UnlockOSThread()
	if err != nil {
		return ended(fmt.Errorf("check the kernel's connections on %s:%d: network namespace: %w", l.Addr, l.Port, err))
	}
	time.AfterFunc(grace, func() {
		defer close(done)
		defer ns.Close()
		has, err := kernelHasFlows(ns, l)
		if err != nil || has {
			done <- err
			return
		}
		done <- s.clearKernelBit(k, gen)
	})
	return done
}

// clearKernelBit clears KERNEL_BIT in the listener entry k, if it is
// still the one of generation gen.
func (s *Steering) clearKernelBit(k steerListenerKey, gen uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.gens[k] != gen {
		return nil
	}
	var v uint32
	if err := s.objs.Listeners.Lookup(k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("listener entry: %w", err)
	}
	if v&kernelBit == 0 {
		return nil
	}
	if err := s.objs.Listeners.Update(k, v&^kernelBit, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("clear the kernel look-up of a listener entry: %w", err)
	}
	return nil
}

// kernelHasFlows reports whether the kernel of network namespace ns has
// a TCP connection on l's port (and address, unless l's is unspecified)
// in a state other than LISTEN, TIME-WAIT and CLOSE, half-open ones
// included.
func kernelHasFlows(ns netns.NsHandle, l Listener) (bool, error) {
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_INET_DIAG)
	if err != nil {
		return false, fmt.Errorf("check the kernel's connections on port %d: %w", l.Port, err)
	}
	defer h.Close()
	socks, err := h.SocketDiagTCP(unix.AF_INET)
	if err != nil {
		return false, fmt.Errorf("check the kernel's connections on port %d: %w", l.Port, err)
	}
	any := !l.Addr.IsValid() || l.Addr.IsUnspecified()
	for _, sk := range socks {
		if sk.ID.SourcePort != l.Port {
			continue
		}
		switch sk.State {
		case tcpListen, tcpTimeWait, tcpClose:
			continue
		}
		if !any {
			a, ok := netip.AddrFromSlice(sk.ID.Source)
			if !ok || a.Unmap() != l.Addr.Unmap() {
				continue
			}
		}
		return true, nil
	}
	return false, nil
}

// The kernel's TCP states (include/net/tcp_states.h) that the check
// passes over.
const (
	tcpTimeWait = 6
	tcpClose    = 7
	tcpListen   = 10
)
