package stack

import (
	"crypto/sha256"
	"encoding/binary"
	"net/netip"
	"syscall"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/seqnum"

	"github.com/xdp-onload/onload/vnic"
)

// Pending errors kept in a socket, reported once by the next operation
// (and by SockError).
const (
	errConnRefused = uint32(syscall.ECONNREFUSED)
	errConnReset   = uint32(syscall.ECONNRESET)
	errPipe        = uint32(syscall.EPIPE)
	errTimedOut    = uint32(syscall.ETIMEDOUT)
)

// isnLocked picks an initial sequence number (RFC 6528): a clock ticking
// every 4µs plus a keyed hash of the connection's addresses, so that
// numbers are unpredictable off-path yet increase for one 4-tuple.
func (s *Stack) isnLocked(sk *sock) seqnum.Value {
	var in [16 + 12]byte
	copy(in[:16], s.img.hdr.isnKey[:])
	copy(in[16:20], sk.localAddr[:])
	copy(in[20:24], sk.remoteAddr[:])
	binary.BigEndian.PutUint16(in[24:], sk.localPort)
	binary.BigEndian.PutUint16(in[26:], sk.remotePort)
	sum := sha256.Sum256(in[:])
	return seqnum.Value(binary.BigEndian.Uint32(sum[:4]) + uint32(nanotime()/4000))
}

// rcvWSFor is the window scale that lets a buffer of n bytes be advertised.
func rcvWSFor(n uint32) uint8 {
	var ws uint8
	for n>>ws > 0xffff && ws < 14 {
		ws++
	}
	return ws
}

// Listen makes a TCP socket accept connections (binding it to an ephemeral
// port if it is not bound). backlog bounds the connections waiting for
// Accept and, separately, those still in the handshake (0: 128).
func (s *Stack) Listen(id SockID, backlog int) error {
	local, err := s.listen(id, backlog)
	if err != nil || !local.IsValid() {
		return err
	}
	// Outside the lock: it opens the thread's network namespace.
	if c, ok := s.filters.(KernelFlowsChecker); ok {
		c.CheckKernelFlows(TCP, local)
	}
	return nil
}

// BindListen binds TCP socket id to local and makes it listen, in one
// hold of the stack lock. Between a Bind and a Listen the port is steered
// to the stack already (the filter goes in at bind), and a SYN that a
// poll took in between would find a bound socket that does not listen
// and draw a reset: a connection refused on a port whose program
// listens, in the kernel (the shim's listener, accelerated after the
// program's listen) or about to (a cluster's member joining).
func (s *Stack) BindListen(id SockID, local netip.AddrPort, backlog int) error {
	bound, err := s.bindListen(id, local, backlog)
	if err != nil {
		return err
	}
	if c, ok := s.filters.(KernelFlowsChecker); ok {
		c.CheckKernelFlows(TCP, bound)
	}
	return nil
}

func (s *Stack) bindListen(id SockID, local netip.AddrPort, backlog int) (netip.AddrPort, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return netip.AddrPort{}, err
	}
	if sk.kind != kindTCP {
		return netip.AddrPort{}, ErrNotSupported
	}
	if err := s.bindLocked(sk, local, sk.bindClaim()); err != nil {
		return netip.AddrPort{}, err
	}
	return s.listenLocked(sk, backlog)
}

// listen is Listen under the stack lock. It returns the address of a
// socket it turned into a listener, and none for one already listening.
func (s *Stack) listen(id SockID, backlog int) (netip.AddrPort, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return s.listenLocked(sk, backlog)
}

