package vnic

import (
	"errors"
	"fmt"
	"math/bits"
	"unsafe"
)

// Handle names one frame of a Pool: a 20-bit frame index and a 12-bit
// generation. A handle is valid only while its frame is owned by the
// caller and the generation matches (seed 003's Tag_Instance): every
// transition out of the caller's hands (Free, Transmit) bumps the
// generation, so a stale handle is refused instead of touching a frame
// that now belongs to someone else. Generation 0 is never issued, so the
// zero Handle is Null.
type Handle uint32

// Null is the handle of no frame.
const Null Handle = 0

const (
	indexBits = 20
	indexMask = 1<<indexBits - 1
	genMask   = 1<<(32-indexBits) - 1
	// MaxFrames is the most frames a pool can have.
	MaxFrames = 1 << indexBits
)

func makeHandle(idx, gen uint32) Handle { return Handle(gen<<indexBits | idx) }

// Index is the frame number the handle names.
func (h Handle) Index() uint32 { return uint32(h) & indexMask }

// Gen is the handle's generation.
func (h Handle) Gen() uint32 { return uint32(h) >> indexBits }

func (h Handle) String() string {
	if h == Null {
		return "frame(null)"
	}
	return fmt.Sprintf("frame(%d/%d)", h.Index(), h.Gen())
}

// Frame states, kept in the shared descriptor.
const (
	stateFree   = 1 // in the pool's free stack
	stateApp    = 2 // owned by whoever holds the handle
	stateKernel = 3 // in a ring: the kernel or the wire owns it
)

// poolHeader starts the metadata region. Everything in the region is
// plain integers: no Go pointers, so another process can map it.
type poolHeader struct {
	magic     uint32
	version   uint32
	count     uint32
	frameSize uint32
	headroom  uint32
	freeTop   uint32 // entries in the free stack
	stale     uint32 // handles refused: stale, forged or not owned
	empty     uint32 // allocations refused: no free frame
	_         [8]uint32
}

// AuxWords is how many 32-bit words of its own a frame's owner may keep in
// the frame's descriptor (the stack keeps a segment's sequence number,
// checksum and send time there).
const AuxWords = 5

// frameDesc is one frame's shared descriptor.
type frameDesc struct {
	gen   uint16
	state uint8
	flags uint8  // flagBusy
	off   uint16 // first byte of data, from the start of the chunk
	len   uint16 // bytes of data
	next  Handle // for lists kept by the frame's owner (the stack's queues)
	aux   [AuxWords]uint32
}

// flagBusy: an owned frame is also in a transmit ring (TransmitKeep); its
// bytes must not change until the NIC is done with it.
const flagBusy = 1

const (
	poolMagic   = 0x504c4e4f // "ONLP"
	poolVersion = 2
	headerSize  = int(unsafe.Sizeof(poolHeader{}))
	descSize    = int(unsafe.Sizeof(frameDesc{}))
)

// Errors a Pool returns. They are values, so returning one allocates
// nothing.
var (
	ErrStale     = errors.New("stale or invalid frame handle: the frame was freed, transmitted or never allocated")
	ErrPoolEmpty = errors.New("no free frames in the pool")
	ErrTooLong   = errors.New("frame data does not fit the frame buffer")
	ErrBusy      = errors.New("frame is still being sent: it cannot be sent again or changed until the NIC is done with it")
)

// PoolMetaSize is the size of the metadata region for count frames.
func PoolMetaSize(count int) int {
	return headerSize + align(count*4, 16) + count*descSize
}

func align(n, a int) int { return (n + a - 1) &^ (a - 1) }

// Pool hands out the frames of one packet memory (a UMEM, or ordinary
// memory for the in-memory NIC). Its state lives in a metadata region
// next to the frames, not in Go objects, so that a second process mapping
// both sees the same frames, owners and generations.
//
// A Pool is not safe for concurrent use: one goroutine (the holder of the
// stack lock) uses it at a time.
type Pool struct {
	hdr       *poolHeader
	free      []uint32
	descs     []frameDesc
	frames    []byte
	frameSize uint32
	count     uint32
	headroom  uint32
	// frameShift is log2(frameSize) when that is a power of two (as a
	// UMEM's frames are), so that an address becomes a frame number by a
	// shift instead of a division on every received and sent frame; 0
	// otherwise.
	frameShift uint32
}

