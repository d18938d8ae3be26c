package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// dstack is a stack onloadd made: its NIC (the AF_XDP socket on its
// queue, and the UMEM) and its image, with the processes that use it.
// The daemon's own handle on the engine (st) only reads, for dumps.
type dstack struct {
	id      bpf.StackID
	name    string   // shared stacks' and clusters' name, "" for a process's own
	cluster *cluster // the cluster it is a member of, or nil (clusters.go)
	uid     int      // the user whose processes may use it
	ifc     *iface
	queue   int
	nic     *vnic.XDP
	st      *stack.Stack
	addr    netip.Prefix
	nicCfg  vnic.XDPConfig
	clients map[*client]struct{}
	filters map[bpf.Listener]*filter
	// flows are the connections steered to the stack one by one, whose
	// port's filter went with their process (ports.go).
	flows map[bpf.Flow]struct{}
	watch *watcher // polls the stack when its processes do not (watch.go)
	// orphanSince is when the stack's last process went, if it has
	// (orphan.go).
	orphanSince time.Time
	// quarantined says why the stack was cut off, if it was (orphan.go).
	quarantined string
	// lockBreaks counts the locks onloadd broke, of processes that died
	// holding the stack's (lockrecover.go).
	lockBreaks uint64
	// holders are processes that left the stack holding its lock, not yet
	// seen to exit (lockrecover.go).
	holders []deadHolder
	// abandoned are the processes (their ids as they see themselves)
	// that went while others stayed, whose sockets are still to close:
	// the stack's lock was busy when they went (closeGoneLocked).
	abandoned []int
}

// Bounds on what a client may ask for: memory is the daemon's to give.
const (
	maxFrames   = 1 << 18 // 512 MiB of UMEM
	maxRingSize = 16384
	maxSockets  = 1 << 16
)

