package stack

import (
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/timers"
	"github.com/xdp-onload/onload/vnic"
)

// The stack image is one memfd holding every byte of a stack's state, so
// that a second process (onloadd) can map it and carry on where the first
// stopped:
//
//	header   the layout hash, the lock, configuration, counters
//	sockets  the socket table: fixed slots, linked by SockID
//	buckets  the connection hash table: SockID chains by 4-tuple, then
//	         as many chains of the sockets bound to each port, by port
//	neigh    the neighbour table: IPv4 → Ethernet address
//	timers   the timer wheel (package timers)
//
// Frames are not in the image: they are in the UMEM memfd, named by
// vnic.Handle. The image holds no Go pointers; cross-references are
// indices checked on every use.

// imageVersion changes whenever the meaning of the image changes in a way
// the layout hash cannot see. 2: the send queue's frame flags carry the
// SACK scoreboard, and the TCB flags were renumbered. 3: the socket's wake
// flag has a bit of its own (it shared one with sfRcvBufSet). 4: the
// buckets region holds the port chains after the 4-tuple chains (and the
// TIME-WAIT list, which the layout hash sees, came with it). 5: a
// HANDED-OVER socket's out-of-order list holds, after the catch-up,
// whole IP packets for EndHandover (tfLate).
const imageVersion = 7

const imageMagic = 0x474d494f // "OIMG"

// header starts the image.
type header struct {
	magic   uint32
	version uint32
	layout  uint64 // layoutHash of the build that made the image
	lock    Lock
	_       uint32
	size    uint64

	// Configuration, fixed at creation.
	sockets    uint32
	buckets    uint32 // a power of two
	neighs     uint32
	timerSlots uint32
	tickNs     uint64
	addr       [4]byte
	prefixLen  uint32
	gateway    [4]byte
	mac        [6]byte
	_          [2]byte
	mtu        uint32
	recvBuffer uint32
	sendBuffer uint32
	recvMax    uint32
	sendMax    uint32
	ccAlgo     uint32
	minRTO     uint32 // µs
	delAck     uint64 // ns
	timeWait   uint64 // ns
	// notsentLowat: Config.NotSentLowat, the TCP_NOTSENT_LOWAT of the
	// sockets that set none.
	notsentLowat uint32
	_            uint32

	// Offsets of the regions.
	offSockets, offBuckets, offNeigh, offTimers uint64

	// State.
	challengeSec, challengeCount uint32 // RFC 5961 challenge ACKs this second
	sndFrames                    uint32 // frames in TCP send queues, all sockets
	sockFree                     uint32 // head of the free socket list (a slot index)
	sockInUse                    uint32
	sockTimeWait                 uint32 // of those, in TIME-WAIT: recycled when the table is full
	twHead, twTail               uint32 // the TIME-WAIT list (twLinkLocked), oldest first
	sockSynRcvd                  uint32 // of those, passive and half-open: a flood's are answered by cookies
	overflow                     uint32 // 1: the table is nearly full of live sockets: new connections go to the kernel (Options.Overflow)
	ephemeral                    uint32 // next ephemeral port to try
	isnKey                       [16]byte
	ipID                         uint32 // next IPv4 identification
	neighWait                    uint32 // neighbour entries being resolved
	sockHigh                     uint32 // slots below this have been used: scans stop there
	poller                       uint64 // the Stack (process) that last took the lock
	// appPolledAt is when a thread of a client process last polled or
	// found nothing to poll, on the Clock: onloadd's watcher reads it
	// (takeover.go), and its own polls do not write it.
	appPolledAt int64
	// The receivers (tcp_rcvshare.go): how many connections took in data
	// lately, as of the last count; the count's number; when it was made
	// (the Clock).
	rcvActive  uint32
	rcvEpoch   uint32
	rcvCountAt int64
	// lateKept counts the HANDED-OVER sockets keeping segments, for a
	// handle that can give them to the kernel (sfLateKept); handedOverAt
	// is when a handover last ended (EndHandover, the Clock).
	lateKept     uint32
	_            uint32
	handedOverAt int64
	counters     Counters

	// The processes that share the stack and wake one another's threads
	// (JoinWakes): a socket's owner is an index here, plus one.
	procs [maxProcs]procSlot

	// The ready log (ready.go): the slots of the sockets whose readiness
	// may have risen, the last readyLogLen of them, for callers that
	// emulate epoll over many sockets and check only those.
	readySeq  uint32 // entries ever written; the next goes at readySeq % readyLogLen
	readyRead uint32 // readySeq when a reader last read the log
	readyLog  [readyLogLen]uint32
}

// maxProcs is how many processes may share one stack's wake-ups.
const maxProcs = 32

