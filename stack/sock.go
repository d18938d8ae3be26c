package stack

import (
	"fmt"
	"iter"
	"net/netip"
	"sync/atomic"
	"unsafe"

	"github.com/xdp-onload/onload/vnic"
)

// SockID names a socket: a 20-bit slot index and a 12-bit generation that
// changes every time the slot is reused, so an ID kept after Close is
// refused (ErrBadSocket) rather than reaching the slot's next occupant.
// The zero SockID is NullSock.
type SockID uint32

// NullSock names no socket.
const NullSock SockID = 0

func makeSockID(idx, gen uint32) SockID { return SockID(gen<<20 | idx) }

func (id SockID) index() uint32 { return uint32(id) & (1<<20 - 1) }
func (id SockID) gen() uint32   { return uint32(id) >> 20 }

// Slot is the socket's slot in the table, from 0 to Config.Sockets-1:
// an index for per-socket state kept outside the image.
func (id SockID) Slot() int { return int(id.index()) }

func (id SockID) String() string { return fmt.Sprintf("sock(%d/%d)", id.index(), id.gen()) }

// noSlot ends the socket free list and the hash chains, which link slot
// indices.
const noSlot = ^uint32(0)

// Socket kinds.
const (
	kindFree = 0
	kindUDP  = 1
	kindTCP  = 2
)

// Socket flags.
const (
	sfBound     = 1 << 0 // has a local address and port
	sfConnected = 1 << 1 // has a remote address and port
	sfHashed    = 1 << 2 // is in the connection hash table
	sfRemoteMAC = 1 << 3 // remoteMAC holds the next hop for the peer
	sfRcvBufSet = 1 << 4 // the user set the receive buffer: no autotuning
	sfSndBufSet = 1 << 5 // the user set the send buffer: no autotuning
	// sfWake: a thread of a handle that shares no wakes (JoinWakes) sleeps
	// on the socket and wants Options.Wake (wake.go); those of processes
	// that share them are the socket's waiters.
	sfWake = 1 << 6
	// sfPortHolder: a TCP socket that only holds a shared local port
	// (shared_ports.go): bound, never connected, it keeps the port
	// steered while connections come and go on it.
	sfPortHolder = 1 << 7
	// sfPortRetired: a holder whose port takes no new connection: one of
	// its connections was handed over to the kernel, which now has that
	// four-tuple where the stack cannot see it.
	sfPortRetired = 1 << 8
	// sfTimeWaitList: a connection in the TIME-WAIT list (twLinkLocked).
	sfTimeWaitList = 1 << 9
	// sfFlowSteered: a connection steered by a flow entry of its own,
	// made when its port's listener closed or was retired
	// (retireListenerLocked), taken out as its slot is freed.
	sfFlowSteered = 1 << 10
	// sfListenRetired: a listener whose port goes to the kernel
	// (RetireListener): it keeps what its queue holds, and its user
	// accepts the rest from its kernel socket, which another process
	// shares.
	sfListenRetired = 1 << 11
	// sfLateKept: a HANDED-OVER socket, its handover ended, keeps
	// segments that came in its grace on its out-of-order list for a
	// handle that can give them to the kernel's socket (GiveLate): the
	// handle that polled them could not (a process of onloadd's stack).
	sfLateKept = 1 << 12
	// sfAckHeld: the ACK a read owes waits for the reader's next wait, or
	// rides on its answer (holdAckLocked). Cleared with tfAckNow.
	sfAckHeld = 1 << 13
)

