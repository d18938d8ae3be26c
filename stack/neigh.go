package stack

import (
	"errors"
	"net/netip"
	"time"

	"github.com/xdp-onload/onload/timers"
	"github.com/xdp-onload/onload/vnic"
)

// The neighbour table maps next-hop IPv4 addresses to Ethernet addresses.
// ARP itself is the kernel's: entries come from configuration or from the
// Resolver (the kernel's neighbour table). While the kernel resolves an
// address, frames for it wait in its entry (up to maxPending; as Linux's
// unresolved queue) and are sent when the address is known, or dropped
// after resolveTimeout.

const (
	maxPending     = 16
	resolveTimeout = 3 * time.Second
	resolveRetry   = 2 * time.Millisecond // how often an unresolved entry is asked about again
	failedRetry    = time.Second          // how long a failed entry is believed
)

// errNeighPending says the next hop is being resolved: hold the frame in
// the entry.
var errNeighPending = errors.New("neighbour being resolved")

// The stack's own timers, after the sockets'.
const timerNeigh = 0

func (s *Stack) stackTimer(n int) timers.ID {
	return timers.ID(uint32(len(s.img.socks))*timersPerSock + uint32(n))
}

func neighSlot(a [4]byte) uint32 { return (be32(a) * 0x9e3779b1) >> 24 } // 0..255

// neighbourLocked finds the entry for a, or makes one if create; nil if
// absent (or the table is full).
func (s *Stack) neighbourLocked(a [4]byte, create bool) *neighbour {
	n := s.img.neigh
	for i, k := neighSlot(a), 0; k < len(n); i, k = (i+1)%uint32(len(n)), k+1 {
		e := &n[i]
		if e.state != neighFree && e.addr == a {
			return e
		}
		if e.state == neighFree {
			if !create {
				return nil
			}
			*e = neighbour{addr: a, state: neighFailed}
			return e
		}
	}
	return nil
}

// setNeighbourLocked records an address as resolved.
func (s *Stack) setNeighbourLocked(a [4]byte, mac [6]byte) bool {
	e := s.neighbourLocked(a, true)
	if e == nil {
		return false
	}
	s.resolvedLocked(e, mac)
	return true
}

// resolvedLocked marks an entry valid and sends the frames that waited.
func (s *Stack) resolvedLocked(e *neighbour, mac [6]byte) {
	if e.state == neighIncomplete {
		s.img.hdr.neighWait -= min(s.img.hdr.neighWait, 1)
	}
	e.mac, e.state = mac, neighValid
	for h, steps := e.pendHead, 0; h != vnic.Null && !s.overWalkLocked(steps); steps++ {
		next := s.pool.Next(h)
		if b := s.pool.Data(h); len(b) >= 6 {
			copy(b[0:6], mac[:])
			s.queueTxLocked(h)
		} else {
			s.pool.Free(h)
		}
		h = next
	}
	e.pendHead, e.pendTail, e.npending = vnic.Null, vnic.Null, 0
}

// nextHopLocked returns the Ethernet address to send to dst: dst itself
// when it is on our subnet, else the gateway. errNeighPending means the
// address is being resolved and e is the entry to hold the frame in.
func (s *Stack) nextHopLocked(dst [4]byte) (mac [6]byte, e *neighbour, err error) {
	h := s.img.hdr
	if dst == h.addr {
		return h.mac, nil, nil // in-stack loopback (loopback.go)
	}
	hop := dst
	if !netip.PrefixFrom(netip.AddrFrom4(h.addr), int(h.prefixLen)).Contains(netip.AddrFrom4(dst)) {
		if h.gateway == [4]byte{} {
			return mac, nil, ErrHostUnreachable
		}
		hop = h.gateway
	}
	e = s.neighbourLocked(hop, s.resolver != nil)
	if e != nil && e.state == neighValid {
		return e.mac, e, nil
	}
	if e == nil {
		h.counters.TxNoNeighbour++
		return mac, nil, ErrNoNeighbour
	}
	now := s.nowTick()
	switch e.state {
	case neighIncomplete:
		return mac, e, errNeighPending
	case neighFailed:
		if e.since != 0 && now-e.since < s.ticks(failedRetry) {
			h.counters.TxNoNeighbour++
			return mac, nil, ErrNoNeighbour
		}
	}
	if hw, ok := s.resolver.Resolve(netip.AddrFrom4(hop)); ok && len(hw) == 6 {
		copy(mac[:], hw)
		s.resolvedLocked(e, mac)
		return mac, e, nil
	}
	e.state, e.since = neighIncomplete, now
	h.neighWait++
	s.img.wheel.Set(s.stackTimer(timerNeigh), now+s.ticks(resolveRetry))
	return mac, e, errNeighPending
}

// holdLocked keeps a frame in a neighbour entry until it resolves. The
// oldest frame goes when the entry holds maxPending.
func (s *Stack) holdLocked(e *neighbour, h vnic.Handle) {
	if e.npending >= maxPending {
		old := e.pendHead
		e.pendHead = s.pool.Next(old)
		s.pool.Free(old)
		e.npending -= min(e.npending, 1)
		s.img.hdr.counters.TxNoNeighbour++
	}
	s.pool.SetNext(h, vnic.Null)
	if e.pendTail == vnic.Null || e.pendHead == vnic.Null {
		e.pendHead = h
	} else {
		s.pool.SetNext(e.pendTail, h)
	}
	e.pendTail = h
	e.npending++
}

// neighTimerLocked asks the resolver again about every entry being
// resolved, sending what waited for those that resolved and dropping what
// waited for those that took too long.
func (s *Stack) neighTimerLocked() {
	hd := s.img.hdr
	if hd.neighWait == 0 || s.resolver == nil {
		return
	}
	now := s.nowTick()
	for i := range s.img.neigh {
		e := &s.img.neigh[i]
		if e.state != neighIncomplete {
			continue
		}
		if hw, ok := s.resolver.Resolve(netip.AddrFrom4(e.addr)); ok && len(hw) == 6 {
			var mac [6]byte
			copy(mac[:], hw)
			s.resolvedLocked(e, mac)
			continue
		}
		if now-e.since >= s.ticks(resolveTimeout) {
			for h := e.pendHead; h != vnic.Null; {
				next := s.pool.Next(h)
				s.pool.Free(h)
				hd.counters.TxNoNeighbour++
				h = next
			}
			*e = neighbour{addr: e.addr, state: neighFailed, since: now}
			hd.neighWait -= min(hd.neighWait, 1)
		}
	}
	if hd.neighWait > 0 {
		s.img.wheel.Set(s.stackTimer(timerNeigh), now+s.ticks(resolveRetry))
	}
}
