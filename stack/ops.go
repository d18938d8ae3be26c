package stack

import (
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/xdp-onload/onload/vnic"
)

// The engine's socket operations, which the sockets package wraps. All are
// non-blocking: an operation that would wait returns ErrWouldBlock.

// Events are a socket's readiness bits, for an epoll-like layer.
type Events uint32

const (
	Readable   Events = 1 << iota // a receive would not block
	Writable                      // a send would not block
	Error                         // an error is pending
	Hangup                        // the peer is gone (TCP)
	ReadHangup                    // the peer has sent FIN: reads end (TCP; poll's POLLRDHUP)

	// Edge, in what a waiter wants (WaitForAll), asks for a wake-up at
	// the socket's next change, whatever its readiness now: an
	// edge-triggered waiter (EPOLLET) that has reported the readiness
	// there is already.
	Edge Events = 1 << 31
)

// Ephemeral ports, as Linux's default ip_local_port_range.
const (
	ephemeralLow  = 32768
	ephemeralHigh = 60999
)

// Open makes a socket.
func (s *Stack) Open(p Proto) (SockID, error) {
	if p != UDP && p != TCP {
		return NullSock, ErrNotSupported
	}
	s.lock()
	defer s.unlock()
	_, id, err := s.allocSockLocked(uint8(p))
	s.overflowCheckLocked()
	return id, err
}

// Bind gives a socket its local address and port. The address must be the
// stack's or unspecified; port 0 picks a free ephemeral port.
func (s *Stack) Bind(id SockID, local netip.AddrPort) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	return s.bindLocked(sk, local, sk.bindClaim())
}

// bindClaim is the claim a bind of sk makes on its port: SO_REUSEADDR's,
// or a plain one.
func (sk *sock) bindClaim() portClaim {
	if sk.tflags&tfReuseAddr != 0 {
		return claimReuse
	}
	return claimBind
}

// BindConnecting binds a TCP socket that is about to connect (Connect
// next) to a port its kernel reservation holds. The kernel had the last
// word on the port: it does not know the stack's connections whose users
// closed them (their reservations went with their descriptors), so it
// may hand out one of their ports, in TIME-WAIT. As for the kernel's own
// connect (__inet_hash_connect), connections on the port do not hold it
// against a connecting socket: Connect refuses only a four-tuple in use,
// and takes one over from TIME-WAIT.
func (s *Stack) BindConnecting(id SockID, local netip.AddrPort) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	if sk.kind != kindTCP {
		return s.bindLocked(sk, local, claimBind)
	}
	return s.bindLocked(sk, local, claimConnect)
}

// portClaim is who asks for a port, which decides what holds it against
// them (portInUseLocked).
type portClaim uint8

const (
	claimBind    portClaim = iota // bind(2)
	claimReuse                    // bind(2) with SO_REUSEADDR
	claimConnect                  // a socket about to connect (BindConnecting)
)

func (s *Stack) bindLocked(sk *sock, local netip.AddrPort, claim portClaim) error {
	if sk.flags&sfBound != 0 {
		return ErrInvalid
	}
	var addr [4]byte
	if a := local.Addr(); a.IsValid() && !a.IsUnspecified() {
		if !a.Is4() && !a.Is4In6() || a.Unmap().As4() != s.img.hdr.addr {
			return ErrAddrNotAvail
		}
		addr = a.Unmap().As4()
	}
	port := local.Port()
	if port == 0 {
		var ok bool
		if port, ok = s.ephemeralLocked(sk.kind, addr); !ok {
			return ErrNoPorts
		}
	} else if s.portInUseLocked(sk.kind, addr, port, claim) {
		return ErrAddrInUse
	}
	// A shared port (shared_ports.go) is steered already, by its
	// holder's bind: the filter goes with the last socket on it
	// (releaseSockLocked).
	if s.filters != nil && (sk.kind != kindTCP || s.holderLocked(addr, port) == nil) {
		if err := s.filters.AddListener(Proto(sk.kind), addrPort(addr, port)); err != nil {
			return &Errno{Msg: "steer " + Proto(sk.kind).String() + " port to the stack: " + err.Error(), Errno: ErrAddrInUse.Errno}
		}
	}
	sk.localAddr, sk.localPort = addr, port
	sk.flags |= sfBound
	s.portLinkLocked(sk)
	s.hashLocked(sk)
	return nil
}