// sock is one slot of the socket table. Fields are plain values: the slot
// lives in the image.
type sock struct {
	kind uint8
	// edgeState is the state at the last edge (edgeLocked).
	edgeState uint8
	flags     uint16
	gen       uint32 // generation of the slot's current SockID
	next      uint32 // free list or hash chain
	// The chain of the sockets bound to one port's bucket, while sfBound.
	portPrev, portNext uint32
	// The TIME-WAIT list, oldest first, while sfTimeWaitList.
	twPrev, twNext uint32

	localAddr, remoteAddr [4]byte
	localPort, remotePort uint16
	remoteMAC             [6]byte
	// IP_TOS and IP_TTL (0: defaultTTL), for the headers' template.
	tos, ttl uint8

	err uint32 // pending error, an errno, reported once

	// The kernel socket that names the connection in a process (its fd
	// there, plus one; 0: none) and that process's id as it sees
	// itself: where onloadd, stopping, hands the connection over
	// (HandoverCandidates).
	kfdPID, kfd1 uint32

	// Processes of a shared stack, as bits of their procs slots (procBit):
	// openers hold the socket (opened or accepted it, or share a listener:
	// ShareListener), and it closes when the last lets go (Close, or its
	// death: CloseAbandonedBy); 0 for a handle that shares no wakes.
	// waiters have a thread asleep on it; remoteWakes are the waiters
	// another process's poll touched, each to wake its own threads
	// (wake.go).
	openers, waiters, remoteWakes uint32
	// edges counts the socket's edges (edgeLocked): an edge-triggered
	// waiter (EPOLLET) is told of each. edgeRcv is rcvNxt at the last.
	edges, edgeRcv uint32

	// The receive queue: frames linked through their descriptors' next
	// handles; each frame's data is exactly its payload.
	rcvHead, rcvTail vnic.Handle
	rcvBytes         uint32
	rcvFrames        uint32

	rcvBuf, sndBuf uint32

	// A connected socket's headers, ready to copy into each frame:
	// Ethernet, IPv4 (total length 0, identification 0, checksum 0) and
	// the two ports. ipSum and phSum are the one's-complement sums of the
	// IPv4 header and the pseudo-header without their length fields.
	tmpl         [ethLen + ipLen + 4]byte
	tmplValid    bool
	_            uint8
	ipSum, phSum uint16

	tcb // TCP's part; zero for UDP
}

// racyKind and racyState read the socket's kind and TCP state without the
// lock, for hints: atomically, through the 32-bit words that hold them.
func (sk *sock) racyKind() uint8 {
	w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&sk.kind)))
	return (*[4]uint8)(unsafe.Pointer(&w))[0]
}

// ipTTL is the time to live of the socket's packets.
func (sk *sock) ipTTL() uint8 {
	if sk.ttl == 0 {
		return defaultTTL
	}
	return sk.ttl
}

func (sk *sock) racyState() uint8 {
	w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&sk.tcb.state)))
	return (*[4]uint8)(unsafe.Pointer(&w))[0]
}

// sockLocked resolves id to its slot, or returns ErrBadSocket. It is the
// one way from an ID to a socket.
func (s *Stack) sockLocked(id SockID) (*sock, error) {
	sk, err := s.anySockLocked(id)
	if err == nil && sk.tflags&tfOrphan != 0 {
		return nil, ErrBadSocket
	}
	return sk, err
}

// anySockLocked is sockLocked that also resolves a socket its user has
// closed (an orphan).
func (s *Stack) anySockLocked(id SockID) (*sock, error) {
	idx := id.index()
	if idx >= uint32(len(s.img.socks)) {
		return nil, ErrBadSocket
	}
	sk := &s.img.socks[idx]
	if sk.kind == kindFree || sk.gen != id.gen() || id.gen() == 0 {
		return nil, ErrBadSocket
	}
	return sk, nil
}

func (s *Stack) idOf(sk *sock) SockID {
	return makeSockID(s.slotOf(sk), sk.gen)
}

func (s *Stack) slotOf(sk *sock) uint32 {
	return uint32((uintptrOf(sk) - uintptrOf(&s.img.socks[0])) / sockSize)
}

// formatSockets links every slot into the free list.
func (img *Image) formatSockets() {
	for i := range img.socks {
		img.socks[i] = sock{next: uint32(i + 1), gen: 1}
	}
	img.socks[len(img.socks)-1].next = noSlot
	img.hdr.sockFree = 0
}

// allocSockLocked takes a free slot for a socket of kind.
func (s *Stack) allocSockLocked(kind uint8) (*sock, SockID, error) {
	h := s.img.hdr
	idx := h.sockFree
	if idx >= uint32(len(s.img.socks)) || s.img.socks[idx].kind != kindFree {
		if !s.recycleTimeWaitLocked() {
			h.counters.SocketsExhausted++
			return nil, NullSock, ErrNoSockets
		}
		idx = h.sockFree
	}
	sk := &s.img.socks[idx]
	h.sockFree = sk.next
	if idx >= h.sockHigh {
		h.sockHigh = idx + 1
	}
	gen := sk.gen
	*sk = sock{kind: kind, gen: gen, next: noSlot, rcvBuf: h.recvBuffer, sndBuf: h.sendBuffer, openers: procBit(s.proc())}
	sk.ccAlgo = uint8(min(h.ccAlgo, ccReno))
	sk.tcb.acceptHead, sk.tcb.acceptTail, sk.tcb.acceptNext, sk.tcb.parent = noSlot, noSlot, noSlot, noSlot
	sk.keepIdle, sk.keepIntvl, sk.keepCnt = keepIdleDefault, keepIntvlDefault, keepCntDefault
	h.sockInUse++
	return sk, makeSockID(idx, gen), nil
}

