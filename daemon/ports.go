package daemon

import (
	"fmt"
	"time"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/stack"
)

// Ports of processes that are gone. A process's filters outlive it while
// its stack finishes its connections (orphan.go, and leaveLocked for a
// process of a shared stack): they are marked gone; so is the filter of a
// listener that closed while its connections live on (a retiring
// unfilter: stack.ListenerRetirer). What becomes of a
// gone filter depends on what of the stack still uses its port:
//
//   - nothing: the filter is removed, and the port is the kernel's again;
//   - connections only (its listener was closed when its process died):
//     each connection is steered to the stack by a flow entry of its own
//     (4-tuple, which the steering program looks up before ports), and
//     the port's filter is removed, its proof socket closed: a server
//     restarted at once listens on its port again, as the kernel lets it
//     (SO_REUSEADDR), while its predecessor's connections drain. Not on
//     an n-tuple-steered NIC, whose rules are by port: there the port
//     waits for the connections to end;
//   - a listener or a UDP socket: the filter stays.
//
// The flow entries go when their connection is gone.

// portUse is what a stack does with one local port.
type portUse struct {
	listens bool       // a listener, or a UDP socket
	conns   []bpf.Flow // its TCP connections
}

// settleGoneFiltersLocked applies the rules above to s's gone filters and
// removes the flow entries of connections s no longer has. It reports
// false when it could not look at the stack's sockets (a process held its
// lock): the reaper looks again.
func (d *Daemon) settleGoneFiltersLocked(s *dstack) bool {
	var gone []bpf.Listener
	for k, f := range s.filters {
		if f.gone {
			gone = append(gone, k)
		}
	}
	if (len(gone) == 0 && len(s.flows) == 0) || s.quarantined != "" {
		return true
	}
	var rows []stack.SocketRow
	var ok bool
	if err := guard(func() { rows, ok = s.st.TrySockets() }); err != nil || !ok {
		return false // the watcher's checks judge the image; look again later
	}
	uses := map[bpf.Listener]*portUse{}
	live := map[bpf.Flow]bool{}
	for _, r := range rows {
		if r.State == "HANDED-OVER" || r.State == "LISTEN-RETIRED" {
			// The kernel's connection now, or a listener whose port is
			// the kernel's (its process passed it on): no frame of it
			// comes here.
			continue
		}
		k := bpf.Listener{Proto: bpf.TCP, Port: r.Local.Port()}
		if r.Proto == "udp" {
			k.Proto = bpf.UDP
		}
		u := uses[k]
		if u == nil {
			u = &portUse{}
			uses[k] = u
		}
		if k.Proto == bpf.UDP || r.State == "LISTEN" || !r.Remote.Addr().IsValid() || r.Remote.Port() == 0 {
			u.listens = true
			continue
		}
		f := bpf.Flow{Proto: bpf.TCP, Local: r.Local, Remote: r.Remote}
		u.conns = append(u.conns, f)
		live[f] = true
	}
	for _, k := range gone {
		u := uses[bpf.Listener{Proto: k.Proto, Port: k.Port}]
		why := "its process went"
		if s.filters[k].retired {
			why = "its listener closed"
		}
		switch {
		case u == nil:
			d.log.Debug("filter removed: no socket uses its port", "why", why, "stack", s.id, "proto", k.Proto.String(), "port", k.Port)
			d.removeFilterLocked(s, k)
		case !u.listens && s.ifc.steering != steerNtuple:
			if err := d.steerFlowsLocked(s, u.conns); err != nil {
				d.log.Warn("the port's connections keep it steered", "why", why, "stack", s.id, "port", k.Port, "err", err)
				continue
			}
			d.log.Info("port freed: its connections keep their frames by flow entries", "why", why, "stack", s.id, "proto", k.Proto.String(), "port", k.Port, "connections", len(u.conns))
			d.removeFilterLocked(s, k)
		}
	}
	for f := range s.flows {
		if !live[f] {
			d.removeFlowLocked(s, f)
		}
	}
	return true
}

// settleRetiredLocked settles f, the filter of s's port key, which its
// listener has just given up (a retiring unfilter), before the reply: the
// process that asks may be passing the listener's socket to another
// (SCM_RIGHTS), whose connections must find the port the kernel's, not a
// stack with no listener on it, which refuses them. The engine asks under
// the stack lock, in the background, so the first look often finds the
// lock held: it looks again every millisecond, for retireSettle at most
// (d.mu let go meanwhile), then leaves it to the reaper.
func (d *Daemon) settleRetiredLocked(s *dstack, key bpf.Listener, f *filter) {
	for end := time.Now().Add(retireSettle); !d.settleGoneFiltersLocked(s) && time.Now().Before(end); {
		d.mu.Unlock()
		time.Sleep(time.Millisecond)
		d.mu.Lock()
		if s.filters[key] != f || !f.gone {
			return
		}
	}
	d.kickReaper()
}

// retireSettle bounds how long a retiring unfilter waits for the stack's
// lock (settleRetiredLocked): a process's lock is held for microseconds,
// but the process's next request waits behind this one, and it may hold
// the lock as it asks (a listener's filter is added so).
const retireSettle = 10 * time.Millisecond

// steerFlowsLocked steers each of flows to stack s by a flow entry; on
// failure it removes those it added.
func (d *Daemon) steerFlowsLocked(s *dstack, flows []bpf.Flow) error {
	var added []bpf.Flow
	for _, f := range flows {
		if _, ok := s.flows[f]; ok {
			continue
		}
		if err := s.ifc.steer.AddFlow(f, s.id); err != nil {
			for _, a := range added {
				d.removeFlowLocked(s, a)
			}
			return fmt.Errorf("flow %s -> %s: %w", f.Local, f.Remote, err)
		}
		s.flows[f] = struct{}{}
		added = append(added, f)
	}
	return nil
}

// removeFlowLocked removes s's flow entry for f.
func (d *Daemon) removeFlowLocked(s *dstack, f bpf.Flow) {
	if err := s.ifc.steer.RemoveFlow(f); err != nil {
		d.log.Warn("flow removal", "stack", s.id, "err", err)
	}
	delete(s.flows, f)
}
