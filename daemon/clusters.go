package daemon

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
)

// Clusters (Onload's EF_CLUSTER_NAME): the processes that ask for a named
// stack as a cluster (control.StackRequest.Cluster) each get a stack of
// their own, on a queue of their own while the interface has queues free,
// and share its SO_REUSEPORT ports, and the listening sockets their
// processes inherited (a pre-fork server's, without SO_REUSEPORT): each
// member's listener takes the connections that arrive on its queue
// (bpf.Steering.AddClusterListener), where one shared stack would have
// its processes contend for one lock and one transmit ring. Once every
// queue has a stack, a process adopts an orphan of the name or joins the
// member with the fewest processes. A port bound without SO_REUSEPORT
// by the process that listens on it is steered to one stack, as outside
// a cluster.
//
// Each port of a cluster has an id of its own in the steering program,
// whose member slots name the stacks that listen on it: a queue whose
// member does not (it closed its listener, or its process went) leaves
// the port's new connections to the kernel, whose listening sockets (the
// listeners' kernel halves) take them, as the kernel's SO_REUSEPORT group
// leaves out a socket that closed. A member's connections must keep to
// its queue: the NIC's RSS hash keeps each connection on one; on veth it
// is the queue the sender transmits on (test.QueueSteer's Spread).

// cluster is the stacks of one cluster name.
type cluster struct {
	name    string
	uid     int
	ifc     *iface
	members map[*dstack]struct{}
	ports   map[bpf.Listener]*clusterPort
}

// clusterPort is one port of a cluster: its id in the steering program,
// the filter of each member that listens on it, and the queues held for
// members to come (clusterhold.go).
type clusterPort struct {
	id      bpf.ClusterID
	filters map[*dstack]*filter
	held    map[int]*time.Timer
}

// clusterForLocked finds or makes cluster req.Name for client c.
func (d *Daemon) clusterForLocked(c *client, req *control.StackRequest, ifc *iface) (*cluster, error) {
	if cl := d.clusters[req.Name]; cl != nil {
		if !c.mayUse(cl.uid) {
			return nil, refuse(codeDenied, "cluster %q belongs to uid %d; processes of uid %d may not join it%s", req.Name, cl.uid, c.cred.Uid, secureWhy(c))
		}
		if cl.ifc != ifc {
			return nil, refuse(codeInvalid, "cluster %q is on %s, not %s", req.Name, cl.ifc.name, ifc.name)
		}
		return cl, nil
	}
	if _, ok := d.named[req.Name]; ok {
		return nil, refuse(codeInUse, "%q names a shared stack, not a cluster: give the cluster another name", req.Name)
	}
	return &cluster{name: req.Name, uid: int(c.cred.Uid), ifc: ifc,
		members: map[*dstack]struct{}{}, ports: map[bpf.Listener]*clusterPort{}}, nil
}

// memberToJoin is the member a process joins when no queue is free: the
// live one with the fewest processes, or nil.
func (cl *cluster) memberToJoin() *dstack {
	var best *dstack
	for s := range cl.members {
		if !s.orphanSince.IsZero() || s.quarantined != "" || len(s.clients) == 0 {
			continue
		}
		if best == nil || len(s.clients) < len(best.clients) || (len(s.clients) == len(best.clients) && s.queue < best.queue) {
			best = s
		}
	}
	return best
}

// addMemberLocked makes s a member of cl; the cluster's ports hold its
// queue for it until it listens (holdLocked).
func (d *Daemon) addMemberLocked(cl *cluster, s *dstack) {
	s.cluster = cl
	cl.members[s] = struct{}{}
	d.clusters[cl.name] = cl
	for key, cp := range cl.ports {
		d.holdLocked(cl, key, cp, s.queue)
	}
}

// leaveClusterLocked takes s, whose filters are gone, out of its cluster;
// the cluster goes with its last member.
func (d *Daemon) leaveClusterLocked(s *dstack) {
	cl := s.cluster
	if cl == nil {
		return
	}
	for _, cp := range cl.ports {
		d.unholdLocked(cl, cp, s.queue, true)
	}
	delete(cl.members, s)
	s.cluster = nil
	if len(cl.members) == 0 && d.clusters[cl.name] == cl {
		delete(d.clusters, cl.name)
	}
}

// clustered says whether s's filter for key, proved by socket proof,
// is a cluster's: s is a member, and the socket has SO_REUSEPORT or is
// shared (control.FilterRequest.Shared: a listening socket the members'
// processes inherited, which the kernel would have them all accept on).
func clustered(s *dstack, key bpf.Listener, proof int, shared bool) bool {
	if s.cluster == nil || key.Proto != bpf.TCP {
		return false
	}
	return shared || reusePort(proof)
}

// reusePort says whether socket fd has SO_REUSEPORT.
func reusePort(fd int) bool {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT)
	return err == nil && v != 0
}

// listening says whether socket fd listens (SO_ACCEPTCONN).
func listening(fd int) bool {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	return err == nil && v != 0
}