// overflowCheckLocked tells Options.Overflow when the socket table fills
// with live sockets (TIME-WAIT ones are recycled for new connections, and
// a SYN flood's half-open ones make way for cookies, so neither counts):
// at 7/8 of the table, where SYNs start to be answered with cookies, new
// connections go to the listeners' kernel halves instead, so that the
// cookies' connections still find a slot; below 3/4 they come back.
func (s *Stack) overflowCheckLocked() {
	h := s.img.hdr
	live := h.sockInUse - min(h.sockTimeWait+h.sockSynRcvd, h.sockInUse)
	switch {
	case h.overflow == 0 && live >= h.sockets-h.sockets/8:
		atomic.StoreUint32(&h.overflow, 1) // Overflow reads it without the lock
		h.counters.SocketsOverflow++
		if s.overflow != nil {
			s.overflow(true)
		}
	case h.overflow != 0 && live < h.sockets-h.sockets/4:
		atomic.StoreUint32(&h.overflow, 0)
		if s.overflow != nil {
			s.overflow(false)
		}
	}
}

// Overflow reports, without the lock, that the socket table is nearly
// full of live sockets (overflowCheckLocked): onloadd gives the new
// connections of the stacks it made to the kernel meanwhile, as a
// standalone stack's Options.Overflow does.
func (s *Stack) Overflow() bool { return atomic.LoadUint32(&s.img.hdr.overflow) != 0 }

// recycleTimeWaitLocked frees the TIME-WAIT socket its user has closed
// that entered TIME-WAIT first, when the table is full (as Linux does
// past tcp_max_tw_buckets): the TIME-WAIT list's oldest, without a look
// through the table (which cost each new connection the whole table once
// it filled with TIME-WAIT). The list is in order of entry; a clock that
// a FIN again restarted (RFC 9293 3.10.7.4) does not move its socket.
func (s *Stack) recycleTimeWaitLocked() bool {
	best := s.oldestTimeWaitLocked()
	if best == nil {
		return false
	}
	s.tcpCloseFinalLocked(best)
	s.img.hdr.counters.TCPTimeWaitReuse++
	return s.img.hdr.sockFree < uint32(len(s.img.socks))
}

func recyclable(sk *sock) bool {
	return sk.kind == kindTCP && sk.state == tcpTimeWait && sk.tflags&tfOrphan != 0
}

// oldestTimeWaitLocked is the first recyclable socket of the TIME-WAIT
// list; where the list has none (its user still holds every one, or the
// image's list is broken: counted), the one closest to its end, by a look
// through the table.
func (s *Stack) oldestTimeWaitLocked() *sock {
	n := uint32(len(s.img.socks))
	i := s.img.hdr.twHead
	for steps := uint32(0); i != noSlot; steps++ {
		if i >= n || steps >= n {
			s.img.hdr.counters.ImageCorrupt++
			break
		}
		sk := &s.img.socks[i]
		if recyclable(sk) {
			return sk
		}
		i = sk.twNext
	}
	var best *sock
	var bestAt uint64
	for i := range s.img.socks {
		if sk := &s.img.socks[i]; recyclable(sk) {
			at, _ := s.img.wheel.Deadline(s.sockTimer(sk, timerTW))
			if best == nil || uint64(at) < bestAt {
				best, bestAt = sk, uint64(at)
			}
		}
	}
	return best
}

// twLinkLocked puts sk, just in TIME-WAIT, at the TIME-WAIT list's tail.
func (s *Stack) twLinkLocked(sk *sock) {
	h := s.img.hdr
	me := s.slotOf(sk)
	sk.twPrev, sk.twNext = h.twTail, noSlot
	if t := h.twTail; t < uint32(len(s.img.socks)) {
		s.img.socks[t].twNext = me
	} else {
		h.twHead = me
	}
	h.twTail = me
	sk.flags |= sfTimeWaitList
}