// stackLocked makes the stack req asks for, or finds the named one to
// join.
func (d *Daemon) stackLocked(c *client, req *control.StackRequest) (*dstack, bool, error) {
	switch {
	case req.Cluster && req.Name == "":
		return nil, false, refuse(codeInvalid, "a cluster needs a name (ONLOAD_STACK_NAME, onloadd run -n)")
	case !req.Cluster && d.clusters[req.Name] != nil:
		return nil, false, refuse(codeInUse, "%q names a cluster, not a shared stack: join it as a cluster (ONLOAD_CLUSTER=1, onloadd run -cluster)", req.Name)
	}
	if req.Name != "" && !req.Cluster {
		if s := d.named[req.Name]; s != nil {
			if !c.mayUse(s.uid) {
				return nil, false, refuse(codeDenied, "stack %q belongs to uid %d; processes of uid %d may not join it%s", req.Name, s.uid, c.cred.Uid, secureWhy(c))
			}
			if req.Interface != "" && req.Interface != s.ifc.name {
				return nil, false, refuse(codeInvalid, "stack %q is on %s, not %s", req.Name, s.ifc.name, req.Interface)
			}
			return s, true, nil
		}
	}
	if err := checkSizes(req); err != nil {
		return nil, false, err
	}
	ifname := req.Interface
	if ifname == "" {
		if len(d.cfg.Interfaces) == 1 {
			ifname = d.cfg.Interfaces[0]
		} else {
			return nil, false, refuse(codeInvalid, "no interface named: set ONLOAD_INTERFACE")
		}
	}
	ifc, err := d.ifaceLocked(ifname)
	if err != nil {
		return nil, false, err
	}
	var cl *cluster
	if req.Cluster {
		if cl, err = d.clusterForLocked(c, req, ifc); err != nil {
			return nil, false, err
		}
	}
	q := ifc.freeQueue()
	if q < 0 {
		// An orphan of the name first: a cluster's member that went,
		// whose queue has no member now.
		if s := d.adoptableLocked(c, ifc, req.Name); s != nil {
			if cl != nil && s.cluster == nil {
				d.addMemberLocked(cl, s)
			}
			// The queue's stack is an orphan of the same user: the new
			// process joins it, as a process joins a shared stack, and
			// its connections finish beside the new process's (a
			// server restarted at once on a NIC with one queue).
			s.orphanSince = time.Time{}
			if s.cluster == nil && s.name != req.Name {
				// Adopted under the new command's name (see
				// control.SameRunKind): its other processes join it so.
				if d.named[s.name] == s {
					delete(d.named, s.name)
				}
				s.name = req.Name
			}
			if s.name != "" && s.cluster == nil {
				d.named[s.name] = s
			}
			d.log.Info("orphan stack adopted: no queue was free, and a process of its user asked for a stack", "stack", s.id, "client", c.String())
			return s, true, nil
		}
		if cl != nil {
			if s := cl.memberToJoin(); s != nil {
				return s, true, nil
			}
		}
		return nil, false, refuse(codeExhausted, "every queue of %s has a stack (%s): share one (the processes of one onloadd run command share theirs; another command's: onloadd run -n NAME, ONLOAD_STACK_NAME; a pre-fork server's workers a stack each while queues last: onloadd run -n NAME -cluster), or give the interface more queues (ethtool -L)", ifc.name, ifc.holders())
	}
	id, ok := d.freeIDLocked()
	if !ok {
		return nil, false, refuse(codeExhausted, "onloadd has %d stacks, the most it can steer", bpf.MaxStacks-1)
	}
	sc, err := stack.KernelConfig(ifname)
	if err != nil {
		return nil, false, refuse(codeUnavailable, "%v", err)
	}
	im := req.Image
	sc.Sockets, sc.SendBuffer, sc.RecvBuffer = im.Sockets, im.SendBuffer, im.RecvBuffer
	sc.SendBufferMax, sc.RecvBufferMax, sc.Congestion = im.SendBufferMax, im.RecvBufferMax, im.Congestion
	sc.MinRTO = time.Duration(im.MinRTOMs) * time.Millisecond
	sc.DelayedAck = time.Duration(im.DelayedAckMs) * time.Millisecond
	sc.TimeWait = time.Duration(im.TimeWaitMs) * time.Millisecond
	nc := vnic.XDPConfig{Interface: ifname, Queue: q, FrameCount: req.Frames, RingSize: req.RingSize, FillDepth: req.FillDepth, RxLane: true}
	nic, err := vnic.OpenXDP(nc)
	if err != nil {
		return nil, false, fmt.Errorf("stack on %s queue %d: %w", ifname, q, err)
	}
	st, err := stack.New(nic, sc, stack.Options{Filters: pinFilters{steer: ifc.steer, id: id}})
	if err != nil {
		nic.Close()
		return nil, false, refuse(codeInvalid, "stack on %s: %v", ifname, err)
	}
	// Sealed: a client cannot shrink the memory the daemon maps too.
	for _, fd := range []int{nic.Umem().FD(), st.Image().FD()} {
		if err == nil {
			err = seal(fd)
		}
	}
	if err == nil {
		err = ifc.steer.SetSocket(id, q, nic.RxFD())
	}
	if err != nil {
		st.Image().Close()
		nic.Close()
		return nil, false, fmt.Errorf("stack on %s queue %d: %w", ifname, q, err)
	}
	s := &dstack{
		id: id, name: req.Name, uid: int(c.cred.Uid), ifc: ifc, queue: q, nic: nic, st: st, addr: sc.Addr,
		nicCfg: nc, clients: map[*client]struct{}{}, filters: map[bpf.Listener]*filter{}, flows: map[bpf.Flow]struct{}{},
	}
	st.SetWatcher()
	if err := d.startWatch(s); err != nil {
		st.Image().Close()
		nic.Close()
		return nil, false, err
	}
	ifc.queues[q] = s
	d.stacks[id] = s
	if cl != nil {
		d.addMemberLocked(cl, s)
	} else if s.name != "" {
		d.named[s.name] = s
	}
	d.log.Info("stack made", "stack", id, "name", s.name, "cluster", cl != nil, "interface", ifname, "queue", q, "addr", sc.Addr.String(),
		"pid", c.cred.Pid, "uid", c.cred.Uid, "program", c.program)
	return s, false, nil
}

func checkSizes(req *control.StackRequest) error {
	switch {
	case req.Frames < 0 || req.Frames > maxFrames:
		return refuse(codeInvalid, "%d UMEM frames: onloadd gives from 256 to %d", req.Frames, maxFrames)
	case req.Frames != 0 && req.Frames < 256:
		return refuse(codeInvalid, "%d UMEM frames: onloadd gives from 256 to %d", req.Frames, maxFrames)
	case req.RingSize < 0 || req.RingSize > maxRingSize || req.RingSize&(req.RingSize-1) != 0:
		return refuse(codeInvalid, "ring size %d: a power of two up to %d", req.RingSize, maxRingSize)
	case req.FillDepth < 0 || req.FillDepth > maxRingSize:
		return refuse(codeInvalid, "fill depth %d: up to %d", req.FillDepth, maxRingSize)
	case req.Image.Sockets < 0 || req.Image.Sockets > maxSockets:
		return refuse(codeInvalid, "%d sockets: onloadd gives up to %d per stack", req.Image.Sockets, maxSockets)
	}
	return nil
}

func seal(fd int) error {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	if err != nil {
		return fmt.Errorf("seal memfd: %w", err)
	}
	return nil
}

func (d *Daemon) freeIDLocked() (bpf.StackID, bool) {
	// Stack 0 is the fault injector's (bpf.Steering.ForwardProgram).
	for range bpf.MaxStacks - 1 {
		id := d.nextID
		d.nextID++
		if d.nextID >= bpf.MaxStacks {
			d.nextID = 1
		}
		if d.stacks[id] == nil {
			return id, true
		}
	}
	return 0, false
}