// procSlot is one process sharing the stack: its pid, and the futex word
// other processes bump to wake it, or the key of the socket they send to
// (wake.go).
type procSlot struct {
	pid  uint32
	wake uint32
	// key, if not 0, names the process's wake socket instead
	// (WakeSocket): wake.go's wakeAddr.
	key uint32
	// direct counts the process's threads blocked on the stack's
	// interrupt themselves now (ParkedDirect): a frame wakes one of them,
	// so the other processes' Sleepers may leave it to them (Elsewhere).
	direct uint32
}

// neighbour is one entry of the neighbour table. While the kernel
// resolves an address the entry holds the frames waiting for it.
type neighbour struct {
	addr     [4]byte
	mac      [6]byte
	state    uint8 // neighFree, neighIncomplete, neighValid, neighFailed
	npending uint8
	pendHead vnic.Handle
	pendTail vnic.Handle
	since    timers.Tick // when resolution started or failed
}

const (
	neighFree       = 0
	neighIncomplete = 1
	neighValid      = 2
	neighFailed     = 3
)

// layoutHash fingerprints the image's structures: their fields' names,
// offsets and sizes. A process built with a different layout is refused
// rather than allowed to misread the image.
func layoutHash() uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "v%d;", imageVersion)
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		fmt.Fprintf(h, "%s:%d{", t.Name(), t.Size())
		if t.Kind() == reflect.Struct {
			for i := range t.NumField() {
				f := t.Field(i)
				fmt.Fprintf(h, "%s@%d:", f.Name, f.Offset)
				walk(f.Type)
			}
		}
		h.Write([]byte("}"))
	}
	for _, v := range []any{header{}, sock{}, neighbour{}} {
		walk(reflect.TypeOf(v))
	}
	return h.Sum64()
}

// Image is a stack image mapped into this process.
type Image struct {
	mem     []byte
	fd      int
	hdr     *header
	socks   []sock
	buckets []uint32
	ports   []uint32 // the sockets bound to each port (portLinkLocked)
	neigh   []neighbour
	wheel   *timers.Wheel
}

// timersPerSock is how many timers each socket owns in the wheel; the
// stack's own timers come after the sockets'.
const (
	timersPerSock = 4
	stackTimers   = 4
)

type imageLayout struct {
	offSockets, offBuckets, offNeigh, offTimers, size uint64
	buckets                                           uint32
}

const neighEntries = 256

func layoutFor(c *Config) imageLayout {
	var l imageLayout
	align := func(n uint64) uint64 { return (n + 63) &^ 63 }
	l.buckets = 1
	for l.buckets < uint32(2*c.Sockets) {
		l.buckets <<= 1
	}
	l.offSockets = align(uint64(unsafe.Sizeof(header{})))
	l.offBuckets = align(l.offSockets + uint64(c.Sockets)*uint64(unsafe.Sizeof(sock{})))
	l.offNeigh = align(l.offBuckets + 2*uint64(l.buckets)*4) // the 4-tuple chains, then the ports'
	l.offTimers = align(l.offNeigh + neighEntries*uint64(unsafe.Sizeof(neighbour{})))
	l.size = uint64(pageAlign(int(l.offTimers) + timers.Size(c.Sockets*timersPerSock+stackTimers, c.TimerSlots)))
	return l
}

func pageAlign(n int) int {
	p := unix.Getpagesize()
	return (n + p - 1) &^ (p - 1)
}