// twUnlinkLocked takes sk out of the TIME-WAIT list. Its links are the
// image's: one out of the table is taken as the list's end.
func (s *Stack) twUnlinkLocked(sk *sock) {
	h := s.img.hdr
	n, me := uint32(len(s.img.socks)), s.slotOf(sk)
	if p := sk.twPrev; p < n {
		s.img.socks[p].twNext = sk.twNext
	} else if h.twHead == me {
		h.twHead = sk.twNext
	}
	if x := sk.twNext; x < n {
		s.img.socks[x].twPrev = sk.twPrev
	} else if h.twTail == me {
		h.twTail = sk.twPrev
	}
	sk.twPrev, sk.twNext = noSlot, noSlot
	sk.flags &^= sfTimeWaitList
}

// freeSockLocked returns a slot to the free list; its frames must already
// be freed and it must be out of the hash table.
func (s *Stack) freeSockLocked(sk *sock) {
	h := s.img.hdr
	idx := s.slotOf(sk)
	gen := (sk.gen + 1) & (1<<12 - 1)
	if gen == 0 {
		gen = 1
	}
	if sk.flags&sfBound != 0 {
		s.portUnlinkLocked(sk)
	}
	if sk.flags&sfTimeWaitList != 0 {
		s.twUnlinkLocked(sk)
	}
	*sk = sock{gen: gen, next: h.sockFree}
	h.sockFree = idx
	h.sockInUse -= min(h.sockInUse, 1)
	s.overflowCheckLocked()
}

// tupleHash spreads a connection's 4-tuple over the buckets.
func tupleHash(kind uint8, laddr [4]byte, lport uint16, raddr [4]byte, rport uint16) uint32 {
	x := uint64(be32(laddr))<<32 | uint64(be32(raddr))
	x ^= uint64(lport)<<16 | uint64(rport) | uint64(kind)<<40
	x *= 0x9e3779b97f4a7c15
	return uint32(x >> 32)
}

func be32(a [4]byte) uint32 {
	return uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}

// hashLocked puts a bound socket in the table under its current tuple.
func (s *Stack) hashLocked(sk *sock) {
	b := tupleHash(sk.kind, sk.localAddr, sk.localPort, sk.remoteAddr, sk.remotePort) & uint32(len(s.img.buckets)-1)
	sk.next = s.img.buckets[b]
	s.img.buckets[b] = s.slotOf(sk)
	sk.flags |= sfHashed
}

// unhashLocked takes a socket out of the table.
func (s *Stack) unhashLocked(sk *sock) {
	if sk.flags&sfHashed == 0 {
		return
	}
	b := tupleHash(sk.kind, sk.localAddr, sk.localPort, sk.remoteAddr, sk.remotePort) & uint32(len(s.img.buckets)-1)
	me := s.slotOf(sk)
	link := &s.img.buckets[b]
	for steps := 0; *link != noSlot && steps < len(s.img.socks); steps++ {
		if *link == me {
			*link = sk.next
			break
		}
		if *link >= uint32(len(s.img.socks)) {
			s.img.hdr.counters.ImageCorrupt++
			break
		}
		link = &s.img.socks[*link].next
	}
	sk.next = noSlot
	sk.flags &^= sfHashed
}

// lookupLocked finds the socket for a frame of kind from raddr:rport to
// laddr:lport: first a connected socket with that exact tuple, then one
// bound to laddr:lport, then one bound to the wildcard address.
func (s *Stack) lookupLocked(kind uint8, laddr [4]byte, lport uint16, raddr [4]byte, rport uint16) *sock {
	var zero [4]byte
	if sk := s.findLocked(kind, laddr, lport, raddr, rport); sk != nil {
		return sk
	}
	if sk := s.findLocked(kind, laddr, lport, zero, 0); sk != nil {
		return sk
	}
	return s.findLocked(kind, zero, lport, zero, 0)
}

func (s *Stack) findLocked(kind uint8, laddr [4]byte, lport uint16, raddr [4]byte, rport uint16) *sock {
	b := tupleHash(kind, laddr, lport, raddr, rport) & uint32(len(s.img.buckets)-1)
	i := s.img.buckets[b]
	for steps := 0; i != noSlot; steps++ {
		if i >= uint32(len(s.img.socks)) || steps >= len(s.img.socks) {
			s.img.hdr.counters.ImageCorrupt++
			return nil
		}
		sk := &s.img.socks[i]
		if sk.kind == kind && sk.localPort == lport && sk.remotePort == rport && sk.localAddr == laddr && sk.remoteAddr == raddr {
			return sk
		}
		i = sk.next
	}
	return nil
}

