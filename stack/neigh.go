package stack

import (
	"net/netip"
)

// The neighbour table maps next-hop IPv4 addresses to Ethernet addresses.
// ARP itself is the kernel's: entries come from configuration or from the
// Resolver (the kernel's neighbour table).

func neighSlot(a [4]byte) uint32 { return (be32(a) * 0x9e3779b1) >> 24 } // 0..255

// setNeighbourLocked records or updates an entry (open addressing).
func (s *Stack) setNeighbourLocked(a [4]byte, mac [6]byte) bool {
	n := s.img.neigh
	for i, k := neighSlot(a), 0; k < len(n); i, k = (i+1)%uint32(len(n)), k+1 {
		e := &n[i]
		if e.state == neighFree || e.addr == a {
			*e = neighbour{addr: a, mac: mac, state: neighValid}
			return true
		}
	}
	return false
}

func (s *Stack) findNeighbourLocked(a [4]byte) (mac [6]byte, ok bool) {
	n := s.img.neigh
	for i, k := neighSlot(a), 0; k < len(n); i, k = (i+1)%uint32(len(n)), k+1 {
		e := &n[i]
		if e.state == neighFree {
			return mac, false
		}
		if e.addr == a {
			return e.mac, true
		}
	}
	return mac, false
}

// nextHopLocked returns the Ethernet address to send to dst: dst itself
// when it is on our subnet, else the gateway.
func (s *Stack) nextHopLocked(dst [4]byte) ([6]byte, error) {
	h := s.img.hdr
	hop := dst
	if !netip.PrefixFrom(netip.AddrFrom4(h.addr), int(h.prefixLen)).Contains(netip.AddrFrom4(dst)) {
		if h.gateway == [4]byte{} {
			return [6]byte{}, ErrHostUnreachable
		}
		hop = h.gateway
	}
	if mac, ok := s.findNeighbourLocked(hop); ok {
		return mac, nil
	}
	if s.resolver != nil {
		if hw, ok := s.resolver.Resolve(netip.AddrFrom4(hop)); ok && len(hw) == 6 {
			var mac [6]byte
			copy(mac[:], hw)
			s.setNeighbourLocked(hop, mac)
			return mac, nil
		}
	}
	h.counters.TxNoNeighbour++
	return [6]byte{}, ErrNoNeighbour
}