// listenLocked turns sk into a listener (binding it to an ephemeral port
// if it is not bound).
func (s *Stack) listenLocked(sk *sock, backlog int) (netip.AddrPort, error) {
	if sk.kind != kindTCP {
		return netip.AddrPort{}, ErrNotSupported
	}
	if sk.state == tcpListen {
		sk.backlog = uint16(clampBacklog(backlog))
		return netip.AddrPort{}, nil
	}
	if sk.state != tcpClosed || sk.flags&sfConnected != 0 {
		return netip.AddrPort{}, ErrInvalid
	}
	if sk.flags&sfBound == 0 {
		if err := s.bindLocked(sk, netip.AddrPort{}, claimBind); err != nil {
			return netip.AddrPort{}, err
		}
	}
	sk.state = tcpListen
	sk.backlog = uint16(clampBacklog(backlog))
	sk.acceptHead, sk.acceptTail = noSlot, noSlot
	return addrPort(sk.localAddr, sk.localPort), nil
}

// ShareListener gives this process a share of the TCP listener bound to
// local (its address, or the wildcard for an invalid one) that another
// process of the shared stack made: the workers of a pre-fork server,
// which inherited one listening socket or hold sockets of one
// SO_REUSEPORT group (either way the kernel has let each of them hold
// the port), accept from one queue, as Onload's processes do within a
// stack. Every worker waiting on it is woken by a connection; the first
// to accept takes it. The listener closes when its last holder lets go
// (Close, or its process's death: CloseAbandonedBy). ok is false when the
// stack has no such listener, or when this handle shares no wakes
// (JoinWakes).
//
// A listener retired as its process passed its socket on (RetireListener)
// is this process's to share when it is the one that received it: the
// port comes back to the stack, steered again (filters' AddListener, which
// may refuse: ok is false then, and it stays retired), and both processes
// accept from its queue, as both would from the socket on the kernel.
// Those the kernel's socket took meanwhile wait there for either.
func (s *Stack) ShareListener(local netip.AddrPort) (id SockID, ok bool) {
	self := procBit(s.proc())
	if self == 0 {
		return NullSock, false
	}
	var addr [4]byte
	if a := local.Addr(); a.Is4() {
		addr = a.As4()
	}
	s.lock()
	defer s.unlock()
	sk := s.findLocked(kindTCP, addr, local.Port(), [4]byte{}, 0)
	if sk == nil || sk.state != tcpListen {
		return NullSock, false
	}
	if sk.flags&sfListenRetired != 0 {
		if s.filters != nil && s.filters.AddListener(TCP, addrPort(sk.localAddr, sk.localPort)) != nil {
			return NullSock, false
		}
		sk.flags &^= sfListenRetired
		if sk.tflags&tfOrphan != 0 {
			// Closed by the process that passed it, kept for this one
			// (lingerRetiredLocked).
			sk.tflags &^= tfOrphan
			s.img.wheel.Cancel(s.sockTimer(sk, timerTW))
		}
	}
	sk.openers |= self
	return s.idOf(sk), true
}

func clampBacklog(b int) int {
	if b <= 0 {
		return defaultBacklog
	}
	return min(b, 4096)
}

