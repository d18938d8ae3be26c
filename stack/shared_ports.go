package stack

import "net/netip"

// Shared local ports (Onload's EF_TCP_SHARED_LOCAL_PORTS). A connection
// needs a local port steered to the stack; where steering a port is dear
// (a stack of onloadd's asks onloadd, a round trip, and asks again as
// the port's last socket goes), a process keeps a few ports steered for
// good, each held by a socket that does nothing else (HoldPort), and
// opens its connections on them: connections on one port are told apart
// by their peers (RFC 9293 3.1: a connection is its four-tuple), as the
// kernel's connections from one port to many peers are.

// HoldPort makes TCP socket id, bound to the stack's address and neither
// listening nor connected, the holder of its port: the port stays
// steered while it is bound, and ConnectShared binds connections beside
// it. A bind(2) of the port is refused as before; the holder goes as any
// socket does, by Close.
func (s *Stack) HoldPort(id SockID) error {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return err
	}
	if sk.kind != kindTCP || sk.flags&(sfBound|sfConnected) != sfBound || sk.state != tcpClosed || sk.localAddr != s.img.hdr.addr {
		return ErrInvalid
	}
	sk.flags |= sfPortHolder
	return nil
}

// ConnectShared binds TCP socket id, not bound yet, to the first of
// ports, from ports[start%len(ports)] on, whose four-tuple with remote is
// free (or in TIME-WAIT, which Connect takes over), and connects it; it
// returns the port and, as Connect, ErrInProgress once the SYN is on its
// way. Only a port with a holder (HoldPort), whose filter the
// connection shares, and not retired (retirePortLocked), is taken.
// ErrTupleInUse if no port may carry the connection; the socket is then
// as it was.
func (s *Stack) ConnectShared(id SockID, ports []uint16, start int, remote netip.AddrPort) (uint16, error) {
	s.lock()
	defer s.unlock()
	sk, err := s.sockLocked(id)
	if err != nil {
		return 0, err
	}
	ra, ok := remoteOK(remote)
	// Not bound: so neither listening nor connected (connectTCPLocked
	// checks the state again).
	if !ok || sk.kind != kindTCP || sk.flags&sfBound != 0 {
		return 0, ErrInvalid
	}
	addr := s.img.hdr.addr
	for i := range ports {
		port := ports[(start+i)%len(ports)]
		if h := s.holderLocked(addr, port); h == nil || h.flags&sfPortRetired != 0 {
			continue // no holder (closed), or retired
		}
		if old := s.findLocked(kindTCP, addr, port, ra.As4(), remote.Port()); old != nil && old.state != tcpTimeWait {
			continue
		}
		if err := s.bindLocked(sk, addrPort(addr, port), claimConnect); err != nil {
			if err == ErrAddrInUse {
				continue // a socket only bound there (a bind(2) with SO_REUSEADDR)
			}
			return 0, err
		}
		err := s.connectTCPLocked(sk, remote)
		s.flushLocked()
		return port, err
	}
	return 0, ErrTupleInUse
}

// retirePortLocked retires the shared port of sk, a connection being
// handed over to the kernel: the kernel has its four-tuple now, which
// the stack forgets once sk's slot is freed, and a connection opened on
// it again would clash with the kernel's. The port keeps its holder, and
// its filter for its other connections (their segments reach the stack;
// the kernel's connection's reach the kernel, which has it); it takes
// no new connection.
func (s *Stack) retirePortLocked(sk *sock) {
	if h := s.holderLocked(sk.localAddr, sk.localPort); h != nil {
		h.flags |= sfPortRetired
	}
}

// holderLocked is the holder (HoldPort) of TCP port addr:port, nil if it
// is not a shared port. Only a live process holds one (its holders close
// with its other sockets), so a held port's filter is there.
func (s *Stack) holderLocked(addr [4]byte, port uint16) *sock {
	var zero [4]byte
	if h := s.findLocked(kindTCP, addr, port, zero, 0); h != nil && h.flags&sfPortHolder != 0 {
		return h
	}
	return nil
}
