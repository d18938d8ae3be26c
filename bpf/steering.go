// Package bpf holds the XDP steering program (steer.c, built with bpf2go)
// and the Go side of its maps: which flows and listening ports belong to
// which stack, the AF_XDP socket of each (stack, queue), the per-stack
// control words of the lazy-interrupt scheme, wake events and counters.
//
// Loading needs CAP_BPF and CAP_NET_ADMIN (root). Attaching the program to
// an interface is the xdp package's job (xdp.Attach).
package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// Limits compiled into the program (MAX_STACKS and MAX_QUEUES in steer.c).
const (
	MaxStacks = 256
	MaxQueues = 64
)

// StackID names a stack in the steering maps: 0 to MaxStacks-1.
type StackID uint32

// Proto is an IP protocol number the program steers.
type Proto uint8

const (
	TCP Proto = unix.IPPROTO_TCP
	UDP Proto = unix.IPPROTO_UDP
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return fmt.Sprintf("proto(%d)", uint8(p))
}

// Listener selects frames by destination: protocol, local address and port.
// An unspecified (zero or 0.0.0.0) Addr matches every local address.
type Listener struct {
	Proto Proto
	Addr  netip.Addr
	Port  uint16
}

// Flow selects frames of one connection by their full 5-tuple, seen from
// our side. A flow entry wins over a listener entry.
type Flow struct {
	Proto  Proto
	Local  netip.AddrPort
	Remote netip.AddrPort
}

// WakeEvent is posted on the events ring buffer when a frame arrives for a
// stack that was armed (asleep, wanting an interrupt).
type WakeEvent struct {
	Stack StackID
	Queue uint32
}

// Steering is the loaded program and its maps.
type Steering struct {
	objs    steerObjects
	control []byte // the control map, mmapped

	mu     sync.Mutex
	gens   map[steerListenerKey]uint64 // each listener entry's last write (seq), for CheckKernelFlows
	seq    uint64
	closed bool
}

// Load loads the steering program into the kernel. It does not attach it.
func Load() (*Steering, error) {
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	_ = rlimit.RemoveMemlock()
	s := &Steering{gens: make(map[steerListenerKey]uint64)}
	if err := loadSteerObjects(&s.objs, nil); err != nil {
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return nil, fmt.Errorf("loading the XDP steering program needs CAP_BPF and CAP_NET_ADMIN: run as root, or let onloadd make the stack (start onloadd; ONLOAD_DAEMON=auto): %w", err)
		}
		return nil, fmt.Errorf("load steering program: %w", err)
	}
	size := int(s.objs.Control.MaxEntries()) * int(unsafe.Sizeof(steerStackCtl{}))
	mem, err := unix.Mmap(s.objs.Control.FD(), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		s.objs.Close()
		return nil, fmt.Errorf("map steering control array: %w", err)
	}
	s.control = mem
	return s, nil
}

// Program is the XDP program, to attach with xdp.Attach.
func (s *Steering) Program() *ebpf.Program { return s.objs.Steer }

// ForwardProgram is the fault injector's program (test.Path): it sends
// every frame to stack 0's socket for the frame's queue (SetSocket(0, q,
// fd)), and to the kernel when there is none. Stacks do not use it.
func (s *Steering) ForwardProgram() *ebpf.Program { return s.objs.Forward }

// Close unloads the program and maps (an attachment holds its own
// reference to the program).
func (s *Steering) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	var errs []error
	if s.control != nil {
		errs = append(errs, unix.Munmap(s.control))
		s.control = nil
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

func checkStack(id StackID) error {
	if id >= MaxStacks {
		return fmt.Errorf("stack id %d out of range: must be below %d", id, MaxStacks)
	}
	return nil
}

func checkProto(p Proto) error {
	if p != TCP && p != UDP {
		return fmt.Errorf("protocol %d: only tcp (6) and udp (17) are steered", uint8(p))
	}
	return nil
}

// be32 returns the uint32 whose in-memory bytes are the address in network
// order, as the program's keys hold it.
func be32(a netip.Addr) (uint32, error) {
	if !a.IsValid() {
		return 0, nil
	}
	a = a.Unmap()
	if !a.Is4() {
		return 0, fmt.Errorf("address %s: only IPv4 is steered", a)
	}
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:]), nil
}