// listenInputLocked handles a segment for a listening socket (RFC 9293
// 3.10.7.2): a SYN makes a child in SYN-RECEIVED and answers with a
// SYN-ACK.
func (s *Stack) listenInputLocked(l *sock, h vnic.Handle, p *ipPacket, g *segment) {
	c := &s.img.hdr.counters
	if g.flags&flagRST != 0 {
		s.pool.Free(h)
		return
	}
	if g.flags&flagACK != 0 {
		if g.flags&flagSYN == 0 && s.cookieAckLocked(l, h, p, g) {
			return
		}
		c.TCPSynCookiesFailed++
		s.resetReplyLocked(s.pool.Data(h), p, g.sport, g.dport, g.seq, g.ack, g.flags, int(g.len()))
		s.pool.Free(h)
		return
	}
	defer s.pool.Free(h)
	if g.flags&flagSYN == 0 {
		return
	}
	if l.flags&sfListenRetired != 0 {
		// The port is the kernel's now (RetireListener), and a SYN that
		// reaches the stack before the filter is gone is dropped: its
		// retransmission finds the kernel's socket. Taken here, the
		// handshake's ACK could come after the filter went, to the
		// kernel, which answers it with a reset (a forked server's
		// client, TestShimForkServerToKernel, once).
		c.TCPListenDrops++
		return
	}
	if l.acceptLen >= l.backlog || s.img.hdr.overflow != 0 {
		// A full accept queue; or a socket table nearly full of live
		// connections, whose new ones go to the listener's kernel half:
		// the steering passes their SYNs there once it knows
		// (Options.Overflow; onloadd mirrors it for its stacks within a
		// grace period), and this one's retransmission goes there.
		c.TCPListenDrops++
		return
	}
	if hd := s.img.hdr; l.synLen >= l.backlog || hd.sockInUse >= hd.sockets-hd.sockets/8 {
		// The SYN queue is full, perhaps of a flood's spoofed SYNs, or the
		// socket table nearly is: answer statelessly (RFC 4987 3.6), so
		// real clients still get in and a flood cannot take every socket.
		s.sendCookieSynAckLocked(l, s.pool.Data(h), p, g)
		return
	}
	child := s.passiveChildLocked(l, h, p, g)
	if child == nil {
		return
	}
	child.state = tcpSynReceived
	if l.deferAccept > 0 { // TCP_DEFER_ACCEPT: the handshake's ACK waits for data
		child.deferAccept = max(s.tsNow()+l.deferAccept*1000, 1)
	}
	child.irs = g.seq
	child.rcvNxt = g.seq.Add(1)
	child.rcvAdv = child.rcvNxt
	child.rcvWS = rcvWSFor(s.rcvBufMax(child))
	s.negotiateLocked(child, &g.opts)
	child.iss = s.isnLocked(child)
	child.sndUna = child.iss
	child.sndNxt = child.iss.Add(1)
	child.sndMax = child.sndNxt
	child.sndWnd = uint32(g.wnd)
	child.synTime = s.micros()
	s.hashLocked(child)
	l.synLen++
	s.img.hdr.sockSynRcvd++
	c.TCPPassiveOpens++
	s.controlLocked(child, flagSYN|flagACK, child.iss)
	s.armRTOLocked(child, true)
}

// passiveChildLocked makes the socket of a connection to listener l from
// the segment that asked for it (a SYN, or the ACK of a SYN cookie): its
// addresses, its way back and what it inherits from l.
func (s *Stack) passiveChildLocked(l *sock, h vnic.Handle, p *ipPacket, g *segment) *sock {
	child, _, err := s.allocSockLocked(kindTCP)
	if err != nil {
		s.img.hdr.counters.TCPListenDrops++
		return nil
	}
	frame := s.pool.Data(h)
	child.localAddr, child.localPort = p.dst, g.dport
	child.remoteAddr, child.remotePort = p.src, g.sport
	copy(child.remoteMAC[:], frame[6:12]) // answer the way the segment came
	child.flags = sfBound | sfConnected | sfRemoteMAC
	s.portLinkLocked(child)
	child.tflags = tfPassive | tfOrphan | l.tflags&(tfNoDelay|tfCork|tfKeepAlive|tfLinger0|tfReuseAddr)
	child.rcvBuf, child.sndBuf = l.rcvBuf, l.sndBuf
	child.flags |= l.flags & (sfRcvBufSet | sfSndBufSet)
	child.ccAlgo = l.ccAlgo
	child.userTimeout = l.userTimeout
	child.rcvLowat, child.notsentLowat = l.rcvLowat, l.notsentLowat
	child.tos, child.ttl = l.tos, l.ttl
	child.keepIdle, child.keepIntvl, child.keepCnt = l.keepIdle, l.keepIntvl, l.keepCnt
	child.parent = s.slotOf(l)
	child.acceptNext = noSlot
	child.lastRcv = uint32(s.nowTick())
	return child
}

