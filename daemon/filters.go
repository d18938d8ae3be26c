package daemon

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/internal/ethtool"
	"github.com/xdp-onload/onload/internal/inet4"
)

// filter is a port steered to a stack, with the kernel socket that proved
// its client owns the port: onloadd keeps it open for as long as the
// filter lives, so that the kernel gives the port to nobody else.
type filter struct {
	key   bpf.Listener
	proof int // the client's kernel socket, our descriptor for it
	owner *client
	stack *dstack // the stack it steers to
	rule  int     // the n-tuple rule's location (steerNtuple), or -1
	// cluster: the filter is one member's of the cluster's port
	// (clusters.go), or nil.
	cluster *cluster
	// gone: the owner's process is gone, or (retired) the stack's
	// listener on the port closed while its connections live on; the
	// filter stays while a socket of the stack listens on the port, and
	// while its connections finish unless they can be steered by flow
	// entries, then the reaper removes it (settleGoneFiltersLocked).
	gone, retired bool
}

// addFilterLocked checks proof and steers req's port to stack s.
func (d *Daemon) addFilterLocked(c *client, s *dstack, req *control.FilterRequest, proof int) error {
	key, err := filterKey(req)
	if err != nil {
		return err
	}
	if err := checkProof(c, key, proof); err != nil {
		return err
	}
	inCluster := clustered(s, key, proof, req.Shared)
	// No two stacks steer one port, but the members of a cluster its
	// SO_REUSEPORT port, or the socket they share: an entry for any
	// address of the port would take some of the other's frames.
	for k, f := range s.ifc.filters {
		if k.Proto == key.Proto && k.Port == key.Port && (k.Addr == key.Addr || k.Addr.IsUnspecified() || key.Addr.IsUnspecified()) {
			if inCluster && k == key && f.cluster == s.cluster && s.filters[key] == nil && joins(f, proof) {
				continue
			}
			if k == key && f.stack == s && f.cluster == nil && (f.gone || f.owner != c) {
				d.takeFilterLocked(f, c, proof)
				return nil
			}
			if f.owner == c && k == key {
				return refuse(codeInUse, "%s %s:%d is already steered to your stack", key.Proto, key.Addr, key.Port)
			}
			if f.gone {
				return refuse(codeInUse, "%s port %d on %s belongs to the connections %s left, which onloadd finishes: a port is steered to one stack; the port is free once they end", key.Proto, key.Port, s.ifc.name, f.owner)
			}
			if s.cluster != nil && f.stack.cluster == s.cluster {
				return refuse(codeInUse, "%s port %d on %s belongs to %s, another member of cluster %q: a cluster's members share only ports bound with SO_REUSEPORT (nginx: listen ... reuseport) and listening sockets their processes inherited, each taking the connections of its queue",
					key.Proto, key.Port, s.ifc.name, f.owner, s.cluster.name)
			}
			return refuse(codeInUse, "%s port %d on %s belongs to %s: a port is steered to one stack", key.Proto, key.Port, s.ifc.name, f.owner)
		}
	}
	if inCluster {
		// The NIC's hash spreads the port's connections over the queues,
		// a member on each: no n-tuple rule.
		f := &filter{key: key, proof: proof, owner: c, stack: s, rule: -1}
		if err := d.addClusterFilterLocked(s, key, f); err != nil {
			return err
		}
		s.filters[key] = f
		d.log.Debug("filter added", "stack", s.id, "cluster", s.cluster.name, "proto", key.Proto.String(), "local", fmt.Sprintf("%s:%d", key.Addr, key.Port), "client", c.String())
		return nil
	}
	rule := -1
	if s.ifc.steering == steerNtuple {
		loc, err := ethtool.InsertRule(s.ifc.name, ethtool.Rule{UDP: key.Proto == bpf.UDP, Addr: key.Addr.As4(), Port: key.Port, Queue: uint32(s.queue)})
		if err != nil {
			return refuse(codeUnavailable, "%v: the stack on queue %d would not see the port's frames", err, s.queue)
		}
		rule = int(loc)
	}
	if err := s.ifc.steer.AddListener(key, s.id); err != nil {
		if rule >= 0 {
			ethtool.DeleteRule(s.ifc.name, uint32(rule))
		}
		return fmt.Errorf("filter %s %s:%d: %w", key.Proto, key.Addr, key.Port, err)
	}
	checkKernelFlows(s.ifc.steer, key, proof)
	f := &filter{key: key, proof: proof, owner: c, stack: s, rule: rule}
	s.ifc.filters[key] = f
	s.filters[key] = f
	d.log.Debug("filter added", "stack", s.id, "proto", key.Proto.String(), "local", fmt.Sprintf("%s:%d", key.Addr, key.Port), "client", c.String())
	return nil
}

// takeFilterLocked makes c, a process of f's stack, the owner of f, with
// proof in place of f's: the port is steered to the stack already, and
// the stack, whose processes share its sockets, has a socket on it anew
// (its engine let the bind): a listener whose process passed its socket
// on (stack.ShareListener) or closed it while its connections finish, a
// server that listens again. f is no longer gone: it stays while c's
// socket does.
func (d *Daemon) takeFilterLocked(f *filter, c *client, proof int) {
	unix.Close(f.proof)
	f.proof, f.owner = proof, c
	f.gone, f.retired = false, false
	d.log.Debug("filter taken", "stack", f.stack.id, "proto", f.key.Proto.String(), "local", fmt.Sprintf("%s:%d", f.key.Addr, f.key.Port), "client", c.String())
}