// be16 returns the uint16 whose in-memory bytes are the port in network
// order.
func be16(p uint16) uint16 {
	return binary.NativeEndian.Uint16([]byte{byte(p >> 8), byte(p)})
}

func listenerKey(l Listener) (steerListenerKey, error) {
	if err := checkProto(l.Proto); err != nil {
		return steerListenerKey{}, err
	}
	addr, err := be32(l.Addr)
	if err != nil {
		return steerListenerKey{}, err
	}
	if l.Port == 0 {
		return steerListenerKey{}, errors.New("listener port 0: a port is needed")
	}
	return steerListenerKey{Addr: addr, Port: be16(l.Port), Proto: uint8(l.Proto)}, nil
}

func flowKey(f Flow) (steerFlowKey, error) {
	if err := checkProto(f.Proto); err != nil {
		return steerFlowKey{}, err
	}
	if !f.Local.Addr().IsValid() || !f.Remote.Addr().IsValid() || f.Local.Addr().IsUnspecified() {
		return steerFlowKey{}, fmt.Errorf("flow %s -> %s: both addresses must be set", f.Local, f.Remote)
	}
	local, err := be32(f.Local.Addr())
	if err != nil {
		return steerFlowKey{}, err
	}
	remote, err := be32(f.Remote.Addr())
	if err != nil {
		return steerFlowKey{}, err
	}
	return steerFlowKey{
		LocalAddr: local, RemoteAddr: remote,
		LocalPort: be16(f.Local.Port()), RemotePort: be16(f.Remote.Port()),
		Proto: uint8(f.Proto),
	}, nil
}

// AddListener steers frames matching l to stack id, replacing any entry for
// the same listener. The program looks the entry's non-SYN segments up in
// the kernel's tables, for connections of the kernel's on the port, until
// CheckKernelFlows finds there are none.
func (s *Steering) AddListener(l Listener, id StackID) error {
	if err := checkStack(id); err != nil {
		return err
	}
	k, err := listenerKey(l)
	if err != nil {
		return err
	}
	if err := s.putListener(k, uint32(id)); err != nil {
		return fmt.Errorf("add listener %s %s:%d: %w", l.Proto, l.Addr, l.Port, err)
	}
	return nil
}

// RemoveListener deletes the entry for l; removing a missing entry is not
// an error.
func (s *Steering) RemoveListener(l Listener) error {
	k, err := listenerKey(l)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.gens, k)
	if err := s.objs.Listeners.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove listener %s %s:%d: %w", l.Proto, l.Addr, l.Port, err)
	}
	return nil
}

// putListener writes listener entry k with value v and KERNEL_BIT.
func (s *Steering) putListener(k steerListenerKey, v uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	s.gens[k] = s.seq
	return s.objs.Listeners.Put(k, v|kernelBit)
}

// AddFlow steers the frames of flow f to stack id.
func (s *Steering) AddFlow(f Flow, id StackID) error {
	if err := checkStack(id); err != nil {
		return err
	}
	k, err := flowKey(f)
	if err != nil {
		return err
	}
	if err := s.objs.Flows.Put(k, uint32(id)); err != nil {
		return fmt.Errorf("add flow %s %s -> %s: %w", f.Proto, f.Local, f.Remote, err)
	}
	return nil
}

// RemoveFlow deletes the entry for f; removing a missing entry is not an
// error.
func (s *Steering) RemoveFlow(f Flow) error {
	k, err := flowKey(f)
	if err != nil {
		return err
	}
	if err := s.objs.Flows.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove flow %s %s -> %s: %w", f.Proto, f.Local, f.Remote, err)
	}
	return nil
}

func slot(id StackID, queue int) (uint32, error) {
	if err := checkStack(id); err != nil {
		return 0, err
	}
	if err := checkQueue(queue); err != nil {
		return 0, err
	}
	return uint32(id)*MaxQueues + uint32(queue), nil
}