// portInUseLocked reports whether a socket of kind is bound to port on
// addr, or on any address if addr is the wildcard (and, bound to the
// wildcard, clashes with every address), against a claim of that kind.
//
// With SO_REUSEADDR (claimReuse), connections in TIME-WAIT, and
// connections that have SO_REUSEADDR too, do not count. For a socket
// about to connect (claimConnect), no connection counts, nor a shared
// port's holder: a connection is told apart by its four-tuple, which
// Connect checks.
func (s *Stack) portInUseLocked(kind uint8, addr [4]byte, port uint16, claim portClaim) bool {
	var zero [4]byte
	for sk := range s.boundToLocked(kind, port) {
		if sk.flags&sfPortHolder != 0 && claim == claimConnect {
			continue // a shared port's connections are told apart by their four-tuples
		}
		if sk.kind == kindTCP && sk.state != tcpListen && sk.flags&sfConnected != 0 {
			// SO_REUSEADDR on both (a connection accepted from a
			// listener that had it has it too) lets a socket bind
			// beside TCP connections: a server restarted while its
			// predecessor's connections finish (as Linux's
			// inet_csk_bind_conflict lets it). TIME-WAIT never holds
			// the port against it. A listener, or a socket only
			// bound, always does.
			switch {
			case claim == claimConnect:
				continue
			case claim == claimReuse && (sk.state == tcpTimeWait || sk.tflags&tfReuseAddr != 0):
				continue
			}
		}
		if addr == zero || sk.localAddr == zero || sk.localAddr == addr {
			return true
		}
	}
	return false
}

// The port chains: the sockets bound to a port, in a chain from
// ports[port % len(ports)] through portNext (with the other ports of that
// bucket), so that a bind, a connect and a close look at the sockets on
// their port only, where a scan of the table cost every one (the kernel's
// bind hash). A socket is in its chain while sfBound: from its bind (or
// its birth from a listener) to its slot's release.

// portBucketLocked is the head of port's chain.
func (s *Stack) portBucketLocked(port uint16) *uint32 {
	return &s.img.ports[uint32(port)&uint32(len(s.img.ports)-1)]
}

// portLinkLocked puts sk, just bound, at the head of its port's chain.
func (s *Stack) portLinkLocked(sk *sock) {
	head := s.portBucketLocked(sk.localPort)
	me := s.slotOf(sk)
	sk.portPrev, sk.portNext = noSlot, *head
	if h := *head; h < uint32(len(s.img.socks)) {
		s.img.socks[h].portPrev = me
	}
	*head = me
}

// portUnlinkLocked takes sk, bound, out of its port's chain, without a
// walk: a busy server's port has every connection on its chain (which a
// walk from the head cost at each close, a tenth of nginx's workers'
// time with Connection: close). Its links are the image's: one out of
// the table is taken as the chain's end.
func (s *Stack) portUnlinkLocked(sk *sock) {
	n := uint32(len(s.img.socks))
	if p := sk.portPrev; p < n {
		s.img.socks[p].portNext = sk.portNext
	} else if head := s.portBucketLocked(sk.localPort); *head == s.slotOf(sk) {
		*head = sk.portNext
	}
	if x := sk.portNext; x < n {
		s.img.socks[x].portPrev = sk.portPrev
	}
	sk.portPrev, sk.portNext = noSlot, noSlot
}

// boundToLocked yields the sockets of kind bound to port. The chain is
// the image's, which another process writes too: a link out of the table,
// or a chain longer than the table, is counted and the whole table is
// looked through instead (from where the chain went wrong on, a socket
// may be yielded twice).
func (s *Stack) boundToLocked(kind uint8, port uint16) iter.Seq[*sock] {
	return func(yield func(*sock) bool) {
		want := func(sk *sock) bool { return sk.kind == kind && sk.flags&sfBound != 0 && sk.localPort == port }
		i := *s.portBucketLocked(port)
		for steps := 0; i != noSlot; steps++ {
			if i >= uint32(len(s.img.socks)) || steps >= len(s.img.socks) {
				s.img.hdr.counters.ImageCorrupt++
				for j := range s.img.socks {
					if sk := &s.img.socks[j]; want(sk) && !yield(sk) {
						return
					}
				}
				return
			}
			sk := &s.img.socks[i]
			if want(sk) && !yield(sk) {
				return
			}
			i = sk.portNext
		}
	}
}

// sockSize is a constant, so that slotOf divides by multiplying.
const sockSize = unsafe.Sizeof(sock{})

func uintptrOf[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

func addrPort(a [4]byte, p uint16) netip.AddrPort { return netip.AddrPortFrom(netip.AddrFrom4(a), p) }
