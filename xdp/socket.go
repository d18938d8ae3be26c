package xdp

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// BindMode chooses how frames move between the driver and the UMEM.
type BindMode int

const (
	// BindAuto lets the kernel use zero-copy if the driver supports it and
	// copy mode otherwise. Socket.ZeroCopy says which it chose.
	BindAuto BindMode = iota
	// BindCopy forces copy mode.
	BindCopy
	// BindZeroCopy requires zero-copy and fails if the driver cannot.
	BindZeroCopy
)

func (m BindMode) String() string {
	switch m {
	case BindAuto:
		return "auto"
	case BindCopy:
		return "copy"
	case BindZeroCopy:
		return "zero-copy"
	}
	return fmt.Sprintf("BindMode(%d)", int(m))
}

// Config says where to bind a socket and how big its rings are.
type Config struct {
	Interface string // device name, in the calling thread's network namespace
	Queue     int    // device receive queue

	// Ring sizes in entries, powers of two (default 2048 each).
	RxSize, TxSize, FillSize, CompletionSize int

	Mode BindMode
}

// checkRingSize refuses a ring size the kernel would not take.
func checkRingSize(name string, n int) error {
	if n < 1 || n > 1<<20 || bits.OnesCount(uint(n)) != 1 {
		return fmt.Errorf("%s ring size %d: must be a power of two from 1 to %d", name, n, 1<<20)
	}
	return nil
}

func (c *Config) setDefaults() error {
	for _, r := range []struct {
		name string
		v    *int
	}{{"rx", &c.RxSize}, {"tx", &c.TxSize}, {"fill", &c.FillSize}, {"completion", &c.CompletionSize}} {
		if *r.v == 0 {
			*r.v = 2048
		}
		if err := checkRingSize(r.name, *r.v); err != nil {
			return err
		}
	}
	if c.Queue < 0 {
		return fmt.Errorf("queue %d: must not be negative", c.Queue)
	}
	return nil
}

// Socket is one AF_XDP socket bound to a (device, queue), with its four
// rings. It is not safe for concurrent use: one goroutine (the one holding
// the stack lock) drives it.
type Socket struct {
	Fill       AddrRing // we give the kernel frames to receive into
	Completion AddrRing // the kernel gives back frames it has sent
	RX         DescRing // frames the kernel received
	TX         DescRing // frames for the kernel to send

	fd       int
	umem     *Umem
	iface    Interface
	queue    int
	zeroCopy bool
	lane     bool // OpenLane: an RX ring only
	maps     [][]byte
	closed   bool
}

// Open creates an AF_XDP socket on u and binds it to cfg.Interface queue
// cfg.Queue. The first socket opened on a UMEM registers it with the
// kernel; later ones share it (XDP_SHARED_UMEM) and must be on a different
// device or queue.
//
// Open must run in the network namespace of the interface (a thread that
// has called setns, or a process inside it). The socket keeps working from
// any thread afterwards.
func Open(u *Umem, cfg Config) (*Socket, error) {
	if u.closed {
		return nil, errors.New("open xdp socket: umem is closed")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("open xdp socket: %w", err)
	}
	iface, err := LookupInterface(cfg.Interface)
	if err != nil {
		return nil, err
	}
	if iface.RxQueues > 0 && cfg.Queue >= iface.RxQueues {
		return nil, noQueueError(iface, cfg.Queue, unix.EINVAL)
	}
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, socketError(err)
	}
	s := &Socket{fd: fd, umem: u, iface: iface, queue: cfg.Queue}
	if err := s.setup(cfg); err != nil {
		s.release()
		return nil, err
	}
	u.socks = append(u.socks, fd)
	return s, nil
}

