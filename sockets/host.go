package sockets

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"unsafe"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/ethtool"
	"github.com/xdp-onload/onload/interrupts"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/xdp"
)

// standaloneStack is the steering program's id for a process's own stack
// (standalone mode: the process loads and attaches the program itself).
const standaloneStack bpf.StackID = 1

// Open makes a stack on a host interface. Through onloadd (cfg.Daemon
// auto or require, and onloadd running): onloadd makes the stack's
// memory and AF_XDP socket and passes them over its control socket, and
// the process needs no privilege. Standalone (cfg.Daemon off, or auto
// with no onloadd): this process loads and attaches the XDP steering
// program, opens an AF_XDP socket on the interface's queue and runs the
// stack (root, or CAP_NET_ADMIN and CAP_BPF, is needed). Either way the
// stack runs in this process, and traffic the stack does not own keeps
// flowing through the kernel. It must run in the interface's network
// namespace.
func Open(cfg Config) (*Stack, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	ifname := cfg.Interface
	if ifname == "" {
		var err error
		if ifname, err = pickInterface(); err != nil {
			return nil, err
		}
	}
	if cfg.Daemon != DaemonOff {
		c := cfg
		c.Interface = ifname
		s, err := openDaemon(c)
		switch {
		case err == nil:
			return s, nil
		case cfg.Daemon == DaemonRequire:
			return nil, fmt.Errorf("ONLOAD_DAEMON=require: %w", err)
		case !errors.Is(err, errNoDaemon):
			// onloadd runs but refused: a stack of our own would fight
			// it for the interface.
			return nil, err
		}
		logf(levelDebug, "%v: the process makes its own stack (standalone; ONLOAD_DAEMON=%s)", err, cfg.Daemon)
	}
	if n := rxQueues(ifname); n > 1 {
		return nil, fmt.Errorf("interface %s has %d receive queues; a standalone stack serves single-queue interfaces (ethtool -L %s combined 1, or run onloadd)", ifname, n, ifname)
	}
	sc, err := stack.KernelConfig(ifname)
	if err != nil {
		return nil, err
	}
	var undo []func() error
	fail := func(err error) (*Stack, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, fmt.Errorf("open stack on %s: %w", ifname, err)
	}
	steer, err := bpf.Load()
	if err != nil {
		return fail(err)
	}
	undo = append(undo, steer.Close)
	att, err := xdp.Attach(steer.Program(), ifname, xdp.AttachAuto)
	if err != nil {
		return fail(err)
	}
	undo = append(undo, att.Close)
	nic, err := vnic.OpenXDP(vnic.XDPConfig{
		Interface: ifname, FrameCount: cfg.UmemFrames, RingSize: cfg.RingSize, FillDepth: cfg.FillDepth, RxLane: true,
	})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, nic.Close)
	if err := steer.SetSocket(standaloneStack, 0, nic.RxFD()); err != nil {
		return fail(err)
	}
	kn, err := stack.NewKernelNeighbours(ifname)
	if err != nil {
		return fail(err)
	}
	undo = append(undo, kn.Close)
	ctl, err := steer.Control(standaloneStack)
	if err != nil {
		return fail(err)
	}
	ev, err := steer.Events()
	if err != nil {
		return fail(err)
	}
	irq, err := interrupts.Steering(ev, ctl, standaloneStack, nic.RxFD())
	if err != nil {
		ev.Close()
		return fail(err)
	}
	undo = append(undo, irq.Close)
	s, err := newStack(nic, irq, sc, cfg, stack.Options{
		Filters:     stack.SteeringFilters{Steering: steer, Stack: standaloneStack},
		Resolver:    kn,
		Overflow:    overflowTo(ctl),
		BadChecksum: checksumWarning(ifname),
	})
	if err != nil {
		return fail(err)
	}
	// Torn down in the reverse order of making.
	for i := len(undo) - 1; i >= 0; i-- {
		s.teardown = append(s.teardown, undo[i])
	}
	s.host, s.ifname = true, ifname
	s.local = hostAddrs()
	s.followKernel()
	logf(levelInfo, "stack on %s (%s, %s, attach %s): %v", ifname, nic.Info().Mode, sc.Addr, att.Mode, cfg.Profile)
	return s, nil
}

// name describes the stack for logs.
func (s *Stack) name() string {
	if s.ifname != "" {
		return s.ifname + " " + s.addr.String()
	}
	return s.addr.String()
}