// ephemeralLocked finds a free port in the ephemeral range, starting after
// the last one handed out.
func (s *Stack) ephemeralLocked(kind uint8, addr [4]byte) (uint16, bool) {
	return s.freePortLocked(kind, addr, ephemeralLow, ephemeralHigh, nil)
}

// freePortLocked finds a port from lo to hi that no socket of kind is
// bound to on addr (the wildcard: on any address), and that skip (if
// not nil) does not refuse, starting after the last one handed out.
func (s *Stack) freePortLocked(kind uint8, addr [4]byte, lo, hi uint16, skip func(uint16) bool) (uint16, bool) {
	h := s.img.hdr
	n := int(hi) - int(lo) + 1
	for range max(n, 0) {
		p := h.ephemeral
		if p < uint32(lo) || p > uint32(hi) {
			p = uint32(lo)
		}
		h.ephemeral = p + 1
		if (skip == nil || !skip(uint16(p))) && !s.portInUseLocked(kind, addr, uint16(p), claimBind) {
			return uint16(p), true
		}
	}
	return 0, false
}

// FreePort is a port from lo to hi that no socket of protocol p on the
// stack is bound to, in any state (a connection its user closed, still
// sending its FIN, included), and that skip (if not nil) does not
// refuse, for a caller that binds a kernel socket to it before it binds
// the stack's socket beside it (sockets: the kernel's own pick may be
// a port a closed connection of the stack still has to the same peer,
// which the kernel no longer knows of). ErrNoPorts if there is none.
func (s *Stack) FreePort(p Proto, lo, hi uint16, skip func(uint16) bool) (uint16, error) {
	s.lock()
	defer s.unlock()
	var zero [4]byte
	port, ok := s.freePortLocked(uint8(p), zero, lo, hi, skip)
	if !ok {
		return 0, ErrNoPorts
	}
	return port, nil
}

// Connect connects a socket to remote. For TCP it starts the handshake and
// returns ErrInProgress: the socket turns writable when the connection is
// up, or reports the error (ECONNREFUSED, ETIMEDOUT). For UDP it sets the
// peer: sends without a destination go there, and only its datagrams are
// received.
func (s *Stack) Connect(id SockID, remote netip.AddrPort) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	ra, ok := remoteOK(remote)
	if !ok {
		return ErrInvalid
	}
	if sk.kind == kindTCP {
		err := s.connectTCPLocked(sk, remote)
		s.flushLocked()
		return err
	}
	if sk.flags&sfBound == 0 {
		if err := s.bindLocked(sk, netip.AddrPort{}, claimBind); err != nil {
			return err
		}
	}
	mac, _, err := s.nextHopLocked(ra.As4())
	if err != nil && err != errNeighPending {
		return err
	}
	s.unhashLocked(sk)
	sk.localAddr = s.img.hdr.addr
	sk.remoteAddr, sk.remotePort, sk.remoteMAC = ra.As4(), remote.Port(), mac
	sk.tmplValid = false
	sk.flags |= sfConnected
	sk.flags &^= sfRemoteMAC
	if err == nil {
		sk.flags |= sfRemoteMAC
	}
	s.hashLocked(sk)
	return nil
}

// remoteOK is remote's address, unmapped, and whether a connection or a
// datagram may go there: an IPv4 address that is not the wildcard, and a
// port.
func remoteOK(remote netip.AddrPort) (netip.Addr, bool) {
	ra := remote.Addr().Unmap()
	return ra, ra.Is4() && !ra.IsUnspecified() && remote.Port() != 0
}