// OpenLane creates an AF_XDP socket on the device and queue of primary
// that shares primary's UMEM and its fill and completion rings
// (XDP_SHARED_UMEM on the same queue): a second receive ring for the same
// frames, into which an XDP program can redirect some flows, so that the
// thread that serves them waits on a socket of its own. It has an RX ring
// of rxSize entries and no other: frames leave through primary's TX ring,
// and the kernel puts every frame it receives for either socket in a
// frame it took from primary's fill ring.
func OpenLane(primary *Socket, rxSize int) (*Socket, error) {
	if primary.closed || primary.umem.closed {
		return nil, errors.New("open xdp lane: the primary socket is closed")
	}
	if err := checkRingSize("rx", rxSize); err != nil {
		return nil, fmt.Errorf("open xdp lane: %w", err)
	}
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, socketError(err)
	}
	s := laneOf(primary, fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_XDP, unix.XDP_RX_RING, rxSize); err != nil {
		s.release()
		return nil, fmt.Errorf("open xdp lane: size its rx ring to %d entries: %w", rxSize, err)
	}
	if err := s.mapLaneRing(rxSize); err != nil {
		s.release()
		return nil, fmt.Errorf("open xdp lane: %w", err)
	}
	// The flags are the primary's (copy or zero-copy, need-wakeup): the
	// kernel refuses any beside XDP_SHARED_UMEM.
	sa := &unix.SockaddrXDP{Flags: unix.XDP_SHARED_UMEM, Ifindex: uint32(s.iface.Index), QueueID: uint32(s.queue),
		SharedUmemFD: uint32(primary.fd)}
	if err := bindRetry(fd, sa); err != nil {
		s.release()
		return nil, fmt.Errorf("open xdp lane on %s queue %d: %w", s.iface.Name, s.queue, err)
	}
	primary.umem.socks = append(primary.umem.socks, fd)
	return s, nil
}

// AttachLane maps the RX ring of a lane that another process opened on
// primary's socket (OpenLane; its fd received over a unix socket), as
// AttachSocket maps a socket's rings: rxSize must be the opener's.
func AttachLane(primary *Socket, fd int, rxSize int) (*Socket, error) {
	if err := checkRingSize("rx", rxSize); err != nil {
		return nil, fmt.Errorf("attach xdp lane: %w", err)
	}
	s := laneOf(primary, fd)
	if err := s.mapLaneRing(rxSize); err != nil {
		return nil, fmt.Errorf("attach xdp lane fd %d: %w", fd, err)
	}
	primary.umem.socks = append(primary.umem.socks, fd)
	return s, nil
}

// laneOf is socket fd as a lane of primary: its UMEM, device and queue.
func laneOf(primary *Socket, fd int) *Socket {
	return &Socket{fd: fd, umem: primary.umem, iface: primary.iface, queue: primary.queue, zeroCopy: primary.zeroCopy, lane: true}
}

// mapLaneRing maps a lane's one ring, its RX ring of rxSize entries.
func (s *Socket) mapLaneRing(rxSize int) error {
	off, err := ringOffsets(s.fd)
	if err != nil {
		return err
	}
	mem, err := mapRing(s.fd, unix.XDP_PGOFF_RX_RING, off.Rx, rxSize, uint64(unsafe.Sizeof(Desc{})))
	if err != nil {
		return err
	}
	s.maps = append(s.maps, mem)
	s.RX.setup(mem, off.Rx, uint32(rxSize), false)
	return nil
}

// Lane reports that the socket is a lane (OpenLane): an RX ring only.
func (s *Socket) Lane() bool { return s.lane }

// AttachSocket maps the rings of an AF_XDP socket that another process
// opened and bound (its fd received over a unix socket or pidfd_getfd),
// so that this process can drive it: onloadd taking a stalled stack over.
// cfg must be the opener's configuration (ring sizes, interface, queue);
// u is the same UMEM, mapped from its memfd.
func AttachSocket(u *Umem, fd int, cfg Config) (*Socket, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("attach xdp socket: %w", err)
	}
	iface, err := LookupInterface(cfg.Interface)
	if err != nil {
		iface = Interface{Name: cfg.Interface}
	}
	s := &Socket{fd: fd, umem: u, iface: iface, queue: cfg.Queue}
	if err := s.mapRings(cfg); err != nil {
		for _, m := range s.maps {
			unix.Munmap(m)
		}
		return nil, fmt.Errorf("attach xdp socket fd %d: %w", fd, err)
	}
	s.readOptions()
	u.socks = append(u.socks, fd)
	return s, nil
}