// joins says whether a member's socket proof may share cluster port f:
// both sockets have SO_REUSEPORT (the kernel let them bind the one
// port: one user's group), or they are one socket, which both processes
// hold.
func joins(f *filter, proof int) bool {
	return reusePort(f.proof) && reusePort(proof) || sameSocket(f.proof, proof)
}

// sameSocket says whether descriptors a and b are one socket (one file:
// its device and inode).
func sameSocket(a, b int) bool {
	var sa, sb unix.Stat_t
	return unix.Fstat(a, &sa) == nil && unix.Fstat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// freeClusterIDLocked is a steering id no cluster's port has.
func (d *Daemon) freeClusterIDLocked() (bpf.ClusterID, bool) {
	used := map[bpf.ClusterID]bool{}
	for _, cl := range d.clusters {
		for _, cp := range cl.ports {
			used[cp.id] = true
		}
	}
	for id := bpf.ClusterID(0); id < bpf.MaxStacks; id++ {
		if !used[id] {
			return id, true
		}
	}
	return 0, false
}

// addClusterFilterLocked steers key's connections arriving on s's queue
// to member s, by its filter f.
func (d *Daemon) addClusterFilterLocked(s *dstack, key bpf.Listener, f *filter) error {
	cl := s.cluster
	f.cluster = cl
	cp := cl.ports[key]
	fresh := cp == nil
	if fresh {
		id, ok := d.freeClusterIDLocked()
		if !ok {
			return refuse(codeExhausted, "onloadd steers %d clusters' ports, the most it can", bpf.MaxStacks)
		}
		if err := s.ifc.steer.AddClusterListener(key, id); err != nil {
			return fmt.Errorf("filter %s %s:%d: %w", key.Proto, key.Addr, key.Port, err)
		}
		checkKernelFlows(s.ifc.steer, key, f.proof)
		cp = &clusterPort{id: id, filters: map[*dstack]*filter{}, held: map[int]*time.Timer{}}
		cl.ports[key] = cp
		s.ifc.filters[key] = f
	}
	if err := s.ifc.steer.SetClusterMember(cp.id, s.queue, s.id); err != nil {
		if len(cp.filters) == 0 {
			d.dropClusterPortLocked(cl, key)
		}
		return fmt.Errorf("filter %s %s:%d: %w", key.Proto, key.Addr, key.Port, err)
	}
	d.unholdLocked(cl, cp, s.queue, false) // its member is here
	cp.filters[s] = f
	if fresh {
		d.holdForComingLocked(cl, key, cp, f.proof)
	}
	return nil
}

// removeClusterFilterLocked takes member s's filter f for key out of its
// cluster's port: the port's connections arriving on s's queue go to the
// kernel from now on. The port's entry goes with its last member's
// filter.
func (d *Daemon) removeClusterFilterLocked(s *dstack, key bpf.Listener, f *filter) {
	cl := f.cluster
	cp := cl.ports[key]
	if cp == nil || cp.filters[s] != f {
		return
	}
	if err := s.ifc.steer.ClearClusterMember(cp.id, s.queue); err != nil {
		d.log.Warn("filter removal", "stack", s.id, "cluster", cl.name, "err", err)
	}
	delete(cp.filters, s)
	if len(cp.filters) == 0 {
		d.dropClusterPortLocked(cl, key)
	} else if s.ifc.filters[key] == f {
		for _, other := range cp.filters {
			s.ifc.filters[key] = other
			break
		}
	}
}

// dropClusterPortLocked removes cluster cl's port key from the steering.
func (d *Daemon) dropClusterPortLocked(cl *cluster, key bpf.Listener) {
	if cp := cl.ports[key]; cp != nil {
		for q := range cp.held {
			d.unholdLocked(cl, cp, q, true)
		}
	}
	delete(cl.ports, key)
	if err := cl.ifc.steer.RemoveListener(key); err != nil {
		d.log.Warn("filter removal", "cluster", cl.name, "err", err)
	}
	if f := cl.ifc.filters[key]; f != nil && f.cluster == cl {
		delete(cl.ifc.filters, key)
	}
}

// clusterPortsLocked describes the cluster ports steered on ifc, each
// with its members as the steering program's map has them.
func (d *Daemon) clusterPortsLocked(ifc *iface) []string {
	var out []string
	for _, cl := range d.clusters {
		if cl.ifc != ifc {
			continue
		}
		for key, cp := range cl.ports {
			line := fmt.Sprintf("%s %s %s:%d:", cl.name, key.Proto, key.Addr, key.Port)
			m, err := ifc.steer.ClusterMembers(cp.id)
			if err != nil {
				out = append(out, line+" "+err.Error())
				continue
			}
			var slots []string
			for _, q := range slices.Sorted(maps.Keys(m)) {
				if m[q] == bpf.HeldMember {
					slots = append(slots, fmt.Sprintf("queue %d held", q))
					continue
				}
				slots = append(slots, fmt.Sprintf("queue %d stack %d", q, m[q]))
			}
			if len(slots) > 0 {
				line += " " + strings.Join(slots, ", ")
			}
			out = append(out, line)
		}
	}
	slices.Sort(out)
	return out
}