// establishedChildLocked moves a passive child that completed its
// handshake to its listener's accept queue.
func (s *Stack) establishedChildLocked(child *sock) {
	s.img.hdr.sockSynRcvd -= min(s.img.hdr.sockSynRcvd, 1)
	s.overflowCheckLocked() // one more live connection
	l := s.parentLocked(child)
	if l == nil {
		// The listener is gone: nobody will accept this connection.
		s.controlLocked(child, flagRST, child.sndNxt)
		s.tcpCloseFinalLocked(child)
		return
	}
	l.synLen -= min(l.synLen, 1)
	if l.acceptLen >= l.backlog {
		s.img.hdr.counters.TCPListenDrops++
		s.controlLocked(child, flagRST, child.sndNxt)
		child.tflags &^= tfPassive // already taken off the SYN count
		s.tcpCloseFinalLocked(child)
		return
	}
	idx := s.slotOf(child)
	child.acceptNext = noSlot
	if l.acceptTail == noSlot {
		l.acceptHead = idx
	} else if l.acceptTail < uint32(len(s.img.socks)) {
		s.img.socks[l.acceptTail].acceptNext = idx
	}
	l.acceptTail = idx
	l.acceptLen++
	child.tflags |= tfInAcceptQ
	s.touchLocked(l)
}

// parentLocked is a passive child's listener, if it still listens.
func (s *Stack) parentLocked(child *sock) *sock {
	if child.parent >= uint32(len(s.img.socks)) {
		return nil
	}
	l := &s.img.socks[child.parent]
	if l.kind != kindTCP || l.state != tcpListen || l.localPort != child.localPort {
		return nil
	}
	return l
}

// Accept takes the next established connection from a listening socket.
func (s *Stack) Accept(id SockID) (SockID, error) {
	s.lock()
	defer s.unlock()
	l, err := s.sockLocked(id)
	if err != nil {
		return NullSock, err
	}
	if l.kind != kindTCP || l.state != tcpListen {
		return NullSock, ErrInvalid
	}
	idx := l.acceptHead
	if idx == noSlot || idx >= uint32(len(s.img.socks)) {
		return NullSock, ErrWouldBlock
	}
	child := &s.img.socks[idx]
	l.acceptHead = child.acceptNext
	if l.acceptHead == noSlot {
		l.acceptTail = noSlot
	}
	l.acceptLen -= min(l.acceptLen, 1)
	child.acceptNext, child.parent = noSlot, noSlot
	child.tflags &^= tfInAcceptQ | tfOrphan
	child.tflags |= tfAccepted
	child.openers = procBit(s.proc())
	return s.idOf(child), nil
}

// unlinkAcceptLocked takes a child out of its listener's accept queue.
func (s *Stack) unlinkAcceptLocked(l, child *sock) {
	idx := s.slotOf(child)
	link := &l.acceptHead
	var prev uint32 = noSlot
	for steps := 0; *link != noSlot && steps < len(s.img.socks); steps++ {
		if *link == idx {
			*link = child.acceptNext
			if l.acceptTail == idx {
				l.acceptTail = prev
			}
			l.acceptLen -= min(l.acceptLen, 1)
			break
		}
		if *link >= uint32(len(s.img.socks)) {
			s.img.hdr.counters.ImageCorrupt++
			break
		}
		prev = *link
		link = &s.img.socks[*link].acceptNext
	}
	child.tflags &^= tfInAcceptQ
}