// SendTo sends one datagram to `to`, or to the connected peer if `to` is
// the zero AddrPort. An unbound socket is bound to an ephemeral port first.
func (s *Stack) SendTo(id SockID, buf []byte, to netip.AddrPort) (int, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return 0, err
	}
	if sk.kind != kindUDP {
		return 0, ErrNotSupported
	}
	var dst [4]byte
	var dport uint16
	switch {
	case to.IsValid():
		a, ok := remoteOK(to)
		if !ok {
			return 0, ErrInvalid
		}
		dst, dport = a.As4(), to.Port()
	case sk.flags&sfConnected != 0:
		dst, dport = sk.remoteAddr, sk.remotePort
	default:
		return 0, ErrDestAddrRequired
	}
	var mac [6]byte
	var neigh *neighbour
	if sk.flags&sfRemoteMAC != 0 && dst == sk.remoteAddr {
		mac = sk.remoteMAC
	} else {
		mac, neigh, err = s.nextHopLocked(dst)
		if err != nil && err != errNeighPending {
			return 0, err
		}
		if err == nil && sk.flags&sfConnected != 0 && dst == sk.remoteAddr {
			sk.remoteMAC = mac
			sk.flags |= sfRemoteMAC
		}
		if err == nil {
			neigh = nil // resolved: send at once
		}
	}
	if sk.flags&sfBound == 0 {
		if err := s.bindLocked(sk, netip.AddrPort{}, claimBind); err != nil {
			return 0, err
		}
	}
	h, err := s.udpBuildLocked(sk, buf, dst, dport, mac)
	if err != nil {
		return 0, err
	}
	if neigh != nil {
		s.holdLocked(neigh, h)
		return len(buf), nil
	}
	s.queueTxLocked(h)
	s.flushLocked()
	return len(buf), nil
}

// RecvFrom copies the next datagram into buf and says who sent it. With
// peek the datagram stays queued.
func (s *Stack) RecvFrom(id SockID, buf []byte, peek bool) (int, netip.AddrPort, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return 0, netip.AddrPort{}, err
	}
	if sk.kind != kindUDP {
		return 0, netip.AddrPort{}, ErrNotSupported
	}
	if sk.rcvHead == vnic.Null && !s.idle() {
		s.pollLocked()
	}
	return s.udpRecvLocked(sk, buf, peek)
}

// Send sends on a connected socket: a TCP stream, or a UDP datagram to the
// connected peer. A TCP send takes what fits the send buffer and returns
// how much; ErrWouldBlock if nothing fits.
func (s *Stack) Send(id SockID, buf []byte) (int, error) { return s.send(id, buf, false, false) }

// SendMore is Send from a caller who knows more sends follow in a moment
// (other threads of this process are about to send): the segments go on
// the NIC's ring, and its kick waits for the next send or poll, which
// gives the kernel them all in one system call (vnic.KickHolder; a NIC
// that cannot hold its kicks kicks as usual).
func (s *Stack) SendMore(id SockID, buf []byte) (int, error) { return s.send(id, buf, true, false) }

// SendCorked is SendMore from a caller that will come back to a wait
// (KickHeld) or poll the stack itself before long, whatever other
// threads do (the LD_PRELOAD shim's): its last partial segment may wait
// for that too (autocorking, tcp_autocork.go).
func (s *Stack) SendCorked(id SockID, buf []byte) (int, error) { return s.send(id, buf, true, true) }

func (s *Stack) send(id SockID, buf []byte, more, cork bool) (int, error) {
	s.lock()
	sk, err := s.sockLocked(id)
	if err != nil {
		s.unlock()
		return 0, err
	}
	if sk.kind == kindUDP {
		s.unlock()
		return s.SendTo(id, buf, netip.AddrPort{})
	}
	held := s.holdKicksLocked(more)
	s.kickNow, s.autocork = true, cork
	n, err := s.tcpSendLocked(sk, buf)
	s.kickNow, s.autocork = false, false
	s.flushLocked()
	s.releaseKicksLocked(held)
	s.unlock()
	return n, err
}