// split turns a frame address into the frame's number and the offset in
// it.
func (p *Pool) split(addr uint64) (idx, off uint64) {
	if p.frameShift != 0 {
		return addr >> p.frameShift, addr & (uint64(p.frameSize) - 1)
	}
	return addr / uint64(p.frameSize), addr % uint64(p.frameSize)
}

// setFrameSize records the frame size and its shift.
func (p *Pool) setFrameSize(fs uint32) {
	p.frameSize, p.frameShift = fs, 0
	if fs&(fs-1) == 0 {
		p.frameShift = uint32(bits.TrailingZeros32(fs))
	}
}

// NewPool formats meta (PoolMetaSize(len(frames)/frameSize) bytes, 8-byte
// aligned) and returns a pool of every frame in frames, all free. headroom
// is where data starts in a frame the caller fills for sending.
func NewPool(meta, frames []byte, frameSize, headroom int) (*Pool, error) {
	if frameSize < 128 || frameSize > 32768 {
		return nil, fmt.Errorf("frame size %d: must be from 128 to 32768", frameSize)
	}
	if headroom < 0 || headroom >= frameSize-64 {
		return nil, fmt.Errorf("headroom %d: must be from 0 to %d for %d-byte frames", headroom, frameSize-65, frameSize)
	}
	count := len(frames) / frameSize
	if count < 1 || count > MaxFrames {
		return nil, fmt.Errorf("%d frames: a pool holds from 1 to %d", count, MaxFrames)
	}
	if len(meta) < PoolMetaSize(count) {
		return nil, fmt.Errorf("pool metadata region of %d bytes: %d frames need %d", len(meta), count, PoolMetaSize(count))
	}
	if uintptr(unsafe.Pointer(&meta[0]))%8 != 0 {
		return nil, errors.New("pool metadata region is not 8-byte aligned")
	}
	clear(meta[:PoolMetaSize(count)])
	p := view(meta, frames, uint32(count))
	*p.hdr = poolHeader{magic: poolMagic, version: poolVersion, count: uint32(count), frameSize: uint32(frameSize), headroom: uint32(headroom)}
	p.setFrameSize(uint32(frameSize))
	p.headroom = uint32(headroom)
	// Push in reverse so that frames come out in index order.
	for i := count - 1; i >= 0; i-- {
		p.descs[i] = frameDesc{gen: 1, state: stateFree}
		p.free[p.hdr.freeTop] = uint32(i)
		p.hdr.freeTop++
	}
	return p, nil
}

// AttachPool returns a view of a pool another process formatted with
// NewPool over the same memory. The header is checked; descriptors are
// checked on every use.
func AttachPool(meta, frames []byte) (*Pool, error) {
	if len(meta) < headerSize {
		return nil, errors.New("attach pool: metadata region too small for a header")
	}
	h := (*poolHeader)(unsafe.Pointer(&meta[0]))
	if h.magic != poolMagic || h.version != poolVersion {
		return nil, fmt.Errorf("attach pool: bad magic %#x or version %d (built by a different version?)", h.magic, h.version)
	}
	fs, count := h.frameSize, h.count
	if fs < 128 || fs > 32768 || count < 1 || count > MaxFrames || uint64(count)*uint64(fs) > uint64(len(frames)) ||
		len(meta) < PoolMetaSize(int(count)) || h.headroom >= fs-64 {
		return nil, fmt.Errorf("attach pool: header (count %d, frame size %d) does not fit the regions", count, fs)
	}
	p := view(meta, frames, count)
	p.setFrameSize(fs)
	p.headroom = h.headroom
	return p, nil
}

func view(meta, frames []byte, count uint32) *Pool {
	freeOff := headerSize
	descOff := headerSize + align(int(count)*4, 16)
	return &Pool{
		hdr:    (*poolHeader)(unsafe.Pointer(&meta[0])),
		free:   unsafe.Slice((*uint32)(unsafe.Pointer(&meta[freeOff])), count),
		descs:  unsafe.Slice((*frameDesc)(unsafe.Pointer(&meta[descOff])), count),
		frames: frames,
		count:  count,
	}
}

// desc returns the descriptor of an owned frame, or nil (and counts a
// refusal) if h is not a handle the caller holds.
func (p *Pool) desc(h Handle) *frameDesc {
	// len(p.descs) is p.count; bounding by it spares a second check.
	if idx := h.Index(); idx < uint32(len(p.descs)) {
		if d := &p.descs[idx]; d.state == stateApp && uint32(d.gen) == h.Gen() && h.Gen() != 0 {
			return d
		}
	}
	if h != Null { // asking after no frame is not a stale handle
		p.hdr.stale++
	}
	return nil
}