// connectTCPLocked starts an active open (RFC 9293 3.10.1): a SYN, and
// SYN-SENT. The result arrives later: the socket turns writable, or
// reports ECONNREFUSED or ETIMEDOUT.
func (s *Stack) connectTCPLocked(sk *sock, remote netip.AddrPort) error {
	switch {
	case sk.state == tcpSynSent || sk.state == tcpSynReceived:
		return ErrAlready
	case sk.state != tcpClosed || sk.tflags&tfAccepted != 0:
		return ErrIsConn
	case sk.flags&sfConnected != 0:
		return ErrInvalid // a connection that ended: make a new socket
	}
	ra := remote.Addr().Unmap()
	if sk.flags&sfBound == 0 {
		if err := s.bindLocked(sk, netip.AddrPort{}, claimBind); err != nil {
			return err
		}
	}
	// The four-tuple must be free (RFC 9293 3.4, as Linux's
	// __inet_check_established): a connection on it in TIME-WAIT ends
	// now, and the new one starts past its sequence space (RFC 6191's
	// condition, as Linux's tcp_twsk_unique gives write_seq); any other
	// keeps it.
	var twNxt seqnum.Value
	tw := false
	if old := s.findLocked(kindTCP, s.img.hdr.addr, sk.localPort, ra.As4(), remote.Port()); old != nil && old != sk {
		if old.state != tcpTimeWait {
			return ErrTupleInUse
		}
		twNxt, tw = old.sndNxt, true
		s.tcpCloseFinalLocked(old)
		s.img.hdr.counters.TCPTimeWaitReuse++
	}
	s.unhashLocked(sk)
	sk.localAddr = s.img.hdr.addr
	sk.remoteAddr, sk.remotePort = ra.As4(), remote.Port()
	sk.tmplValid = false
	sk.flags |= sfConnected
	s.hashLocked(sk)
	sk.rcvWS = rcvWSFor(s.rcvBufMax(sk))
	sk.mss = s.advMSS()
	sk.cwnd = initialCwnd * uint32(sk.mss)
	sk.ssthresh = ^uint32(0)
	sk.iss = s.isnLocked(sk)
	if floor := twNxt.Add(0xffff + 2); tw && sk.iss.LessThan(floor) {
		sk.iss = floor
	}
	sk.sndUna = sk.iss
	sk.sndNxt = sk.iss.Add(1)
	sk.sndMax = sk.sndNxt
	sk.state = tcpSynSent
	sk.synTime = s.micros()
	s.img.hdr.counters.TCPActiveOpens++
	s.controlLocked(sk, flagSYN, sk.iss)
	s.armRTOLocked(sk, true)
	return ErrInProgress
}

// tcpFailLocked ends a connection with an error the user will see. A
// child in its listener's accept queue is its user's already: it stays
// there, CLOSED, as Linux's does after tcp_done (its accept returns it,
// and its first read, after what arrived in order, the error), where
// BSD's TCP drops it.
func (s *Stack) tcpFailLocked(sk *sock, errno uint32) {
	if sk.tflags&tfInAcceptQ != 0 {
		sk.tflags &^= tfOrphan
	}
	if sk.tflags&tfOrphan == 0 {
		sk.err = errno
	}
	// What arrived in order stays readable, then the error, as in Linux
	// (tcp_reset and tcp_done keep the receive queue): the peer has our
	// ACK for it. What arrived out of order can never be read.
	s.pruneOOOLocked(sk)
	s.tcpCloseFinalLocked(sk)
}

// tcpCloseFinalLocked ends a connection: timers stop, frames go back,
// the tuple leaves the table. An orphan's slot is freed; a socket the user
// still holds stays, CLOSED, until the user closes it, and what it has not
// read stays readable.
func (s *Stack) tcpCloseFinalLocked(sk *sock) {
	s.cancelTimersLocked(sk)
	s.lateForgetLocked(sk)
	s.freeSendLocked(sk)
	if sk.tflags&tfOrphan != 0 {
		s.freeQueuesLocked(sk, false)
	}
	if sk.tflags&tfPassive != 0 && sk.tflags&tfAccepted == 0 {
		if sk.state == tcpSynReceived {
			s.img.hdr.sockSynRcvd -= min(s.img.hdr.sockSynRcvd, 1)
		}
		if l := s.parentLocked(sk); l != nil {
			if sk.tflags&tfInAcceptQ != 0 && sk.tflags&tfOrphan != 0 {
				s.unlinkAcceptLocked(l, sk) // not a failed one: tcpFailLocked
			} else if sk.state == tcpSynReceived && l.synLen > 0 {
				l.synLen -= min(l.synLen, 1)
			}
		}
	}
	if sk.state == tcpTimeWait {
		// Every TCP socket's slot is freed through here, CLOSED first:
		// the one place a TIME-WAIT socket leaves the count.
		s.img.hdr.sockTimeWait -= min(s.img.hdr.sockTimeWait, 1)
	}
	if sk.flags&sfTimeWaitList != 0 {
		s.twUnlinkLocked(sk)
	}
	sk.state = tcpClosed
	sk.tflags &^= tfAckNow | tfDelAck
	sk.flags &^= sfAckHeld
	if sk.tflags&tfOrphan != 0 {
		s.releaseSockLocked(sk)
	}
}