// holdKicksLocked puts the NIC's kicks off if more calls follow in a
// moment and the NIC can hold them; it reports whether it did.
func (s *Stack) holdKicksLocked(more bool) bool {
	if !more || s.kicks == nil {
		return false
	}
	s.kicks.HoldKicks(true)
	return true
}

// releaseKicksLocked ends what holdKicksLocked began. The kick owed is the
// next send's or poll's, or KickHeld's.
func (s *Stack) releaseKicksLocked(held bool) {
	if held {
		s.kicks.HoldKicks(false)
	}
}

// KickOwed reports, without the lock, that frames SendMore or RecvMore
// left on the NIC's ring wait for their kick (KickHeld).
func (s *Stack) KickOwed() bool {
	return s.kicks != nil && s.kicks.KickOwed() || s.corkedN.Load() != 0
}

// CorkedOwed reports, without the lock, whether sockets wait in the
// process's corked list for their holder's next wait (a segment
// SendCorked held, an ACK RecvCorked held): KickHeld or any poll sends
// them. Unlike KickOwed, a kick the NIC holds does not count.
func (s *Stack) CorkedOwed() bool { return s.corkedN.Load() != 0 }

// DrainNIC waits, for at most timeout and without the stack lock, until
// the NIC has taken every frame the stack handed it (vnic.Drainer); true
// at once for a NIC that cannot say. For a process about to end.
func (s *Stack) DrainNIC(timeout time.Duration) bool {
	if d, ok := s.nic.(vnic.Drainer); ok {
		return d.Drain(timeout)
	}
	return true
}

// KickHeld hands the NIC the frames SendMore and RecvMore left waiting for
// their kick. The caller of a More operation owes it once the others it
// counted on are done: a goroutine that was to send may instead find
// its data queued already, or its send buffer full, and send nothing,
// and an armed interrupt wakes nobody for frames that never left. It
// costs one atomic load when nothing is owed.
func (s *Stack) KickHeld() {
	if !s.KickOwed() {
		return
	}
	s.lock()
	if len(s.corked) > 0 {
		s.pushAutoCorkedLocked()
		s.flushLocked()
	}
	if s.kicks != nil {
		s.kicks.Kick()
	}
	s.unlock()
}

// Recv receives from a socket into buf. For TCP, 0 with a nil error is the
// end of the stream; ErrWouldBlock means nothing has arrived yet. With
// peek the data stays queued. When nothing is queued it polls the stack
// first.
func (s *Stack) Recv(id SockID, buf []byte, peek bool) (int, error) {
	return s.recv(id, buf, peek, false, false)
}

// RecvMore is Recv from a caller who knows other threads of this process
// are about to call into the stack: the frames its poll sends (a response
// another thread queued with SendMore, an acknowledgement) wait for their
// kick, as SendMore's do.
func (s *Stack) RecvMore(id SockID, buf []byte, peek bool) (int, error) {
	return s.recv(id, buf, peek, true, false)
}

// RecvCorked is Recv from a caller that will come back to a wait
// (KickHeld) or poll the stack itself before long (the LD_PRELOAD
// shim's), as SendCorked's is: an ACK its read owes may wait for that, or
// for its answer to carry it (holdAckLocked).
func (s *Stack) RecvCorked(id SockID, buf []byte, peek bool) (int, error) {
	return s.recv(id, buf, peek, false, true)
}