func nextGen(g uint16) uint16 {
	g = (g + 1) & genMask
	if g == 0 {
		g = 1
	}
	return g
}

func (p *Pool) popFree() (uint32, bool) {
	top := p.hdr.freeTop
	if top == 0 || top > p.count {
		return 0, false
	}
	idx := p.free[top-1]
	if idx >= p.count || p.descs[idx].state != stateFree {
		// Corrupt shared state: refuse rather than hand out a frame
		// someone else owns.
		return 0, false
	}
	p.hdr.freeTop = top - 1
	return idx, true
}

func (p *Pool) pushFree(idx uint32) {
	d := &p.descs[idx]
	d.state, d.flags = stateFree, 0
	d.next = Null
	if p.hdr.freeTop < p.count {
		p.free[p.hdr.freeTop] = idx
		p.hdr.freeTop++
	}
}

// Alloc takes a free frame and returns its handle, or Null if none is free.
// The frame's data is empty, starting at the headroom.
func (p *Pool) Alloc() Handle {
	idx, ok := p.popFree()
	if !ok {
		p.hdr.empty++
		return Null
	}
	d := &p.descs[idx]
	d.state, d.flags = stateApp, 0
	d.off, d.len, d.next, d.aux = uint16(p.headroom), 0, Null, [AuxWords]uint32{}
	return makeHandle(idx, uint32(d.gen))
}

// AllocBatch fills hs with new frames and returns how many it got.
func (p *Pool) AllocBatch(hs []Handle) int {
	for i := range hs {
		if hs[i] = p.Alloc(); hs[i] == Null {
			return i
		}
	}
	return len(hs)
}

// Free returns a frame to the pool. Freeing a handle twice, or one that was
// transmitted, returns ErrStale and changes nothing.
//
// A frame still being sent (TransmitKeep) is given up at once (the handle
// goes stale) and returns to the pool when the NIC is done with it.
func (p *Pool) Free(h Handle) error {
	d := p.desc(h)
	if d == nil {
		return ErrStale
	}
	d.gen = nextGen(d.gen)
	if d.flags&flagBusy != 0 {
		d.state, d.flags = stateKernel, 0
		return nil
	}
	p.pushFree(h.Index())
	return nil
}

// Busy reports whether a frame the caller holds is still being sent
// (TransmitKeep): until it is not, its bytes must not change and it cannot
// be sent again.
func (p *Pool) Busy(h Handle) bool {
	d := p.desc(h)
	return d != nil && d.flags&flagBusy != 0
}

// Aux reads word i (below AuxWords) of the frame's owner data; 0 for a
// handle the caller does not hold.
func (p *Pool) Aux(h Handle, i int) uint32 {
	if d := p.desc(h); d != nil && uint(i) < AuxWords {
		return d.aux[i]
	}
	return 0
}

// SetAux writes word i of the frame's owner data.
func (p *Pool) SetAux(h Handle, i int, v uint32) error {
	d := p.desc(h)
	if d == nil || uint(i) >= AuxWords {
		return ErrStale
	}
	d.aux[i] = v
	return nil
}

// Check returns nil if the caller holds h, ErrStale otherwise.
func (p *Pool) Check(h Handle) error {
	if p.desc(h) == nil {
		return ErrStale
	}
	return nil
}

func (p *Pool) chunk(idx uint32) []byte {
	// Callers pass the index of a handle desc accepted, so idx < count,
	// and the frames region holds count frames (NewPool, AttachPool): the
	// chunk lies inside it without a bounds check.
	base := uintptr(idx) * uintptr(p.frameSize)
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(p.frames)), base)), p.frameSize)
}

// Buf is the space to build a frame in: from the headroom to the end of the
// frame buffer. Write the frame there and call SetLen. It returns nil for a
// handle the caller does not hold.
func (p *Pool) Buf(h Handle) []byte {
	if p.desc(h) == nil {
		return nil
	}
	return p.chunk(h.Index())[p.headroom:]
}

