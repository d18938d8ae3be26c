package daemon

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
)

// Holding a cluster's queues for members to come. A pre-fork server's
// workers each make their stack at their first wait and listen on the
// socket they inherited at once, and onloadd makes their stacks one after
// another: a connection that came on a worker's queue before that worker
// listened went to the listening socket's kernel half, and stayed the
// kernel's for its life (23-26 of wrk's 50 in a start at nginx's first
// answer). So when a cluster's port is made (its first listener), it
// holds the queue of each member that does not listen on it yet, and
// queues for the processes that have come to onloadd without a stack yet
// and hold the same socket (the queues they will have, the first free
// ones); a member made later is held for by every port of its cluster.
// A held queue's SYNs for the port are dropped (the steering program's
// MEMBER_HELD, counter drop_held), its other segments go to the kernel,
// until the member listens (its slot then names it) or for memberHold at
// most: the client sends its SYN again a second later (Linux's first SYN
// timeout), to the member if it listens by then, to the kernel if the
// hold has ended. A member that never listens on the port delays the
// port's first connections on its queue by a second once; a member that
// closes its listener is not held for again.

// memberHold bounds a queue's hold.
const memberHold = time.Second

// holdForComingLocked holds, for cluster port cp (key, just made, proved
// by socket proof), the queues of the members that do not listen on it
// and of the processes without a stack that hold the socket.
func (d *Daemon) holdForComingLocked(cl *cluster, key bpf.Listener, cp *clusterPort, proof int) {
	for m := range cl.members {
		if m.orphanSince.IsZero() && m.quarantined == "" {
			d.holdLocked(cl, key, cp, m.queue) // not for one that listens: holdLocked
		}
	}
	coming := 0
	var st unix.Stat_t
	if unix.Fstat(proof, &st) == nil {
		for c := range d.clients {
			if !c.hello || len(c.stacks) != 0 || c.netnsErr != nil || !c.mayUse(cl.uid) {
				continue
			}
			held := map[uint64]bool{}
			if socketInodes(int(c.cred.Pid), held) == nil && held[st.Ino] {
				coming++ // it holds the port's socket
			}
		}
	}
	for q, s := range cl.ifc.queues {
		if coming == 0 {
			break
		}
		if s == nil && cp.held[q] == nil {
			d.holdLocked(cl, key, cp, q)
			coming--
		}
	}
}

// holdLocked holds queue q of cluster port cp (key) for a member that does
// not listen on the port yet: memberHold at most.
func (d *Daemon) holdLocked(cl *cluster, key bpf.Listener, cp *clusterPort, q int) {
	if cp.held[q] != nil {
		return
	}
	for m := range cp.filters {
		if m.queue == q {
			return
		}
	}
	if err := cl.ifc.steer.SetClusterHeld(cp.id, q); err != nil {
		d.log.Warn("holding a cluster's queue for its member", "cluster", cl.name, "queue", q, "err", err)
		return
	}
	var t *time.Timer
	t = time.AfterFunc(memberHold, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if !d.closed && cl.ports[key] == cp && cp.held[q] == t {
			d.unholdLocked(cl, cp, q, true)
			d.log.Info("no member of the cluster listened on the port on its queue within the hold: the port's connections there go to the kernel",
				"cluster", cl.name, "queue", q, "port", key.Port, "hold", memberHold.String())
		}
	})
	cp.held[q] = t
	d.log.Debug("queue held for a cluster member", "cluster", cl.name, "queue", q, "port", key.Port)
}

// unholdLocked ends the hold of cp's queue q; clear: the queue has no
// member on the port from now on (none came, or it left).
func (d *Daemon) unholdLocked(cl *cluster, cp *clusterPort, q int, clear bool) {
	t := cp.held[q]
	if t == nil {
		return
	}
	t.Stop()
	delete(cp.held, q)
	if clear {
		if err := cl.ifc.steer.ClearClusterMember(cp.id, q); err != nil {
			d.log.Warn("ending a cluster queue's hold", "cluster", cl.name, "queue", q, "err", err)
		}
	}
}