// leaveLocked detaches c from s, removing c's filters. The last client
// out leaves the stack an orphan, its filters in place: its connections'
// frames must still reach it while onloadd finishes them (orphan.go).
func (d *Daemon) leaveLocked(c *client, s *dstack) {
	defer d.kickReaper()
	delete(s.clients, c)
	if len(s.clients) == 0 {
		d.orphanLocked(s)
		return
	}
	d.recoverLockLocked(s, c)
	if s.quarantined == "" {
		// The sockets c's process opened close as its descriptors
		// would; its filters stay while they finish.
		s.abandoned = append(s.abandoned, c.selfPid)
		d.closeGoneLocked(s, 100*time.Millisecond)
	}
	for k, f := range s.filters {
		if f.owner == c {
			if s.quarantined != "" {
				d.removeFilterLocked(s, k)
			} else {
				f.gone = true
			}
		}
	}
	d.settleGoneFiltersLocked(s)
}

// releaseStackLocked removes the stack's filters and socket from the
// steering maps and frees its queue, id and memory. The processes that
// mapped it keep their mappings until they unmap them; no frame reaches
// them any more.
func (d *Daemon) releaseStackLocked(s *dstack) {
	if d.stacks[s.id] != s {
		return
	}
	dropHoldersLocked(s)
	s.watch.end()
	var errs []error
	errs = append(errs, d.unsteerLocked(s))
	errs = append(errs, s.st.Image().Close(), s.nic.Close())
	s.ifc.queues[s.queue] = nil
	delete(d.stacks, s.id)
	if s.name != "" && d.named[s.name] == s {
		delete(d.named, s.name)
	}
	if err := errors.Join(errs...); err != nil {
		d.log.Warn("stack released with errors", "stack", s.id, "err", err)
	} else {
		d.log.Info("stack released", "stack", s.id, "name", s.name)
	}
}

// unsteerLocked takes s out of the steering maps (its filters, with its
// clusters' member slots, its flow entries and its AF_XDP socket) and
// out of its cluster. No frame reaches it afterwards.
func (d *Daemon) unsteerLocked(s *dstack) error {
	for k := range s.filters {
		d.removeFilterLocked(s, k)
	}
	for f := range s.flows {
		d.removeFlowLocked(s, f)
	}
	d.leaveClusterLocked(s)
	return s.ifc.steer.ClearSocket(s.id, s.queue)
}

func (s *dstack) clientNames() string {
	var b []string
	for c := range s.clients {
		b = append(b, c.String())
	}
	sort.Strings(b)
	return strings.Join(b, ", ")
}

// reply describes s for a client.
func (s *dstack) reply(joined bool) *control.StackReply {
	cfg := s.nicCfg
	return &control.StackReply{
		ID: uint32(s.id), Name: s.name, Joined: joined, Interface: s.ifc.name, Queue: s.queue,
		Addr: s.addr.String(), FrameSize: s.nic.Umem().Config().FrameSize, Frames: s.nic.Umem().Config().FrameCount,
		RingSize: cfg.RingSize, FillDepth: cfg.FillDepth, KernelConnects: s.kernelConnects(),
	}
}

// kernelConnects is why the connections s's processes open go to the
// kernel (control.StackReply.KernelConnects), or "". A listener's port is
// steered to the stack's queue (n-tuple rules, or on veth by the test
// hosts' sender, test.QueueSteer), and so are its connections; a
// connection the stack opens has a port of its own, whose replies a NIC
// without n-tuple rules puts on the queue of its hash, or on veth of the
// peer's choosing: on any queue of several.
func (s *dstack) kernelConnects() string {
	if s.ifc.steering != steerSender || len(s.ifc.queues) < 2 {
		return ""
	}
	return fmt.Sprintf("interface %s has %d receive queues, and a frame arrives on the queue its sender picked (veth): "+
		"the replies of a connection opened here may arrive on another queue than stack %d's (%d)",
		s.ifc.name, len(s.ifc.queues), s.id, s.queue)
}

// resolve has the kernel resolve addr, a neighbour on the stack's subnet
// (it sends an ARP request), for a client that may not ask itself.
func (s *dstack) resolve(addr string) error {
	ip, err := netip.ParseAddr(addr)
	if err != nil || !ip.Is4() || !s.addr.Contains(ip) || ip == s.addr.Addr() {
		return refuse(codeInvalid, "%q is not a neighbour on stack %d's subnet %s", addr, s.id, s.addr)
	}
	link, err := netlink.LinkByName(s.ifc.name)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", ip, err)
	}
	return netlink.NeighSet(&netlink.Neigh{
		LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4, Flags: unix.NTF_USE, IP: ip.AsSlice(),
	})
}