// Data is the frame's bytes, or nil for a handle the caller does not hold.
func (p *Pool) Data(h Handle) []byte {
	d := p.desc(h)
	if d == nil {
		return nil
	}
	end := uint32(d.off) + uint32(d.len)
	if end > p.frameSize {
		return nil // corrupt descriptor
	}
	return p.chunk(h.Index())[d.off:end]
}

// SetLen sets the frame to the n bytes written at the start of Buf.
func (p *Pool) SetLen(h Handle, n int) error {
	return p.SetData(h, int(p.headroom), n)
}

// SetData sets the frame's data to n bytes starting off bytes into the
// frame buffer (Buf starts at Headroom).
func (p *Pool) SetData(h Handle, off, n int) error {
	d := p.desc(h)
	if d == nil {
		return ErrStale
	}
	if d.flags&flagBusy != 0 {
		return ErrBusy
	}
	if off < 0 || n < 0 || off+n > int(p.frameSize) {
		return ErrTooLong
	}
	d.off, d.len = uint16(off), uint16(n)
	return nil
}

// Trim narrows the frame's data to n bytes starting start bytes into it
// (a layer stripping the headers below it).
func (p *Pool) Trim(h Handle, start, n int) error {
	d := p.desc(h)
	if d == nil {
		return ErrStale
	}
	return trim(d, start, n)
}

// Trim is Pool.Trim on a view.
func (f Frame) Trim(start, n int) error { return trim(f.d, start, n) }

func trim(d *frameDesc, start, n int) error {
	if start < 0 || n < 0 || start+n > int(d.len) {
		return ErrTooLong
	}
	d.off += uint16(start)
	d.len = uint16(n)
	return nil
}

// Next and SetNext link frames into lists for the frame's owner (the
// stack's send and receive queues). A handle the caller does not hold
// reads as Null and cannot be set.
func (p *Pool) Next(h Handle) Handle {
	if d := p.desc(h); d != nil {
		return d.next
	}
	return Null
}

// SetNext sets the frame after h in its owner's list.
func (p *Pool) SetNext(h, next Handle) error {
	d := p.desc(h)
	if d == nil {
		return ErrStale
	}
	d.next = next
	return nil
}

// FrameSize is the size of one frame buffer.
func (p *Pool) FrameSize() int { return int(p.frameSize) }

// Headroom is where Buf starts in a frame buffer.
func (p *Pool) Headroom() int { return int(p.headroom) }

// Count is the number of frames in the pool.
func (p *Pool) Count() int { return int(p.count) }

// Available is the number of free frames.
func (p *Pool) Available() int { return int(min(p.hdr.freeTop, p.count)) }

// PoolStats counts a pool's frames by owner and its refusals.
type PoolStats struct {
	Count, Free, App, Kernel int
	Stale                    uint64 // handles refused
	Empty                    uint64 // allocations refused
}

// Stats walks the descriptors; it is for diagnostics, not the fast path.
func (p *Pool) Stats() PoolStats {
	s := PoolStats{Count: int(p.count), Stale: uint64(p.hdr.stale), Empty: uint64(p.hdr.empty)}
	for i := range p.descs {
		switch p.descs[i].state {
		case stateFree:
			s.Free++
		case stateApp:
			s.App++
		case stateKernel:
			s.Kernel++
		}
	}
	return s
}

// The transitions below are for NIC implementations.

// giveKernel passes an owned frame to a ring for sending and returns its
// address (offset in the frame memory) and length. The caller's handle
// goes stale.
func (p *Pool) giveKernel(h Handle) (addr uint64, n uint32, ok bool) {
	d := p.desc(h)
	if d == nil || d.flags&flagBusy != 0 || uint32(d.off)+uint32(d.len) > p.frameSize {
		return 0, 0, false
	}
	d.gen = nextGen(d.gen)
	d.state = stateKernel
	return uint64(h.Index())*uint64(p.frameSize) + uint64(d.off), uint32(d.len), true
}

// lendKernel passes a frame to a ring for sending while the caller keeps
// it (TransmitKeep): the handle stays valid, the frame is busy until
// kernelDone.
func (p *Pool) lendKernel(h Handle) (addr uint64, n uint32, ok bool) {
	d := p.desc(h)
	if d == nil || d.flags&flagBusy != 0 || uint32(d.off)+uint32(d.len) > p.frameSize {
		return 0, 0, false
	}
	d.flags |= flagBusy
	return uint64(h.Index())*uint64(p.frameSize) + uint64(d.off), uint32(d.len), true
}

