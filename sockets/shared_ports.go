package sockets

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/xdp-onload/onload/stack"
)

// sharedPorts are the local ports a process keeps steered to a stack of
// onloadd's for the TCP connections it opens (ONLOAD_SHARED_PORTS, as
// Onload's EF_TCP_SHARED_LOCAL_PORTS; stack.HoldPort). A port of its own
// for each connection costs two requests to onloadd, its filter and its
// release, each a round trip of about half a millisecond on a busy host;
// a proxy opening a connection a request spends most of its time there.
// On a shared port a connection costs none: it is told apart from the
// others on the port by its peer.
//
// A port is added (one request, its holder's filter, with a kernel
// socket bound to it as the proof, which onloadd keeps) when every port
// kept has a connection to the peer being dialled; beyond max, a
// connection gets a port of its own as before. The ports stay until the
// process leaves the stack: onloadd then closes the holders with the
// process's other sockets, and the ports' filters go as their last
// connections end (daemon/ports.go).
//
// The kernel's side: the port's proof holds it, so the kernel gives it to
// none of its own sockets. A connection handed over to the kernel
// (Handover, or onloadd stopping) binds its kernel socket beside the
// proof in repair mode; its segments then go to the kernel, which has the
// connection (the steering program looks a port's non-SYN segments up in
// the kernel's table), while the port's other connections stay.
type sharedPorts struct {
	max   int
	next  atomic.Uint32
	ports atomic.Pointer[[]uint16] // replaced whole as a port is added
	grow  sync.Mutex               // held while a port is added
}

// errNoSharedPort is connectShared's when no shared port may carry the
// connection: the caller gives it a port of its own.
var errNoSharedPort = errors.New("no shared local port is free for the peer")

func newSharedPorts(cfg Config) *sharedPorts {
	n := min(cfg.SharedPorts, cfg.Sockets/16)
	if n <= 0 {
		return nil
	}
	return &sharedPorts{max: n}
}

func (sp *sharedPorts) load() []uint16 {
	if p := sp.ports.Load(); p != nil {
		return *p
	}
	return nil
}

// openShared opens an engine socket, sets the options pre, and connects
// it to dst from a shared port: the handshake has begun. errNoSharedPort
// when none may carry it (nothing is left open then).
func (s *Stack) openShared(dst netip.AddrPort, pre []Preset) (stack.SockID, error) {
	if s.shared == nil {
		return stack.NullSock, errNoSharedPort
	}
	if !s.enter() {
		return stack.NullSock, net.ErrClosed
	}
	id, err := s.st.Open(stack.TCP)
	if err != nil {
		s.leave()
		return stack.NullSock, sysErr("socket", err)
	}
	err = s.preset(id, pre)
	s.leave()
	if err != nil {
		s.closeID(id)
		return stack.NullSock, err
	}
	if err := s.connectShared(id, dst); err != nil {
		s.closeID(id)
		if err != errNoSharedPort {
			err = sysErr("connect", err)
		}
		return stack.NullSock, err
	}
	return id, nil
}

// connectShared connects id to dst from a shared port, adding a port if
// every one kept has a connection to dst.
func (s *Stack) connectShared(id stack.SockID, dst netip.AddrPort) error {
	sp := s.shared
	try := func(ports []uint16, start int) error {
		if !s.enter() {
			return net.ErrClosed
		}
		_, err := s.st.ConnectShared(id, ports, start, dst)
		s.leave()
		if err == stack.ErrInProgress {
			err = nil
		}
		return err
	}
	seen := sp.load()
	if len(seen) > 0 {
		if err := try(seen, int(sp.next.Add(1))); err != stack.ErrTupleInUse {
			return err
		}
	}
	sp.grow.Lock()
	defer sp.grow.Unlock()
	if cur := sp.load(); len(cur) > len(seen) {
		// Added while this thread waited.
		if err := try(cur[len(seen):], 0); err != stack.ErrTupleInUse {
			return err
		}
		seen = cur
	}
	if len(seen) >= sp.max {
		return errNoSharedPort
	}
	port, err := s.holdPort()
	if err != nil {
		logf(levelDebug, "no more shared local ports (%d kept): %v; connections beyond them get ports of their own", len(seen), err)
		sp.max = len(seen)
		return errNoSharedPort
	}
	next := append(slices.Clone(seen), port)
	sp.ports.Store(&next)
	logf(levelDebug, "shared local port %d added (%d of at most %d)", port, len(next), sp.max)
	return try([]uint16{port}, 0)
}

// holdPort steers a new port to the stack, held by an engine socket of
// its own (stack.HoldPort), and returns it.
func (s *Stack) holdPort() (uint16, error) {
	r, port, err := s.reservePort(stack.TCP, s.addr.Addr(), 0)
	if err != nil {
		return 0, err
	}
	defer r.release() // onloadd keeps its own descriptor of the proof
	if !s.enter() {
		return 0, net.ErrClosed
	}
	defer s.leave()
	id, err := s.st.Open(stack.TCP)
	if err != nil {
		return 0, err
	}
	ap := netip.AddrPortFrom(s.addr.Addr(), port)
	err = s.proofs.withProof(stack.TCP, port, r.fd1-1, false, func() error {
		return s.proofs.steerFirst(ap, r.fd1-1, func() error { return s.st.Bind(id, ap) })
	})
	if err == nil {
		err = s.st.HoldPort(id)
	}
	if err != nil {
		s.st.Close(id)
		return 0, err
	}
	return port, nil
}