// Resync reloads every cached ring index from the shared words: another
// process drove the rings since this one last did.
func (s *Socket) Resync() {
	produced := []*ring{&s.Fill.ring, &s.TX.ring}
	consumed := []*ring{&s.RX.ring, &s.Completion.ring}
	if s.lane {
		produced, consumed = nil, consumed[:1] // an RX ring only
	}
	for _, r := range produced {
		r.cachedProd = atomic.LoadUint32(r.producer)
		r.cachedCons = atomic.LoadUint32(r.consumer) + r.size
	}
	for _, r := range consumed {
		r.cachedProd = atomic.LoadUint32(r.producer)
		r.cachedCons = atomic.LoadUint32(r.consumer)
	}
}

func socketError(err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return &Error{Msg: "creating an AF_XDP socket needs CAP_NET_RAW: run as root, or let onloadd make the stack (start onloadd; ONLOAD_DAEMON=auto)", Kind: ErrPermission, Err: err}
	case errors.Is(err, unix.EAFNOSUPPORT):
		return &Error{Msg: "this kernel has no AF_XDP sockets: Linux 5.11 or later built with CONFIG_XDP_SOCKETS=y is needed", Kind: ErrNotSupported, Err: err}
	}
	return fmt.Errorf("create AF_XDP socket: %w", err)
}

func noQueueError(iface Interface, queue int, err error) error {
	return &Error{
		Msg: fmt.Sprintf("interface %s has %d receive queues, so there is no queue %d; pick a queue below %d (ethtool -L %s combined N adds more)",
			iface.Name, iface.RxQueues, queue, iface.RxQueues, iface.Name),
		Kind: ErrNoQueue, Err: err,
	}
}

func (s *Socket) setup(cfg Config) error {
	u := s.umem
	var bindFlags uint16 = unix.XDP_USE_NEED_WAKEUP
	var sharedFD uint32
	if len(u.socks) == 0 {
		frames := u.Frames()
		reg := unix.XDPUmemReg{
			Addr:     uint64(uintptr(unsafe.Pointer(&frames[0]))),
			Len:      uint64(len(frames)),
			Size:     uint32(u.cfg.FrameSize),
			Headroom: uint32(u.cfg.Headroom),
		}
		if err := setsockopt(s.fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
			return fmt.Errorf("register %d MiB of umem with the kernel: %w (memory is charged to the cgroup; lower the frame count or raise the limit)",
				len(frames)>>20, err)
		}
	} else {
		bindFlags |= unix.XDP_SHARED_UMEM
		sharedFD = uint32(u.socks[0])
	}
	for _, r := range []struct {
		opt  int
		size int
	}{
		{unix.XDP_UMEM_FILL_RING, cfg.FillSize},
		{unix.XDP_UMEM_COMPLETION_RING, cfg.CompletionSize},
		{unix.XDP_RX_RING, cfg.RxSize},
		{unix.XDP_TX_RING, cfg.TxSize},
	} {
		if err := unix.SetsockoptInt(s.fd, unix.SOL_XDP, r.opt, r.size); err != nil {
			return fmt.Errorf("size xdp ring (option %d) to %d entries: %w", r.opt, r.size, err)
		}
	}
	if err := s.mapRings(cfg); err != nil {
		return err
	}
	switch cfg.Mode {
	case BindCopy:
		bindFlags |= unix.XDP_COPY
	case BindZeroCopy:
		bindFlags |= unix.XDP_ZEROCOPY
	}
	sa := &unix.SockaddrXDP{Flags: bindFlags, Ifindex: uint32(s.iface.Index), QueueID: uint32(cfg.Queue), SharedUmemFD: sharedFD}
	if err := bindRetry(s.fd, sa); err != nil {
		return s.bindError(cfg, err)
	}
	s.readOptions()
	return nil
}

// readOptions learns how the kernel bound the socket (XDP_OPTIONS):
// zero-copy or not.
func (s *Socket) readOptions() {
	var opts uint32
	optlen := uint32(4)
	if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), unix.SOL_XDP, unix.XDP_OPTIONS,
		uintptr(unsafe.Pointer(&opts)), uintptr(unsafe.Pointer(&optlen)), 0); errno == 0 {
		s.zeroCopy = opts&unix.XDP_OPTIONS_ZEROCOPY != 0
	}
}

