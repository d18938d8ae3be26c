package stack

// Autocorking. A send whose caller owes the kick to its next wait
// (SendMore: the LD_PRELOAD shim, which kicks when the thread comes back
// to poll, epoll or block) has nothing to gain from building its last
// partial segment at once: the frame would wait on the ring for that
// kick anyway. So the segment waits in the send queue instead, and a
// second send before the wait tops it up: nginx's header (writev) and
// body (sendfile) leave as one segment, not two, and the client's
// acknowledgement of the pair, which a second segment draws at once
// (RFC 9293 3.8.6.3: every second full segment; Linux's quick ACKs),
// rides on its next request. Linux does the same (tcp_autocorking): a
// small write waits while an earlier frame of the socket is still on its
// way to the device.
//
// The held sockets are this handle's (a process's), listed in
// Stack.corked: its next wait pushes them (KickHeld), and so does any
// poll of the process, its Sleeper's among them (KickOwed counts them,
// so SendMore's bound on a held kick covers them too). Only the send
// queue's last segment is held, as with TCP_CORK and Nagle, and a FIN, a
// full segment or a push sends it.

// maxAutoCorked bounds the sockets one handle holds so between waits;
// a send past it sends at once.
const maxAutoCorked = 64

// autoCorkLocked decides, for holdPartialLocked, whether the last partial
// segment of sk waits for the caller's next wait, and lists sk if so.
func (s *Stack) autoCorkLocked(sk *sock) bool {
	if sk.tflags&tfAutoCork != 0 {
		return true
	}
	if !s.autocork || len(s.corked) == maxAutoCorked {
		return false
	}
	sk.tflags |= tfAutoCork
	s.corked = append(s.corked, s.idOf(sk))
	s.corkedN.Store(int32(len(s.corked)))
	return true
}

// pushAutoCorkedLocked sends what autoCorkLocked held, as the windows and
// Nagle allow.
func (s *Stack) pushAutoCorkedLocked() {
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
		s.tcpOutputLocked(sk)
	}
	s.corked = s.corked[:0]
	s.corkedN.Store(0)
}