func (s *Stack) recv(id SockID, buf []byte, peek, more, cork bool) (int, error) {
	if s.nothingToRecv(id) {
		return 0, ErrWouldBlock
	}
	s.lock()
	sk, err := s.sockLocked(id)
	if err != nil {
		s.unlock()
		return 0, err
	}
	held := s.holdKicksLocked(more)
	if sk.rcvHead == vnic.Null {
		// Nothing queued: poll the NIC first, as Onload's recv does, so
		// that a busy reader needs one lock round per message. (No idle
		// check first: nothingToRecv has just made it, and a frame that
		// arrived is waiting behind a second one.)
		s.pollLocked()
	}
	var n int
	if sk.kind == kindUDP {
		n, _, err = s.udpRecvLocked(sk, buf, peek)
	} else {
		s.ackHold = cork
		n, err = s.tcpRecvLocked(sk, buf, peek)
		s.ackHold = false
		s.flushLocked()
	}
	s.releaseKicksLocked(held)
	s.unlock()
	return n, err
}

// nothingToRecv reports, without the lock, that a Recv on id would find
// nothing and that polling would bring nothing in: a busy reader's empty
// spins end here. It reads the socket's words racily, as a hint: any doubt
// (another process changing them, a socket that is not a plain open one)
// sends the caller down the locked path.
func (s *Stack) nothingToRecv(id SockID) bool {
	idx := id.index()
	if idx >= uint32(len(s.img.socks)) {
		return false
	}
	sk := &s.img.socks[idx]
	// Each word read atomically: the lock holder may be writing it.
	if atomic.LoadUint32(&sk.gen) != id.gen() || sk.racyKind() != kindTCP || sk.racyState() != tcpEstablished ||
		vnic.Handle(atomic.LoadUint32((*uint32)(&sk.rcvHead))) != vnic.Null || atomic.LoadUint32(&sk.err) != 0 ||
		atomic.LoadUint32(&sk.tflags)&(tfRcvFin|tfShutRd|tfOrphan) != 0 {
		return false
	}
	return s.idle()
}

// SockError returns and clears the socket's pending error (SO_ERROR).
func (s *Stack) SockError(id SockID) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	if sk.err == 0 {
		return nil
	}
	e := sk.err
	sk.err = 0
	return errnoError(e)
}

// Close releases a socket: its queued frames, its port and its slot. A
// listener other processes share (ShareListener) stays theirs: this
// process only lets go of its share.
func (s *Stack) Close(id SockID) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	if self := procBit(s.proc()); self != 0 && sk.openers&^self != 0 {
		sk.openers &^= self
		sk.waiters &^= self
		return nil
	}
	s.closeLocked(sk)
	return nil
}

func (s *Stack) closeLocked(sk *sock) {
	if sk.kind == kindTCP {
		s.tcpCloseLocked(sk)
		s.flushLocked()
		return
	}
	for h := s.dequeueRcvLocked(sk); h != 0; h = s.dequeueRcvLocked(sk) {
		s.pool.Free(h)
	}
	s.releaseSockLocked(sk)
}

// portSharedLocked reports whether another socket is bound to sk's port.
func (s *Stack) portSharedLocked(sk *sock) bool {
	for o := range s.boundToLocked(sk.kind, sk.localPort) {
		if o != sk {
			return true
		}
	}
	return false
}

// LocalAddr is the socket's bound address and port.
func (s *Stack) LocalAddr(id SockID) (netip.AddrPort, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return addrPort(sk.localAddr, sk.localPort), nil
}

// RemoteAddr is the socket's peer, if it is connected.
func (s *Stack) RemoteAddr(id SockID) (netip.AddrPort, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if sk.flags&sfConnected == 0 {
		return netip.AddrPort{}, nil
	}
	return addrPort(sk.remoteAddr, sk.remotePort), nil
}

// Events reports the socket's readiness.
func (s *Stack) Events(id SockID) Events {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return Error | Hangup
	}
	return s.eventsLocked(sk)
}

