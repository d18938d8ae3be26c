package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime/debug"
	"sort"

	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/stack"
)

// Version is onloadd's version: the module's, and the commit it was
// built from.
var Version = func() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " " + s.Value[:12]
			}
		}
	}
	return v
}()

// dump describes every stack: its queue, its processes, filters and
// sockets, and, if engine is set, the engine's own dump read from the
// image.
func (d *Daemon) dump(engine bool) *control.Dump {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := &control.Dump{Daemon: Version, PID: os.Getpid(), Stacks: []control.StackDump{}}
	for _, s := range d.stacks {
		sd := control.StackDump{
			ID: uint32(s.id), Name: s.name, Interface: s.ifc.name, Queue: s.queue, Addr: s.addr.String(),
			Clients: []control.ClientDump{}, Filters: []string{}, Cluster: s.cluster != nil,
		}
		for c := range s.clients {
			sd.Clients = append(sd.Clients, control.ClientDump{PID: int(c.cred.Pid), UID: int(c.cred.Uid), Program: c.program})
		}
		sort.Slice(sd.Clients, func(i, j int) bool { return sd.Clients[i].PID < sd.Clients[j].PID })
		for k, f := range s.filters {
			gone := ""
			if f.gone {
				gone = ", gone: kept while its sockets finish"
			}
			cl := ""
			if f.cluster != nil {
				cl = ", the cluster's: its connections on this queue"
			}
			sd.Filters = append(sd.Filters, fmt.Sprintf("%s %s:%d (pid %d%s%s)", k.Proto, k.Addr, k.Port, f.owner.cred.Pid, cl, gone))
		}
		for f := range s.flows {
			sd.Filters = append(sd.Filters, fmt.Sprintf("%s %s -> %s (flow: a connection whose listener or process went)", f.Proto, f.Local, f.Remote))
		}
		sort.Strings(sd.Filters)
		sd.Orphan, sd.InUse, sd.Quarantined = !s.orphanSince.IsZero(), s.st.InUse(), s.quarantined
		sd.LockBreaks, sd.LockHolder = s.lockBreaks, s.st.LockHolder()
		if w := s.watch; w != nil {
			sd.Takeovers = w.polls.Load()
			if since := w.since.Load(); since != 0 {
				sd.StalledMs = (int64(stack.Now()) - since) / 1e6
			}
			if e := w.err.Load(); e != nil {
				sd.Watch = "stopped: " + *e
			}
		} else {
			sd.Watch = "off (onloadd serve -takeover 0)"
		}
		sd.Sockets = []control.SocketDump{}
		var rows []stack.SocketRow
		var text string
		var okRows, okText bool
		if s.quarantined == "" {
			err := guard(func() {
				if c, ok := s.st.TryCounters(); ok {
					sd.Handovers = c.TCPHandovers
				}
				rows, okRows = s.st.TrySockets()
				if engine {
					text, okText = s.st.TryDump()
				}
			})
			if err != nil {
				d.quarantineLocked(s, err.Error())
				sd.Quarantined = s.quarantined
				okRows, okText = false, false
			}
		}
		if okRows {
			for _, r := range rows {
				sd.Sockets = append(sd.Sockets, control.SocketDump{
					Proto: r.Proto, State: r.State, Local: r.Local.String(), Remote: r.Remote.String(),
					SendQ: r.SendQ, RecvQ: r.RecvQ, Cwnd: r.Cwnd, RTTus: r.RTT.Microseconds(), RetransB: r.Retrans, OwnerPID: r.Owner,
				})
			}
		}
		if engine {
			sd.Engine = "(the stack lock is held, or its image is quarantined: no engine dump)"
			if okText {
				sd.Engine = text
			}
		}
		out.Stacks = append(out.Stacks, sd)
	}
	sort.Slice(out.Stacks, func(i, j int) bool { return out.Stacks[i].ID < out.Stacks[j].ID })
	out.Interfaces = []control.InterfaceDump{}
	for _, ifc := range d.ifaces {
		id := control.InterfaceDump{Name: ifc.name, Queues: len(ifc.queues), Steering: ifc.steering.String()}
		var err error
		if id.Listeners, id.Flows, err = ifc.steer.Entries(); err != nil {
			id.Error = err.Error()
		}
		id.Clusters = d.clusterPortsLocked(ifc)
		out.Interfaces = append(out.Interfaces, id)
	}
	sort.Slice(out.Interfaces, func(i, j int) bool { return out.Interfaces[i].Name < out.Interfaces[j].Name })
	fitDump(out)
	return out
}

// fitDump cuts a dump down to what one control message carries: a stack
// with a thousand sockets or filters (a proxy's connections to its
// backends, each with a port of its own), or a corrupt image whose every
// slot looks in use, says more than MaxMessage. The largest part goes
// first, by halves: a stack's engine dump, its socket rows or its
// filters; the stack says how much was cut (SocketsCut, FiltersCut,
// EngineCut).
func fitDump(out *control.Dump) {
	const (
		room        = control.MaxMessage - 1024 // the reply around it
		rowBytes    = 200                       // about a socket row's JSON
		filterBytes = 90                        // about a filter's
	)
	size := func(sd *control.StackDump) int {
		return max(len(sd.Engine), rowBytes*len(sd.Sockets), filterBytes*len(sd.Filters))
	}
	for range 64 {
		b, err := json.Marshal(out)
		if err != nil || len(b) <= room {
			return
		}
		var big *control.StackDump
		for i := range out.Stacks {
			if sd := &out.Stacks[i]; big == nil || size(sd) > size(big) {
				big = sd
			}
		}
		switch {
		case big == nil:
			return
		case len(big.Engine) == size(big) && len(big.Engine) > 1024:
			keep := len(big.Engine) / 2
			big.EngineCut += len(big.Engine) - keep
			big.Engine = big.Engine[:keep]
		case len(big.Sockets) > 0 && rowBytes*len(big.Sockets) >= filterBytes*len(big.Filters):
			keep := len(big.Sockets) / 2
			big.SocketsCut += len(big.Sockets) - keep
			big.Sockets = big.Sockets[:keep]
		case len(big.Filters) > 0:
			keep := len(big.Filters) / 2
			big.FiltersCut += len(big.Filters) - keep
			big.Filters = big.Filters[:keep]
		default:
			return
		}
	}
}