// InterfaceIndex is the index of the host interface the stack serves
// (0: none, or gone), looked up once.
func (s *Stack) InterfaceIndex() int {
	s.ifindexOnce.Do(func() {
		if ifi, err := net.InterfaceByName(s.ifname); s.ifname != "" && err == nil {
			s.ifindex = ifi.Index
		}
	})
	return s.ifindex
}

// pickInterface is the interface of the default route, else the only
// interface that is up, not loopback, with an IPv4 address.
func pickInterface() (string, error) {
	if name := defaultRouteInterface(); name != "" {
		return name, nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return "", fmt.Errorf("list interfaces: %w", err)
	}
	var found []string
	for _, ifi := range ifs {
		if ifi.Flags&net.FlagUp == 0 || ifi.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifi.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
				found = append(found, ifi.Name)
				break
			}
		}
	}
	switch len(found) {
	case 0:
		return "", errors.New("no interface is up with an IPv4 address; set ONLOAD_INTERFACE")
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("no default route and %d interfaces (%s): set ONLOAD_INTERFACE to the one to accelerate", len(found), strings.Join(found, ", "))
}

// defaultRouteInterface reads the kernel's IPv4 default route from
// /proc/thread-self/net/route (this thread's network namespace).
func defaultRouteInterface() string {
	f, err := os.Open("/proc/thread-self/net/route")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 8 && fields[1] == "00000000" && fields[7] == "00000000" {
			return fields[0]
		}
	}
	return ""
}

// rxQueues counts the receive queues an interface uses now: the driver's
// current channel counts (ETHTOOL_GCHANNELS), or, where it has none, the
// queues it was made with. A veth made on a many-CPU host may have room
// for several queues and use one; only the ones in use can receive.
func rxQueues(ifname string) int {
	if n, err := ethtool.RxQueues(ifname); err == nil && n > 0 {
		return n
	}
	return allocatedRxQueues(ifname)
}

// allocatedRxQueues is the number of receive queues the interface was
// made with (IFLA_NUM_RX_QUEUES, over rtnetlink in the calling thread's
// network namespace).
func allocatedRxQueues(ifname string) int {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return 0
	}
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return 0
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return 0
	}
	const iflaNumRxQueues = 32
	for i := range msgs {
		m := &msgs[i]
		if m.Header.Type != syscall.RTM_NEWLINK || len(m.Data) < syscall.SizeofIfInfomsg {
			continue
		}
		info := (*syscall.IfInfomsg)(unsafe.Pointer(&m.Data[0]))
		if int(info.Index) != ifi.Index {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(m)
		if err != nil {
			return 0
		}
		for _, a := range attrs {
			if a.Attr.Type == iflaNumRxQueues && len(a.Value) >= 4 {
				return int(binary.NativeEndian.Uint32(a.Value))
			}
		}
	}
	return 0
}

// hostAddrs lists the host's IPv4 addresses.
func hostAddrs() []netip.Addr {
	var out []netip.Addr
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok && ip.Unmap().Is4() {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// overflowTo gives a stack's new connections to the kernel while its
// socket table is full (stack.Options.Overflow), through its steering
// control word, and says so the first time.
func overflowTo(ctl bpf.Control) func(bool) {
	warned := false // the hook runs under the stack lock
	return func(full bool) {
		ctl.SetFull(full)
		if full && !warned {
			warned = true
			logf(levelInfo, "the stack's socket table is nearly full of connections: new connections go to the kernel (not accelerated) until it has room; raise ONLOAD_SOCKETS to accelerate more")
		}
	}
}

// checksumWarning is the stack's Options.BadChecksum on interface
// ifname: on a veth, the first segment with a wrong checksum is most
// likely the first of all of them, and the user is told why and what to
// do (a veth has no hardware to finish the checksums its peer's kernel
// leaves partial; the kernel's own sockets never check them). On other
// interfaces a wrong checksum is the wire's, counted and not logged.
func checksumWarning(ifname string) func() {
	if drv, err := ethtool.Driver(ifname); err != nil || drv != "veth" {
		return nil
	}
	return func() {
		logf(levelError, "interface %s: TCP/UDP segments arrive with wrong checksums and are dropped (the stack answers none of them): "+
			"the kernel at the other end of this veth leaves its checksums to an offload that a veth never finishes; "+
			"turn it off there: ethtool -K <the peer interface> tx off", ifname)
	}
}