// fillKernel takes a free frame for the fill ring and returns the address
// of its chunk.
func (p *Pool) fillKernel() (uint64, bool) {
	idx, ok := p.popFree()
	if !ok {
		return 0, false
	}
	p.descs[idx].state = stateKernel
	return uint64(idx) * uint64(p.frameSize), true
}

// fromKernel takes a received frame back from a ring: addr is where the
// data starts, n its length. The address is checked against the pool's
// bounds and the frame must be one we gave the kernel.
func (p *Pool) fromKernel(addr uint64, n uint32) (Handle, bool) {
	idx, off := p.split(addr)
	if idx >= uint64(p.count) || off+uint64(n) > uint64(p.frameSize) {
		return Null, false
	}
	d := &p.descs[idx]
	if d.state != stateKernel {
		return Null, false
	}
	d.state, d.flags = stateApp, 0
	d.off, d.len, d.next, d.aux = uint16(off), uint16(n), Null, [AuxWords]uint32{}
	return makeHandle(uint32(idx), uint32(d.gen)), true
}

// kernelDone returns a sent frame (its address as given by giveKernel) to
// the free stack.
// A frame that was lent (TransmitKeep) and is still owned just stops
// being busy.
func (p *Pool) kernelDone(addr uint64) bool {
	idx, _ := p.split(addr)
	if idx >= uint64(p.count) {
		return false
	}
	d := &p.descs[idx]
	switch {
	case d.state == stateKernel:
		p.pushFree(uint32(idx))
		return true
	case d.state == stateApp && d.flags&flagBusy != 0:
		d.flags &^= flagBusy
		return true
	}
	return false
}

// Frame is a checked view of a frame the caller holds: the handle is
// validated once, when the view is made, and the accessors then go
// straight to the frame. A view is for one stretch of code; it must not be
// used after the frame is freed or transmitted.
type Frame struct {
	p *Pool
	d *frameDesc
	h Handle
}

// Frame returns a view of h, or ok false if the caller does not hold h.
func (p *Pool) Frame(h Handle) (f Frame, ok bool) {
	d := p.desc(h)
	if d == nil || uint32(d.off)+uint32(d.len) > p.frameSize {
		return Frame{}, false
	}
	return Frame{p, d, h}, true
}

// Handle is the frame's handle.
func (f Frame) Handle() Handle { return f.h }

// Aux reads owner word i.
func (f Frame) Aux(i int) uint32 { return f.d.aux[i] }

// SetAux writes owner word i.
func (f Frame) SetAux(i int, v uint32) { f.d.aux[i] = v }

// Next is the frame after this one in its owner's list.
func (f Frame) Next() Handle { return f.d.next }

// SetNext links a frame after this one.
func (f Frame) SetNext(h Handle) { f.d.next = h }

// Busy reports whether the NIC still holds the frame (TransmitKeep).
func (f Frame) Busy() bool { return f.d.flags&flagBusy != 0 }

// Buf is the frame buffer from the headroom to its end.
func (f Frame) Buf() []byte { return f.p.chunk(f.h.Index())[f.p.headroom:] }

// Data is the frame's bytes.
func (f Frame) Data() []byte {
	d := f.d
	return f.p.chunk(f.h.Index())[d.off : uint32(d.off)+uint32(d.len)]
}

// Len is the length of the frame's data.
func (f Frame) Len() int { return int(f.d.len) }

// SetData sets the frame's data to n bytes starting off bytes into the
// frame buffer; like Pool.SetData.
func (f Frame) SetData(off, n int) error {
	if f.d.flags&flagBusy != 0 {
		return ErrBusy
	}
	if off < 0 || n < 0 || off+n > int(f.p.frameSize) {
		return ErrTooLong
	}
	f.d.off, f.d.len = uint16(off), uint16(n)
	return nil
}

// toKernel passes the frame to a transmit ring: lent (keep: the view
// stays valid and the frame busy) or given (the handle goes stale). It
// returns the frame's address and length for the descriptor.
func (f Frame) toKernel(keep bool) (addr uint64, n uint32) {
	d := f.d
	if keep {
		d.flags |= flagBusy
	} else {
		d.gen = nextGen(d.gen)
		d.state = stateKernel
	}
	return uint64(f.h.Index())*uint64(f.p.frameSize) + uint64(d.off), uint32(d.len)
}