// removeFilterLocked removes the filter for key from stack s and closes
// its proof.
func (d *Daemon) removeFilterLocked(s *dstack, key bpf.Listener) {
	f := s.filters[key]
	if f == nil {
		return
	}
	delete(s.filters, key)
	unix.Close(f.proof)
	if f.cluster != nil {
		d.removeClusterFilterLocked(s, key, f)
		return
	}
	if err := s.ifc.steer.RemoveListener(key); err != nil {
		d.log.Warn("filter removal", "stack", s.id, "err", err)
	}
	if f.rule >= 0 {
		if err := ethtool.DeleteRule(s.ifc.name, uint32(f.rule)); err != nil {
			d.log.Warn("filter removal", "stack", s.id, "err", err)
		}
	}
	if s.ifc.filters[key] == f {
		delete(s.ifc.filters, key)
	}
}

func filterKey(req *control.FilterRequest) (bpf.Listener, error) {
	if req.Kind != control.Listen {
		return bpf.Listener{}, refuse(codeInvalid, "filter kind %q: onloadd steers %q filters", req.Kind, control.Listen)
	}
	var p bpf.Proto
	switch req.Proto {
	case "tcp":
		p = bpf.TCP
	case "udp":
		p = bpf.UDP
	default:
		return bpf.Listener{}, refuse(codeInvalid, "filter protocol %q: tcp or udp", req.Proto)
	}
	ap, err := req.LocalAddrPort()
	if err != nil {
		return bpf.Listener{}, refuse(codeInvalid, "%v", err)
	}
	return bpf.Listener{Proto: p, Addr: ap.Addr(), Port: ap.Port()}, nil
}

// checkProof checks that fd is a kernel socket of the client's user (or a
// listener that is the port's only one, soleListener, or one of a
// reuseport group the client's server holds whole, serversGroup), in
// onloadd's network namespace, of key's protocol, bound to key's port and
// to its address (or to every address).
func checkProof(c *client, key bpf.Listener, fd int) error {
	if fd < 0 {
		return refuse(codeDenied, "a filter needs a kernel socket bound to %s:%d, the proof that the port is yours", key.Addr, key.Port)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return refuse(codeDenied, "the proof for port %d is not a socket", key.Port)
	}
	if c.cred.Uid != 0 && st.Uid != c.cred.Uid && !soleListener(fd, key) && !serversGroup(c, fd, key) {
		return refuse(codeDenied, "the proof for port %d is a socket of uid %d, not yours (uid %d)%s", key.Port, st.Uid, c.cred.Uid, reuseportHint(fd))
	}
	if same, err := sameNetns(fd); err != nil || !same {
		return refuse(codeDenied, "the proof for port %d is a socket of another network namespace", key.Port)
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if proto == unix.IPPROTO_MPTCP {
		// Go's listeners are MPTCP sockets by default: bound, they hold
		// the TCP port as a TCP socket does.
		proto = unix.IPPROTO_TCP
	}
	if err != nil || proto != int(key.Proto) {
		return refuse(codeDenied, "the proof for %s port %d is not a %s socket", key.Proto, key.Port, key.Proto)
	}
	bound, ok := inet4.Bound(fd)
	if !ok {
		return refuse(codeDenied, "the proof for %s port %d is not bound to an IPv4 address (or the IPv6 wildcard that covers them)", key.Proto, key.Port)
	}
	if bound.Port() != key.Port || (!bound.Addr().IsUnspecified() && bound.Addr() != key.Addr) {
		return refuse(codeDenied, "the proof for %s:%d is a socket bound to %s", key.Addr, key.Port, bound)
	}
	return nil
}

// soleListener reports whether fd is a TCP socket listening without
// SO_REUSEPORT, which may be another user's: it is the only listener on
// its port and address (the kernel lets no other bind them), and the
// client that holds it accepts every connection the kernel queues on it
// already, so steering the port to the client's stack gives it nothing
// more. A pre-fork server's workers hold one their master made as root
// before they took the server's user (nginx's and apache's `user`), and
// were refused. A socket with SO_REUSEPORT may share the port with
// others of its maker's uid, whose connections the steering would take:
// it must be the client's own.
func soleListener(fd int, key bpf.Listener) bool {
	return key.Proto == bpf.TCP && listening(fd) && !reusePort(fd)
}

// reuseportHint says, of a listener another user made with SO_REUSEPORT,
// what would make it proof.
func reuseportHint(fd int) string {
	if !listening(fd) || !reusePort(fd) {
		return ""
	}
	return ": a listener with SO_REUSEPORT of another user is proof only when every listener on the port is held by " +
		"you or your parent (a server's master and its workers); another program listens on it too"
}

// sameNetns reports whether socket fd lives in onloadd's network
// namespace.
func sameNetns(fd int) (bool, error) {
	nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
	if err != nil {
		return false, err
	}
	defer unix.Close(nsfd)
	var a, b unix.Stat_t
	if err := unix.Fstat(nsfd, &a); err != nil {
		return false, err
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &b); err != nil {
		if err := unix.Stat("/proc/self/ns/net", &b); err != nil {
			return false, err
		}
	}
	return a.Dev == b.Dev && a.Ino == b.Ino, nil
}

// checkKernelFlows lets the steering program stop looking key's segments
// up in the kernel's tables once the kernel is found to have no
// connection on the port (bpf.Steering.CheckKernelFlows; onloadd runs in
// the interface's network namespace), for a listening socket's port: a
// proof that listens. A dialled connection's port keeps the look-up: a
// check at every connect would read the kernel's whole socket table each
// time.
func checkKernelFlows(steer *bpf.Steering, key bpf.Listener, proof int) {
	if key.Proto != bpf.TCP {
		return
	}
	if !listening(proof) {
		return
	}
	steer.CheckKernelFlows(key, bpf.KernelFlowsGrace)
}
