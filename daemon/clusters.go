package daemon

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
)

// Clusters (Onload's EF_CLUSTER_NAME): the processes that ask for a named
// stack as a cluster (control.StackRequest.Cluster) each get a stack of
// their own, on a queue of their own while the interface has queues free,
// and share its SO_REUSEPORT ports: each member's listener takes the
// connections that arrive on its queue (bpf.Steering.AddClusterListener),
// where one shared stack would have its processes contend for one lock
// and one transmit ring. Once every queue has a stack, a process joins
// the member with the fewest processes. A port bound without SO_REUSEPORT
// is steered to one stack, as outside a cluster.
//
// A queue whose member is gone (or that has none) leaves the cluster's new
// connections to the kernel, whose listening sockets (the listeners'
// kernel halves) take them. A member's connections must keep to its
// queue: the NIC's RSS hash keeps each connection on one; on veth it is
// the queue the sender transmits on (test.QueueSteer's Spread).

// cluster is the stacks of one cluster name.
type cluster struct {
	id      bpf.ClusterID
	name    string
	uid     int
	ifc     *iface
	members map[*dstack]struct{}
	// ports: each member's filter for each of the cluster's ports.
	ports map[bpf.Listener]map[*dstack]*filter
}

// clusterForLocked finds or makes cluster req.Name for client c.
func (d *Daemon) clusterForLocked(c *client, req *control.StackRequest, ifc *iface) (*cluster, error) {
	if cl := d.clusters[req.Name]; cl != nil {
		if c.cred.Uid != 0 && int(c.cred.Uid) != cl.uid {
			return nil, refuse(codeDenied, "cluster %q belongs to uid %d; processes of uid %d may not join it", req.Name, cl.uid, c.cred.Uid)
		}
		if cl.ifc != ifc {
			return nil, refuse(codeInvalid, "cluster %q is on %s, not %s", req.Name, cl.ifc.name, ifc.name)
		}
		return cl, nil
	}
	if _, ok := d.named[req.Name]; ok {
		return nil, refuse(codeInUse, "%q names a shared stack, not a cluster: give the cluster another name", req.Name)
	}
	used := map[bpf.ClusterID]bool{}
	for _, cl := range d.clusters {
		used[cl.id] = true
	}
	for id := bpf.ClusterID(0); id < bpf.MaxStacks; id++ {
		if !used[id] {
			return &cluster{id: id, name: req.Name, uid: int(c.cred.Uid), ifc: ifc,
				members: map[*dstack]struct{}{}, ports: map[bpf.Listener]map[*dstack]*filter{}}, nil
		}
	}
	return nil, refuse(codeExhausted, "onloadd has %d clusters, the most it can steer", bpf.MaxStacks)
}

// memberToJoin is the member a process joins when no queue is free: the live
// one with the fewest processes, or nil.
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

// addMemberLocked makes s, new on its queue, a member of cl.
func (d *Daemon) addMemberLocked(cl *cluster, s *dstack) error {
	if err := cl.ifc.steer.SetClusterMember(cl.id, s.queue, s.id); err != nil {
		return err
	}
	s.cluster = cl
	cl.members[s] = struct{}{}
	d.clusters[cl.name] = cl
	return nil
}

// leaveClusterLocked takes s out of its cluster's steering: the cluster's
// new connections on s's queue go to the kernel from now on.
func (d *Daemon) leaveClusterLocked(s *dstack) {
	cl := s.cluster
	if cl == nil {
		return
	}
	if err := cl.ifc.steer.ClearClusterMember(cl.id, s.queue); err != nil {
		d.log.Warn("cluster member removal", "stack", s.id, "cluster", cl.name, "err", err)
	}
	delete(cl.members, s)
	s.cluster = nil
	if len(cl.members) == 0 && d.clusters[cl.name] == cl {
		delete(d.clusters, cl.name)
	}
}

// clustered says whether s's filter for key, proved by socket proof,
// is a cluster's: s is a member and the socket has SO_REUSEPORT.
func clustered(s *dstack, key bpf.Listener, proof int) bool {
	if s.cluster == nil || key.Proto != bpf.TCP {
		return false
	}
	v, err := unix.GetsockoptInt(proof, unix.SOL_SOCKET, unix.SO_REUSEPORT)
	return err == nil && v != 0
}

// addClusterFilterLocked steers key to s's cluster, as the filter f of
// member s.
func (d *Daemon) addClusterFilterLocked(s *dstack, key bpf.Listener, f *filter) error {
	cl := s.cluster
	byStack := cl.ports[key]
	if len(byStack) == 0 {
		if err := s.ifc.steer.AddClusterListener(key, cl.id); err != nil {
			return fmt.Errorf("filter %s %s:%d: %w", key.Proto, key.Addr, key.Port, err)
		}
		byStack = map[*dstack]*filter{}
		cl.ports[key] = byStack
		s.ifc.filters[key] = f
	}
	byStack[s] = f
	f.cluster = cl
	return nil
}

// removeClusterFilterLocked takes member s's filter f for key out of its
// cluster's port; the port's entry goes with its last member's filter.
// A member without processes whose last cluster port went leaves the
// cluster: its queue's new connections go to the kernel.
func (d *Daemon) removeClusterFilterLocked(s *dstack, key bpf.Listener, f *filter) {
	cl := f.cluster
	byStack := cl.ports[key]
	delete(byStack, s)
	if len(byStack) == 0 {
		delete(cl.ports, key)
		if err := s.ifc.steer.RemoveListener(key); err != nil {
			d.log.Warn("filter removal", "stack", s.id, "err", err)
		}
		if s.ifc.filters[key] == f {
			delete(s.ifc.filters, key)
		}
	} else if s.ifc.filters[key] == f {
		for _, other := range byStack {
			s.ifc.filters[key] = other
			break
		}
	}
	if len(s.clients) == 0 && s.cluster == cl {
		for _, byStack := range cl.ports {
			if byStack[s] != nil {
				return
			}
		}
		d.leaveClusterLocked(s)
	}
}