// newImage creates a memfd for a stack configured by c and lays the image
// out in it.
func newImage(c *Config, now Mono) (*Image, error) {
	l := layoutFor(c)
	fd, err := unix.MemfdCreate("onload-stack", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("create stack image memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(l.size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("size stack image to %d bytes: %w", l.size, err)
	}
	mem, err := unix.Mmap(fd, 0, int(l.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("map %d bytes of stack image: %w", l.size, err)
	}
	img := &Image{mem: mem, fd: fd, hdr: (*header)(unsafe.Pointer(&mem[0]))}
	h := img.hdr
	*h = header{
		magic: imageMagic, version: imageVersion, layout: layoutHash(), size: l.size,
		sockets: uint32(c.Sockets), buckets: l.buckets, neighs: neighEntries, timerSlots: uint32(c.TimerSlots),
		tickNs: uint64(c.Tick), addr: c.Addr.Addr().As4(), prefixLen: uint32(c.Addr.Bits()),
		mtu: uint32(c.MTU), recvBuffer: uint32(c.RecvBuffer), sendBuffer: uint32(c.SendBuffer),
		recvMax: uint32(c.RecvBufferMax), sendMax: uint32(c.SendBufferMax), ccAlgo: uint32(congestionAlgo(c.Congestion)),
		minRTO: uint32(c.MinRTO / time.Microsecond), delAck: uint64(c.DelayedAck), timeWait: uint64(c.TimeWait),
		offSockets: l.offSockets, offBuckets: l.offBuckets, offNeigh: l.offNeigh, offTimers: l.offTimers,
		ephemeral: ephemeralLow, twHead: noSlot, twTail: noSlot, notsentLowat: c.NotSentLowat,
	}
	copy(h.mac[:], c.MAC)
	if c.Gateway.IsValid() {
		h.gateway = c.Gateway.As4()
	}
	if _, err := rand.Read(h.isnKey[:]); err != nil {
		img.Close()
		return nil, fmt.Errorf("read a secret for initial sequence numbers: %w", err)
	}
	if err := img.view(); err != nil {
		img.Close()
		return nil, err
	}
	for i := range img.buckets {
		img.buckets[i], img.ports[i] = noSlot, noSlot
	}
	img.formatSockets()
	if img.wheel, err = timers.Format(img.mem[l.offTimers:], c.Sockets*timersPerSock+stackTimers, c.TimerSlots, timers.Tick(int64(now)/int64(c.Tick))); err != nil {
		img.Close()
		return nil, err
	}
	return img, nil
}

// AttachImage maps a stack image made by another process from its memfd
// (which the Image then owns). The image's layout must be this build's.
func AttachImage(fd int) (*Image, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("attach stack image: %w", err)
	}
	if st.Size < int64(unsafe.Sizeof(header{})) {
		return nil, fmt.Errorf("attach stack image: %d bytes is too small to be one", st.Size)
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("attach stack image: map: %w", err)
	}
	img := &Image{mem: mem, fd: fd, hdr: (*header)(unsafe.Pointer(&mem[0]))}
	h := img.hdr
	switch {
	case h.magic != imageMagic:
		err = fmt.Errorf("attach stack image: not a stack image (magic %#x)", h.magic)
	case h.layout != layoutHash() || h.version != imageVersion:
		err = fmt.Errorf("attach stack image: made by a different build (layout %#x version %d; this build: %#x version %d): run the same version on both sides",
			h.layout, h.version, layoutHash(), imageVersion)
	case h.size != uint64(st.Size):
		err = fmt.Errorf("attach stack image: header says %d bytes, the memfd holds %d", h.size, st.Size)
	}
	if err == nil {
		err = img.view()
	}
	if err == nil {
		img.wheel, err = timers.Attach(img.mem[h.offTimers:])
	}
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return img, nil
}

// view makes the slices over the regions, checking that they fit.
func (img *Image) view() error {
	h := img.hdr
	size := uint64(len(img.mem))
	// fits: n items of sz bytes from off lie within the image, worked out
	// without overflow (the header is the writer's word, and a hostile
	// one can make off+n*sz wrap).
	fits := func(off, n, sz uint64) bool {
		return off <= size && off%8 == 0 && n <= (size-off)/sz
	}
	if h.sockets < 1 || h.sockets > maxSockets || h.buckets == 0 || h.buckets > 2*maxSockets || h.buckets&(h.buckets-1) != 0 || h.neighs != neighEntries ||
		!fits(h.offSockets, uint64(h.sockets), uint64(unsafe.Sizeof(sock{}))) || h.offSockets < uint64(unsafe.Sizeof(header{})) ||
		!fits(h.offBuckets, 2*uint64(h.buckets), 4) || h.offBuckets < h.offSockets+uint64(h.sockets)*uint64(unsafe.Sizeof(sock{})) ||
		!fits(h.offNeigh, uint64(h.neighs), uint64(unsafe.Sizeof(neighbour{}))) || h.offNeigh < h.offBuckets+2*uint64(h.buckets)*4 ||
		h.offTimers >= size || h.offTimers < h.offNeigh+uint64(h.neighs)*uint64(unsafe.Sizeof(neighbour{})) || h.tickNs == 0 {
		return errors.New("stack image header is inconsistent")
	}
	img.socks = unsafe.Slice((*sock)(unsafe.Pointer(&img.mem[h.offSockets])), h.sockets)
	img.buckets = unsafe.Slice((*uint32)(unsafe.Pointer(&img.mem[h.offBuckets])), h.buckets)
	img.ports = unsafe.Slice((*uint32)(unsafe.Pointer(&img.mem[h.offBuckets+uint64(h.buckets)*4])), h.buckets)
	img.neigh = unsafe.Slice((*neighbour)(unsafe.Pointer(&img.mem[h.offNeigh])), h.neighs)
	return nil
}

// FD is the image's memfd, to hand to another process.
func (img *Image) FD() int { return img.fd }

// Size is the image's size in bytes.
func (img *Image) Size() int { return len(img.mem) }

// Close unmaps the image and closes its memfd.
func (img *Image) Close() error {
	if img.mem == nil {
		return nil
	}
	err := errors.Join(unix.Munmap(img.mem), unix.Close(img.fd))
	img.mem = nil
	return err
}