// retireListenerLocked ends the filter of port local, whose listener
// closed while its accepted connections live on, or was retired
// (RetireListener), if no other socket of the stack listens there:
// onloadd's filters do it (ListenerRetirer); a stack's own steers each
// connection by a flow entry (FlowSteerer) and removes the port's
// listener entry. A port with no socket left had its filter removed as
// the listener's slot was freed.
func (s *Stack) retireListenerLocked(local netip.AddrPort) {
	var conns []*sock
	retired := false
	for o := range s.boundToLocked(kindTCP, local.Port()) {
		switch {
		case o.state == tcpListen && o.flags&sfListenRetired != 0:
			retired = true
		case o.state == tcpListen || o.flags&sfPortHolder != 0:
			return
		default:
			conns = append(conns, o)
		}
	}
	if len(conns) == 0 && !retired {
		return
	}
	if r, ok := s.filters.(ListenerRetirer); ok {
		r.RetireListener(TCP, local)
		return
	}
	fs, ok := s.filters.(FlowSteerer)
	if !ok {
		return
	}
	for _, c := range conns {
		if c.flags&(sfConnected|sfFlowSteered) != sfConnected {
			continue
		}
		if fs.SteerFlow(TCP, addrPort(c.localAddr, c.localPort), addrPort(c.remoteAddr, c.remotePort)) != nil {
			return // the port stays steered: no connection loses its frames
		}
		c.flags |= sfFlowSteered
	}
	s.filters.RemoveListener(TCP, local)
}

// RetireListener gives listener id's port to the kernel while the
// listener lives on: its socket was passed to another process
// (SCM_RIGHTS), which shares the kernel's socket and not the stack. New
// connections go to that kernel socket from now on, where either process
// may accept them, as they share one socket on the kernel; those the
// listener holds stay in its queue, and its connections keep their
// frames by flow entries (retireListenerLocked). ErrInvalid for a socket
// that does not listen.
func (s *Stack) RetireListener(id SockID) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	if sk.kind != kindTCP || sk.state != tcpListen {
		return ErrInvalid
	}
	if sk.flags&sfListenRetired == 0 {
		sk.flags |= sfListenRetired
		s.retireListenerLocked(addrPort(sk.localAddr, sk.localPort))
	}
	return nil
}

// listenLinger is how long a retired listener closed with connections in
// its queue waits for another process of the stack to share it
// (lingerRetiredLocked).
const listenLinger = time.Second

// lingerRetiredLocked keeps listener sk (slot me), which its last holder
// closes, for listenLinger, if it was retired (RetireListener: its socket
// went to another process) and connections wait in its queue, on a stack
// processes share: the process it was passed to, if it shares the stack,
// takes it (ShareListener) and accepts them, as it would from the socket
// they share on the kernel; otherwise they are reset at the end, as at a
// close. A server's reload passes its listener and closes its copy at
// once, before the new process has looked at the listener it received.
func (s *Stack) lingerRetiredLocked(sk *sock, me uint32) bool {
	if sk.flags&sfListenRetired == 0 || sk.tflags&tfOrphan != 0 || procBit(s.proc()) == 0 {
		return false
	}
	waiting := false
	for i := range s.img.socks {
		if waitsIn(&s.img.socks[i], me) {
			waiting = true
			break
		}
	}
	if !waiting {
		return false
	}
	sk.tflags |= tfOrphan
	sk.openers, sk.waiters = 0, 0
	s.img.wheel.Set(s.sockTimer(sk, timerTW), s.nowTick()+s.ticks(listenLinger))
	return true
}