// mapRings maps the four rings of the socket.
func (s *Socket) mapRings(cfg Config) error {
	off, err := ringOffsets(s.fd)
	if err != nil {
		return err
	}
	descSize := uint64(unsafe.Sizeof(Desc{}))
	maps := []struct {
		pgoff int64
		off   unix.XDPRingOffset
		n     int
		elem  uint64
	}{
		{unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, cfg.FillSize, 8},
		{unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, cfg.CompletionSize, 8},
		{unix.XDP_PGOFF_RX_RING, off.Rx, cfg.RxSize, descSize},
		{unix.XDP_PGOFF_TX_RING, off.Tx, cfg.TxSize, descSize},
	}
	mems := make([][]byte, len(maps))
	for i, m := range maps {
		mem, err := mapRing(s.fd, m.pgoff, m.off, m.n, m.elem)
		if err != nil {
			return err
		}
		s.maps = append(s.maps, mem)
		mems[i] = mem
	}
	s.Fill.setup(mems[0], off.Fr, uint32(cfg.FillSize), true)
	s.Completion.setup(mems[1], off.Cr, uint32(cfg.CompletionSize), false)
	s.RX.setup(mems[2], off.Rx, uint32(cfg.RxSize), false)
	s.TX.setup(mems[3], off.Tx, uint32(cfg.TxSize), true)
	return nil
}

// ringOffsets reads where in its mapping each of socket fd's rings keeps
// its indices and entries (XDP_MMAP_OFFSETS).
func ringOffsets(fd int) (unix.XDPMmapOffsets, error) {
	var off unix.XDPMmapOffsets
	optlen := uint32(unsafe.Sizeof(off))
	if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&optlen)), 0); errno != 0 {
		return off, fmt.Errorf("read xdp ring offsets: %w", errno)
	}
	return off, nil
}

// mapRing maps one ring of socket fd: n entries of elem bytes at page
// offset pgoff.
func mapRing(fd int, pgoff int64, off unix.XDPRingOffset, n int, elem uint64) ([]byte, error) {
	mem, err := unix.Mmap(fd, pgoff, int(off.Desc+uint64(n)*elem), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map xdp ring at page offset %#x: %w", pgoff, err)
	}
	return mem, nil
}

// bindRetry binds, retrying for a short while on EBUSY: the kernel frees a
// closed socket's hold on its queue from a work queue, a moment after
// close returns, so a queue released just now reads as busy.
func bindRetry(fd int, sa *unix.SockaddrXDP) error {
	delay := 500 * time.Microsecond
	deadline := time.Now().Add(250 * time.Millisecond)
	for {
		err := unix.Bind(fd, sa)
		if err != unix.EBUSY || time.Now().After(deadline) {
			return err
		}
		time.Sleep(delay)
		delay = min(2*delay, 20*time.Millisecond)
	}
}

func (s *Socket) bindError(cfg Config, err error) error {
	name, q := s.iface.Name, cfg.Queue
	switch {
	case errors.Is(err, unix.EBUSY):
		return &Error{
			Msg:  fmt.Sprintf("interface %s queue %d is already used by another AF_XDP socket; run onloadd to share it", name, q),
			Kind: ErrQueueBusy, Err: err,
		}
	case errors.Is(err, unix.EINVAL) && s.iface.RxQueues > 0 && q >= s.iface.RxQueues:
		return noQueueError(s.iface, q, err)
	case errors.Is(err, unix.EOPNOTSUPP) && cfg.Mode == BindZeroCopy:
		return &Error{
			Msg:  fmt.Sprintf("the driver of interface %s cannot do zero-copy AF_XDP; use copy mode (BindAuto or BindCopy)", name),
			Kind: ErrNotSupported, Err: err,
		}
	case errors.Is(err, unix.ENETDOWN):
		return &Error{Msg: fmt.Sprintf("interface %s is down; bring it up (ip link set %s up)", name, name), Err: err}
	}
	return fmt.Errorf("bind AF_XDP socket to interface %s queue %d: %w", name, q, err)
}

func setsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	if _, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), n, 0); errno != 0 {
		return errno
	}
	return nil
}

// FD is the socket's file descriptor, for the XSKMAP and for poll(2).
func (s *Socket) FD() int { return s.fd }

// Umem is the UMEM the socket was opened on.
func (s *Socket) Umem() *Umem { return s.umem }

// Interface is the device the socket is bound to.
func (s *Socket) Interface() Interface { return s.iface }

// Queue is the device queue the socket is bound to.
func (s *Socket) Queue() int { return s.queue }

// ZeroCopy reports whether the driver moves frames in and out of the UMEM
// without copying. On veth and other drivers without AF_XDP support it is
// false: the kernel copies (copy mode).
func (s *Socket) ZeroCopy() bool { return s.zeroCopy }

// Kick tells the kernel to process the TX ring. In copy mode the kernel
// sends at most a budget of frames per call and reports EAGAIN when more
// remain, so Kick repeats (a bounded number of times) while frames are left.
// Transient conditions (EAGAIN, EBUSY, ENOBUFS) are not errors: the frames
// stay queued and the next Kick sends them.
func (s *Socket) Kick() error {
	for range 1 + s.TX.Size()/16 {
		// A raw system call: sendto with MSG_DONTWAIT never blocks, and
		// skipping the scheduler's enter/exit bookkeeping saves a large
		// share of a microsecond round trip.
		_, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EAGAIN, unix.EBUSY:
			if s.TX.Pending() == 0 {
				return nil
			}
		case unix.ENOBUFS, unix.EINTR:
			return nil
		default:
			return fmt.Errorf("kick tx on %s queue %d: %w", s.iface.Name, s.queue, errno)
		}
	}
	return nil
}

// KickRX tells the kernel that the fill ring has frames again; needed only
// when Fill.NeedsWakeup() says so (zero-copy drivers).
func (s *Socket) KickRX() error {
	_, _, errno := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	switch errno {
	case 0, unix.EAGAIN, unix.EBUSY, unix.EINTR:
		return nil
	}
	return fmt.Errorf("kick rx on %s queue %d: %w", s.iface.Name, s.queue, errno)
}

// Wait blocks until the RX ring has frames or timeout passes (negative:
// forever). It is the sleeping path; busy-pollers do not call it.
func (s *Socket) Wait(timeout time.Duration) error {
	ms := -1
	if timeout >= 0 {
		ms = int((timeout + time.Millisecond - 1) / time.Millisecond)
	}
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll xdp socket: %w", err)
		}
		return nil
	}
}

// Stats are the kernel's counters for one socket (XDP_STATISTICS).
type Stats struct {
	RxDropped            uint64 // frames dropped for reasons other than invalid descriptors
	RxInvalidDescs       uint64 // received frames dropped: invalid descriptor
	TxInvalidDescs       uint64 // frames not sent: invalid descriptor
	RxRingFull           uint64 // frames dropped because the RX ring was full
	RxFillRingEmptyDescs uint64 // times the fill ring was empty when a frame arrived
	TxRingEmptyDescs     uint64 // times the kernel found the TX ring empty
}

// Stats reads the socket's kernel counters.
func (s *Socket) Stats() (Stats, error) {
	var st Stats
	optlen := uint32(unsafe.Sizeof(st))
	if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), unix.SOL_XDP, unix.XDP_STATISTICS,
		uintptr(unsafe.Pointer(&st)), uintptr(unsafe.Pointer(&optlen)), 0); errno != 0 {
		return Stats{}, fmt.Errorf("read xdp statistics: %w", errno)
	}
	return st, nil
}

// Close unmaps the rings and closes the socket. Frames still in the rings
// are the caller's to account for; the UMEM stays mapped until it is closed.
func (s *Socket) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	s.umem.socks = slices.DeleteFunc(s.umem.socks, func(fd int) bool { return fd == s.fd })
	return s.release()
}

func (s *Socket) release() error {
	var errs []error
	for _, m := range s.maps {
		errs = append(errs, unix.Munmap(m))
	}
	s.maps = nil
	errs = append(errs, unix.Close(s.fd))
	return errors.Join(errs...)
}