func checkQueue(queue int) error {
	if queue < 0 || queue >= MaxQueues {
		return fmt.Errorf("queue %d out of range: must be below %d", queue, MaxQueues)
	}
	return nil
}

// SetSocket makes the AF_XDP socket fd (bound to queue of the interface the
// program is attached to) the one that receives stack id's frames arriving
// on that queue.
func (s *Steering) SetSocket(id StackID, queue int, fd int) error {
	k, err := slot(id, queue)
	if err != nil {
		return err
	}
	if err := s.objs.Xsks.Put(k, uint32(fd)); err != nil {
		return fmt.Errorf("register AF_XDP socket for stack %d queue %d: %w", id, queue, err)
	}
	return nil
}

// ClearSocket removes stack id's socket for queue; frames for the stack on
// that queue are then dropped and counted (CounterDropNoXSK).
func (s *Steering) ClearSocket(id StackID, queue int) error {
	k, err := slot(id, queue)
	if err != nil {
		return err
	}
	if err := s.objs.Xsks.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unregister AF_XDP socket for stack %d queue %d: %w", id, queue, err)
	}
	return nil
}

// Control is a stack's word in the mmapped control array: its lazy-interrupt
// armed flag, wake counter and full flag. Reads and writes are plain
// memory accesses, no system calls.
type Control struct {
	ctl *steerStackCtl
}

// Control returns stack id's control word.
func (s *Steering) Control(id StackID) (Control, error) {
	if err := checkStack(id); err != nil {
		return Control{}, err
	}
	if s.control == nil {
		return Control{}, errors.New("steering is closed")
	}
	off := uintptr(id) * unsafe.Sizeof(steerStackCtl{})
	return Control{(*steerStackCtl)(unsafe.Pointer(&s.control[off]))}, nil
}

// Arm asks for one wake event when the next frame for the stack arrives.
// The word is read by the steering program on every frame for the stack,
// on whichever CPU receives it: it is written only when it changes, so
// that a disarmed stack's line stays shared in every cache.
func (c Control) Arm() { setWord(&c.ctl.Armed, 1) }

// Disarm withdraws the request.
func (c Control) Disarm() { setWord(&c.ctl.Armed, 0) }

// Armed reports whether the stack is armed.
func (c Control) Armed() bool { return atomic.LoadUint32(&c.ctl.Armed) != 0 }

// SetFull says whether the stack's socket table is (nearly) full: while it
// is, a SYN for one of its listeners goes to the kernel, whose half of
// the listener takes the connection. Written only when it changes, as
// Arm's flag is: the program reads the line for every SYN.
func (c Control) SetFull(full bool) {
	v := uint32(0)
	if full {
		v = 1
	}
	setWord(&c.ctl.Full, v)
}

// setWord stores v in a control word only if it changes it, so that the
// line stays shared in the caches of the CPUs the program reads it on.
func setWord(w *uint32, v uint32) {
	if atomic.LoadUint32(w) != v {
		atomic.StoreUint32(w, v)
	}
}

// Full reports SetFull's flag.
func (c Control) Full() bool { return atomic.LoadUint32(&c.ctl.Full) != 0 }

// Wakeups is how many wake events the program has posted for the stack.
func (c Control) Wakeups() uint32 { return atomic.LoadUint32(&c.ctl.Wakeups) }

func nativeU32(b []byte) uint32 { return binary.NativeEndian.Uint32(b) }

// Entries counts the listener and flow entries in the steering maps (for
// inspection: what a program would steer now).
func (s *Steering) Entries() (listeners, flows int, err error) {
	var lk steerListenerKey
	var fk steerFlowKey
	var v uint32
	it := s.objs.Listeners.Iterate()
	for it.Next(&lk, &v) {
		listeners++
	}
	if err := it.Err(); err != nil {
		return 0, 0, fmt.Errorf("listeners map: %w", err)
	}
	it = s.objs.Flows.Iterate()
	for it.Next(&fk, &v) {
		flows++
	}
	if err := it.Err(); err != nil {
		return 0, 0, fmt.Errorf("flows map: %w", err)
	}
	return listeners, flows, nil
}
