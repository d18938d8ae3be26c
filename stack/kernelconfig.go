package stack

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KernelConfig reads what the kernel knows about an interface into a
// Config: its IPv4 address and prefix, Ethernet address and MTU, and the
// gateway of the kernel's default route through it (RTM_GETROUTE). It
// must run in the interface's network namespace. Sizes and protocol
// parameters are left at their defaults.
func KernelConfig(ifname string) (Config, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return Config{}, fmt.Errorf("interface %q: %w (see `ip link`)", ifname, err)
	}
	cfg := Config{MAC: ifi.HardwareAddr, MTU: ifi.MTU}
	addrs, err := ifi.Addrs()
	if err != nil {
		return Config{}, fmt.Errorf("addresses of %s: %w", ifname, err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap().Is4() {
				ones, _ := ipn.Mask.Size()
				cfg.Addr = netip.PrefixFrom(ip.Unmap(), ones)
				break
			}
		}
	}
	if !cfg.Addr.IsValid() {
		return Config{}, fmt.Errorf("interface %s has no IPv4 address (ip addr add ... dev %s)", ifname, ifname)
	}
	gw, err := defaultGateway(ifi.Index)
	if err != nil {
		return Config{}, err
	}
	if gw.IsValid() && cfg.Addr.Contains(gw) {
		cfg.Gateway = gw
	}
	return cfg, nil
}

// defaultGateway finds the gateway of the main table's IPv4 default route
// through interface ifindex, if there is one.
func defaultGateway(ifindex int) (netip.Addr, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETROUTE, syscall.AF_INET)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read the kernel's routes: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("parse the kernel's routes: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != syscall.RTM_NEWROUTE || len(m.Data) < syscall.SizeofRtMsg {
			continue
		}
		rt := (*syscall.RtMsg)(unsafe.Pointer(&m.Data[0]))
		if rt.Family != syscall.AF_INET || rt.Dst_len != 0 || rt.Table != syscall.RT_TABLE_MAIN {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			continue
		}
		var gw netip.Addr
		oif := -1
		for _, a := range attrs {
			switch a.Attr.Type {
			case unix.RTA_GATEWAY:
				if len(a.Value) == 4 {
					gw = netip.AddrFrom4([4]byte(a.Value))
				}
			case unix.RTA_OIF:
				if len(a.Value) >= 4 {
					oif = int(binary.NativeEndian.Uint32(a.Value))
				}
			}
		}
		if oif == ifindex && gw.IsValid() {
			return gw, nil
		}
	}
	return netip.Addr{}, nil
}
