package stack

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Follower keeps a stack in step with the kernel's tables for its
// interface: the MTU (link notifications), the default route's gateway
// (route notifications) and the Ethernet addresses of the neighbours the
// stack talks to (neighbour notifications), from rtnetlink's multicast
// groups, which need no privilege. A change reaches the stack's image as
// soon as the kernel announces it; nothing restarts.
type Follower struct {
	s       *Stack
	ifindex int
	logf    func(format string, a ...any)
	done    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

// FollowKernel starts following interface ifname's tables for s. It must
// run in the interface's network namespace (the subscriptions stay
// there). logf, if not nil, hears of each change applied and of errors.
func FollowKernel(s *Stack, ifname string, logf func(format string, a ...any)) (*Follower, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("follow the kernel's tables: interface %q: %w", ifname, err)
	}
	f := &Follower{s: s, ifindex: link.Attrs().Index, logf: logf, done: make(chan struct{})}
	lch := make(chan netlink.LinkUpdate, 16)
	nch := make(chan netlink.NeighUpdate, 256)
	rch := make(chan netlink.RouteUpdate, 64)
	onErr := func(err error) { logf("following the kernel's tables of %s: %v", ifname, err) }
	if err := closeOnExec(func() error {
		if err := netlink.LinkSubscribeWithOptions(lch, f.done, netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
			return fmt.Errorf("follow the kernel's links: %w", err)
		}
		if err := netlink.NeighSubscribeWithOptions(nch, f.done, netlink.NeighSubscribeOptions{ErrorCallback: onErr}); err != nil {
			return fmt.Errorf("follow the kernel's neighbours: %w", err)
		}
		if err := netlink.RouteSubscribeWithOptions(rch, f.done, netlink.RouteSubscribeOptions{ErrorCallback: onErr}); err != nil {
			return fmt.Errorf("follow the kernel's routes: %w", err)
		}
		return nil
	}); err != nil {
		close(f.done)
		return nil, err
	}
	// What changed between the stack's making and the subscriptions.
	f.mtu(link.Attrs().MTU)
	f.gateway()
	f.wg.Add(1)
	go f.run(lch, nch, rch)
	return f, nil
}

func (f *Follower) run(lch <-chan netlink.LinkUpdate, nch <-chan netlink.NeighUpdate, rch <-chan netlink.RouteUpdate) {
	defer f.wg.Done()
	for {
		select {
		case <-f.done:
			return
		case u, ok := <-lch:
			if !ok {
				return
			}
			if a := u.Attrs(); a != nil && a.Index == f.ifindex && u.Header.Type == unix.RTM_NEWLINK {
				f.mtu(a.MTU)
			}
		case u, ok := <-nch:
			if !ok {
				return
			}
			f.neighbour(u)
		case u, ok := <-rch:
			if !ok {
				return
			}
			if _, ok := defaultVia(&u.Route, f.ifindex); ok || u.Route.LinkIndex == f.ifindex && u.Route.Dst == nil {
				f.gateway()
			}
		}
	}
}

func (f *Follower) mtu(m int) {
	if m == f.s.MTU() {
		return
	}
	if err := f.s.SetMTU(m); err != nil {
		f.logf("the kernel's MTU: %v", err)
		return
	}
	f.logf("MTU now %d, from the kernel", m)
}

func (f *Follower) gateway() {
	gw, err := DefaultGateway(f.ifindex)
	if err != nil {
		f.logf("%v", err)
		return
	}
	if gw == f.s.Gateway() {
		return
	}
	if err := f.s.SetGateway(gw); err != nil {
		f.logf("the kernel's default route: %v", err)
		return
	}
	f.logf("gateway now %v, from the kernel's default route", gw)
}

func (f *Follower) neighbour(u netlink.NeighUpdate) {
	n := &u.Neigh
	if n.LinkIndex != f.ifindex || n.Family != netlink.FAMILY_V4 {
		return
	}
	ip, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return
	}
	switch {
	case u.Type == unix.RTM_DELNEIGH || n.State&unix.NUD_FAILED != 0:
		f.s.ForgetNeighbour(ip)
	case n.State&nudValid != 0 && len(n.HardwareAddr) == 6:
		if f.s.UpdateNeighbour(ip, n.HardwareAddr) {
			f.logf("neighbour %v at %v, from the kernel", ip.Unmap(), n.HardwareAddr)
		}
	}
}

// Close stops following.
func (f *Follower) Close() error {
	f.once.Do(func() { close(f.done) })
	f.wg.Wait()
	return nil
}

// netlinkFDs lists the process's open netlink sockets.
func netlinkFDs() map[int]bool {
	ents, _ := os.ReadDir("/proc/self/fd")
	fds := map[int]bool{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if d, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil && d == unix.AF_NETLINK {
			fds[fd] = true
		}
	}
	return fds
}

// closeOnExec runs subscribe, which opens netlink sockets through the
// netlink library, and makes those sockets close-on-exec: the library
// opens them without it, and every program the process exec'd inherited
// them. Go's ForkLock is held meanwhile, and only meanwhile, so that no
// fork of Go's comes between.
func closeOnExec(subscribe func() error) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	before := netlinkFDs()
	err := subscribe()
	for fd := range netlinkFDs() {
		if !before[fd] {
			unix.CloseOnExec(fd)
		}
	}
	return err
}