// EventsOf reports the readiness of many sockets under one taking of
// the lock: out[i] for ids[i] (Error|Hangup for a closed or unknown one,
// 0 for NullSock). edges (unless nil) gets each socket's count of edges
// (edgeLocked): a caller emulating edge-triggered readiness reports a
// socket again when its count moved, as the kernel's EPOLLET reports
// every wake-up of a socket.
func (s *Stack) EventsOf(ids []SockID, out []Events, edges []uint32) {
	s.lock()
	defer s.unlock()
	for i, id := range ids {
		out[i] = 0
		if id == NullSock {
			continue
		}
		if sk, err := s.sockLocked(id); err != nil {
			out[i] = Error | Hangup
		} else {
			out[i] = s.eventsLocked(sk)
			if edges != nil {
				edges[i] = sk.edges
			}
		}
	}
}

func (s *Stack) eventsLocked(sk *sock) Events {
	var ev Events
	if sk.err != 0 {
		ev |= Error
	}
	if sk.kind == kindTCP {
		return ev | s.tcpEventsLocked(sk)
	}
	if sk.rcvHead != 0 {
		ev |= Readable
	}
	if s.pool.Available() > 0 {
		ev |= Writable
	}
	return ev
}

// rcvReady reports that a connection with data queued is readable under
// its SO_RCVLOWAT (Linux's tcp_epollin_ready): with the mark's bytes, or
// with any once the window left open to the peer is no more than a
// segment (the buffer, or the connection's share of the NIC, cannot take
// what the mark asks, and the reader would wait for ever).
func (sk *sock) rcvReady() bool {
	if sk.rcvBytes >= sk.rcvLowat {
		return true
	}
	return !sk.rcvNxt.LessThan(sk.rcvAdv) || uint32(sk.rcvNxt.Size(sk.rcvAdv)) <= uint32(sk.mss)
}

// notSent is how many queued bytes were never sent (Linux's
// write_seq - snd_nxt).
func (sk *sock) notSent() uint32 {
	inFlight := uint32(sk.sndUna.Size(sk.sndMax))
	return sk.sndBytes - min(sk.sndBytes, inFlight)
}

// notsentLowatOf is sk's TCP_NOTSENT_LOWAT: its own, or where it set none
// the stack's (net.ipv4.tcp_notsent_lowat, Config.NotSentLowat), as
// Linux's tcp_notsent_lowat; 0 is no limit.
func (s *Stack) notsentLowatOf(sk *sock) uint32 {
	if sk.notsentLowat != 0 {
		return sk.notsentLowat
	}
	return s.img.hdr.notsentLowat
}

// notsentFreeLocked says whether sk's unsent bytes leave it writable:
// twice them under its TCP_NOTSENT_LOWAT (tcp_stream_memory_free with
// wake set), or it has none.
func (s *Stack) notsentFreeLocked(sk *sock) bool {
	m := s.notsentLowatOf(sk)
	return m == 0 || 2*uint64(sk.notSent()) < uint64(m)
}

func (s *Stack) tcpEventsLocked(sk *sock) Events {
	var ev Events
	if sk.state == tcpListen {
		if sk.acceptLen > 0 {
			ev |= Readable
		}
		return ev
	}
	if sk.rcvHead != 0 && sk.rcvReady() || sk.tflags&(tfRcvFin|tfShutRd) != 0 || sk.err != 0 {
		ev |= Readable
	}
	if sk.tflags&tfRcvFin != 0 {
		ev |= ReadHangup
	}
	switch sk.state {
	case tcpEstablished, tcpCloseWait:
		if sk.tflags&tfFinQueued == 0 && sk.sndBytes < sk.sndBuf && s.pool.Available() > 0 &&
			s.notsentFreeLocked(sk) {
			ev |= Writable
		}
	case tcpClosed:
		if sk.flags&sfConnected != 0 {
			ev |= Readable | Writable | Hangup | ReadHangup
		}
	}
	if sk.tflags&tfRcvFin != 0 && sk.tflags&tfFinQueued != 0 {
		ev |= Hangup
	}
	return ev
}
