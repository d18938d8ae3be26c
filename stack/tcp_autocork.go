package stack

// Autocorking. A send whose caller owes the kick to its next wait
// (SendCorked: the LD_PRELOAD shim, which kicks when the thread comes
// back to poll, epoll or block) has nothing to gain from building its
// last partial segment at once: the frame would wait on the ring for
// that kick anyway. So the segment waits in the send queue instead, and
// a second send before the wait tops it up: nginx's header (writev) and
// body (sendfile) leave as one segment, not two, and the client's
// acknowledgement, which a second segment draws at once (Linux
// acknowledges every second segment without delay, after RFC 9293
// 3.8.6.3), rides on its next request. Linux does the same
// (tcp_autocorking): a small write waits while an earlier frame of the
// socket is still on its way to the device.
//
// The held sockets are this handle's (a process's), listed in
// Stack.corked: its next wait pushes them (KickHeld), and so does any
// poll of the process, its Sleeper's among them (KickOwed counts them,
// so sockets.Desc.SendMore's bound on a held kick covers them too). The
// Go library's sends are not held so: its goroutines hand held kicks to
// whichever of them runs last, and a reader that finds its data need
// never come back. Only the send queue's last segment is held, as with
// TCP_CORK and Nagle, and a FIN, a full segment or a push sends it; what
// was held longest goes once the bounds below are passed, as held kicks
// do.

// Bounds of a hold, as the NIC's on kicks (vnic's maxHeld, maxHoldNs): a
// sender that answers many sockets in one turn (redis-server, 50
// clients) has its first answers go while it makes the others, rather
// than all of them at the end of the turn.
const (
	maxAutoCorked = 64
	maxAutoCorkNs = 50_000
)

// autoCorkLocked decides, for holdPartialLocked, whether the last partial
// segment of sk waits for the caller's next wait, and lists sk if so.
func (s *Stack) autoCorkLocked(sk *sock) bool {
	if sk.tflags&tfAutoCork != 0 {
		return true
	}
	if !s.autocork {
		return false
	}
	s.listCorkedLocked(sk)
	return true
}

// holdAckLocked lets the ACK that a read owes (windowUpdateLocked: the
// read emptied the queue of a connection not yet known to answer what it
// reads) wait, as a held segment does, for the reader's next wait: a
// server that reads a request and answers it at once has the answer carry
// the ACK. nginx with `Connection: close` sent a pure ACK for each
// request, and kicked it alone, before its answer. Linux sends that ACK
// too, but from the client's send (veth delivers it there), which here
// is the server's own kick. The Go library's reads hold it too
// (sockets.TCPConn.Read), though its sends are not held.
func (s *Stack) holdAckLocked(sk *sock) {
	sk.flags |= sfAckHeld
	if sk.tflags&tfAutoCork == 0 {
		s.listCorkedLocked(sk)
	}
}

// listCorkedLocked lists sk among the sockets held for their sender's
// next wait, first sending what has been held past the bounds.
func (s *Stack) listCorkedLocked(sk *sock) {
	if len(s.corked) > 0 && (len(s.corked) == maxAutoCorked || s.nowNs-s.corkedAt > maxAutoCorkNs) {
		s.pushAutoCorkedLocked()
	}
	if len(s.corked) == 0 {
		s.corkedAt = s.nowNs
	}
	sk.tflags |= tfAutoCork
	s.corked = append(s.corked, s.idOf(sk))
	s.corkedN.Store(int32(len(s.corked)))
}

// pushAutoCorkedLocked sends what autoCorkLocked held, as the windows and
// Nagle allow.
func (s *Stack) pushAutoCorkedLocked() {
	corking := s.autocork
	s.autocork = false // what goes now goes, and the list is not added to
	for _, id := range s.corked {
		idx := id.index()
		if idx >= uint32(len(s.img.socks)) {
			continue
		}
		sk := &s.img.socks[idx]
		if sk.kind != kindTCP || sk.gen != id.gen() || sk.tflags&tfAutoCork == 0 {
			continue // closed, or sent since
		}
		sk.tflags &^= tfAutoCork
		if sk.flags&sfAckHeld != 0 {
			sk.flags &^= sfAckHeld
			sk.tflags |= tfAckNow
		}
		s.tcpOutputLocked(sk)
	}
	s.corked = s.corked[:0]
	s.corkedN.Store(0)
	s.autocork = corking
}
