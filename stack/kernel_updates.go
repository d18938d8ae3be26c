package stack

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/xdp-onload/onload/vnic"
)

// Changes to the kernel's tables, applied to a running stack (FollowKernel
// calls them; so may a caller who knows better). Every process that maps
// the image sees them: they are written into it.

// SetMTU changes the stack's MTU: segments built from now on fit it.
// Frames already queued for retransmission keep their size.
func (s *Stack) SetMTU(mtu int) error {
	if mtu < 576 || mtu > s.maxMTU {
		return fmt.Errorf("mtu %d: the stack takes from 576 to %d (its frames' size)", mtu, s.maxMTU)
	}
	s.lock()
	defer s.unlock()
	s.img.hdr.mtu = uint32(mtu)
	s.syncMTULocked()
	return nil
}

// MTU is the stack's MTU.
func (s *Stack) MTU() int {
	s.lock()
	defer s.unlock()
	return s.mtu
}

// syncMTULocked takes the image's MTU (which another process may have
// changed, or spoiled) into this handle and its NIC.
func (s *Stack) syncMTULocked() {
	m := min(max(int(s.img.hdr.mtu), 576), s.maxMTU)
	if m == s.mtu {
		return
	}
	s.mtu = m
	if ms, ok := s.nic.(vnic.MTUSetter); ok {
		ms.SetMTU(m)
	}
}

// SetGateway changes the next hop for destinations off the stack's
// subnet; the zero Addr removes it (they become unreachable).
func (s *Stack) SetGateway(gw netip.Addr) error {
	s.lock()
	defer s.unlock()
	h := s.img.hdr
	if !gw.IsValid() {
		h.gateway = [4]byte{}
		return nil
	}
	gw = gw.Unmap()
	if !gw.Is4() || !netip.PrefixFrom(netip.AddrFrom4(h.addr), int(h.prefixLen)).Contains(gw) {
		return fmt.Errorf("gateway %s is not on the stack's subnet", gw)
	}
	h.gateway = gw.As4()
	return nil
}

// UpdateNeighbour takes a new Ethernet address for ip, if the stack knows
// or is resolving ip (addresses it never sent to are not added); what
// waited for it is sent. It reports whether the entry changed.
func (s *Stack) UpdateNeighbour(ip netip.Addr, mac net.HardwareAddr) bool {
	if ip = ip.Unmap(); !ip.Is4() || len(mac) != 6 {
		return false
	}
	s.lock()
	defer s.unlock()
	e := s.neighbourLocked(ip.As4(), false)
	if e == nil {
		return false
	}
	var m [6]byte
	copy(m[:], mac)
	if e.state == neighValid && e.mac == m {
		return false
	}
	s.resolvedLocked(e, m)
	s.flushLocked()
	return true
}

// ForgetNeighbour drops what the stack knows of ip's Ethernet address
// (the kernel's entry went away or failed): the next frame to it asks the
// kernel again.
func (s *Stack) ForgetNeighbour(ip netip.Addr) {
	if ip = ip.Unmap(); !ip.Is4() {
		return
	}
	s.lock()
	defer s.unlock()
	if e := s.neighbourLocked(ip.As4(), false); e != nil && e.state == neighValid {
		e.state, e.since = neighFailed, 0
	}
}