// waitsIn reports whether c is a connection of the listener in slot me
// that no user has accepted yet (in its queue, or still in its handshake).
func waitsIn(c *sock, me uint32) bool {
	return c.kind == kindTCP && c.tflags&tfPassive != 0 && c.tflags&tfAccepted == 0 && c.parent == me
}

// releaseSockLocked frees a socket's slot: out of the table, its port
// unsteered if no other socket uses it.
func (s *Stack) releaseSockLocked(sk *sock) {
	if sk.flags&sfFlowSteered != 0 {
		if fs, ok := s.filters.(FlowSteerer); ok {
			fs.UnsteerFlow(TCP, addrPort(sk.localAddr, sk.localPort), addrPort(sk.remoteAddr, sk.remotePort))
		}
	}
	s.unhashLocked(sk)
	if sk.flags&sfBound != 0 && s.filters != nil && !s.portSharedLocked(sk) {
		s.filters.RemoveListener(Proto(sk.kind), addrPort(sk.localAddr, sk.localPort))
	}
	s.freeSockLocked(sk)
}

// tcpCloseLocked is the user's close (RFC 9293 3.10.4). A connection
// with data the user never read, or with SO_LINGER 0, is reset; otherwise
// the FIN follows the queued data and the socket lives on, orphaned, until
// the connection ends.
func (s *Stack) tcpCloseLocked(sk *sock) {
	switch sk.state {
	case tcpClosed, tcpSynSent:
		sk.tflags |= tfOrphan
		s.tcpCloseFinalLocked(sk)
		return
	case tcpListen:
		me := s.slotOf(sk)
		if s.lingerRetiredLocked(sk, me) {
			return
		}
		for i := range s.img.socks {
			c := &s.img.socks[i]
			if waitsIn(c, me) {
				if synchronized(c.state) {
					s.controlLocked(c, flagRST, c.sndNxt)
				}
				c.tflags |= tfOrphan
				s.tcpCloseFinalLocked(c)
			}
		}
		local := addrPort(sk.localAddr, sk.localPort)
		sk.tflags |= tfOrphan
		s.tcpCloseFinalLocked(sk)
		s.retireListenerLocked(local)
		return
	}
	sk.tflags |= tfOrphan
	if sk.tflags&tfLinger0 != 0 || sk.rcvBytes > 0 {
		if sk.state != tcpTimeWait {
			s.controlLocked(sk, flagRST, sk.sndNxt)
		}
		s.tcpCloseFinalLocked(sk)
		return
	}
	switch sk.state {
	case tcpSynReceived, tcpEstablished, tcpCloseWait:
		sk.tflags |= tfFinQueued
		s.tcpOutputLocked(sk)
	case tcpFinWait2:
		s.img.wheel.Set(s.sockTimer(sk, timerTW), s.nowTick()+s.ticks(finWait2Timeout))
	}
}

// Shutdown ends one or both directions of a connection (shutdown(2)):
// writing (the FIN follows the queued data), reading (reads return end of
// file), or both.
func (s *Stack) Shutdown(id SockID, how int) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	if how < syscall.SHUT_RD || how > syscall.SHUT_RDWR {
		return ErrInvalid
	}
	if sk.kind != kindTCP {
		return ErrNotSupported
	}
	if !synchronized(sk.state) && sk.state != tcpSynReceived || sk.state == tcpTimeWait {
		// In TIME-WAIT both FINs are done, and Linux's socket has gone to
		// CLOSE (its TIME-WAIT is a mini-socket of its own): its
		// shutdown fails with ENOTCONN (inet_shutdown), as here.
		return ErrNotConn
	}
	if how != syscall.SHUT_WR {
		sk.tflags |= tfShutRd
	}
	if how != syscall.SHUT_RD && sk.tflags&tfFinQueued == 0 {
		sk.tflags |= tfFinQueued
		s.tcpOutputLocked(sk)
	}
	// Reads now end (and a FIN sent after one received hangs up): the
	// socket's waiters, and the ready log, hear of it, as the kernel's
	// shutdown wakes its socket's.
	s.touchLocked(sk)
	s.flushLocked()
	return nil
}
