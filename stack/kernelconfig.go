package stack

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netlinkTimeout bounds a netlink request: the kernel answers at once.
const netlinkTimeout = time.Second

// KernelConfig reads what the kernel knows about interface ifname into a
// Config: its IPv4 address and prefix, Ethernet address and MTU, and the
// gateway of the kernel's default route through it, and the namespace's
// net.ipv4.tcp_notsent_lowat (NotSentLowat). It must run in the
// interface's network namespace. Sizes and protocol parameters are left
// at their defaults.
func KernelConfig(ifname string) (Config, error) {
	link, err := netlink.LinkByName(ifname)
	if err != nil {
		return Config{}, fmt.Errorf("interface %q: %w (see `ip link`)", ifname, err)
	}
	la := link.Attrs()
	cfg := Config{MAC: la.HardwareAddr, MTU: la.MTU}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return Config{}, fmt.Errorf("addresses of %s: %w", ifname, err)
	}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().Is4() {
			ones, _ := a.Mask.Size()
			cfg.Addr = netip.PrefixFrom(ip.Unmap(), ones)
			break
		}
	}
	if !cfg.Addr.IsValid() {
		return Config{}, fmt.Errorf("interface %s has no IPv4 address (ip addr add ... dev %s)", ifname, ifname)
	}
	gw, err := DefaultGateway(la.Index)
	if err != nil {
		return Config{}, err
	}
	if gw.IsValid() && cfg.Addr.Contains(gw) {
		cfg.Gateway = gw
	}
	if b, err := os.ReadFile(notsentLowatSysctl); err == nil {
		cfg.NotSentLowat = notsentLowatOfSysctl(strings.TrimSpace(string(b)))
	}
	return cfg, nil
}

// notsentLowatSysctl is the namespace's TCP_NOTSENT_LOWAT for sockets that
// set none (Linux's tcp_notsent_lowat).
const notsentLowatSysctl = "/proc/sys/net/ipv4/tcp_notsent_lowat"

// notsentLowatOfSysctl is Config.NotSentLowat for the sysctl's value v: 0
// (no limit) for its default, UINT_MAX, or for anything that is not a
// number; its 0, with which Linux writes only once nothing is unsent, is
// 1 (a send takes no new frame while a byte is unsent).
func notsentLowatOfSysctl(v string) uint32 {
	n, err := strconv.ParseUint(v, 10, 32)
	switch {
	case err != nil || n == math.MaxUint32:
		return 0
	case n == 0:
		return 1
	}
	return uint32(n)
}

// DefaultGateway is the gateway of the main table's IPv4 default route
// through interface ifindex; the zero Addr if there is none.
func DefaultGateway(ifindex int) (netip.Addr, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read the kernel's routes: %w", err)
	}
	for _, r := range routes {
		if gw, ok := defaultVia(&r, ifindex); ok {
			return gw, nil
		}
	}
	return netip.Addr{}, nil
}

// defaultVia reports the gateway of r if it is an IPv4 default route of
// the main table through ifindex.
func defaultVia(r *netlink.Route, ifindex int) (netip.Addr, bool) {
	if r.Table != unix.RT_TABLE_MAIN || r.LinkIndex != ifindex {
		return netip.Addr{}, false
	}
	if r.Dst != nil {
		if ones, _ := r.Dst.Mask.Size(); ones != 0 {
			return netip.Addr{}, false
		}
	}
	gw, ok := netip.AddrFromSlice(r.Gw)
	if !ok || !gw.Unmap().Is4() {
		return netip.Addr{}, false
	}
	return gw.Unmap(), true
}

// KernelNeighbours resolves neighbours through the kernel's neighbour
// table over rtnetlink. ARP stays with the kernel (the steering program
// passes ARP frames to it): when an entry is missing, KernelNeighbours
// asks the kernel to resolve it (RTM_NEWNEIGH with NTF_USE, which sends an
// ARP request) and the stack holds its packets until the entry appears.
type KernelNeighbours struct {
	mu      sync.Mutex
	h       *netlink.Handle
	ifindex int
	// Ask, if set, asks someone else to resolve when the kernel refuses
	// us (asking needs CAP_NET_ADMIN): onloadd, for its clients.
	Ask func(netip.Addr) error
}

// NewKernelNeighbours opens a netlink socket for the interface. It must be
// called in the interface's network namespace; the socket stays there.
func NewKernelNeighbours(ifname string) (*KernelNeighbours, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("neighbour resolver: interface %q: %w", ifname, err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("neighbour resolver: netlink socket: %w", err)
	}
	h.SetSocketTimeout(netlinkTimeout)
	return &KernelNeighbours{h: h, ifindex: ifi.Index}, nil
}

// Close closes the netlink socket.
func (k *KernelNeighbours) Close() error {
	k.h.Close()
	return nil
}

// nudValid are the kernel's neighbour states whose link address is usable.
const nudValid = unix.NUD_REACHABLE | unix.NUD_STALE | unix.NUD_DELAY | unix.NUD_PROBE | unix.NUD_PERMANENT | unix.NUD_NOARP

// Resolve looks ip up in the kernel's table; if the kernel has no usable
// entry it asks the kernel to resolve one and reports false.
func (k *KernelNeighbours) Resolve(ip netip.Addr) (net.HardwareAddr, bool) {
	if !ip.Is4() {
		return nil, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	mac, state, found := k.get(ip)
	if found && state&nudValid != 0 && len(mac) == 6 {
		return mac, true
	}
	if found && state&unix.NUD_INCOMPLETE != 0 {
		return nil, false // being resolved
	}
	k.use(ip)
	return nil, false
}

func (k *KernelNeighbours) get(ip netip.Addr) (net.HardwareAddr, int, bool) {
	ns, err := k.h.NeighList(k.ifindex, netlink.FAMILY_V4)
	if err != nil {
		return nil, 0, false
	}
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n.HardwareAddr, n.State, true
		}
	}
	return nil, 0, false
}

// use asks the kernel to resolve ip (it sends an ARP request), or, when
// this process may not, whoever Ask names.
func (k *KernelNeighbours) use(ip netip.Addr) error {
	err := k.h.NeighSet(&netlink.Neigh{
		LinkIndex: k.ifindex, Family: netlink.FAMILY_V4, Flags: unix.NTF_USE, IP: ip.AsSlice(),
	})
	if err != nil && k.Ask != nil && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) {
		return k.Ask(ip)
	}
	return err
}
