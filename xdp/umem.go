package xdp

import (
	"errors"
	"fmt"
	"math/bits"

	"golang.org/x/sys/unix"
)

// UmemConfig sizes a UMEM.
type UmemConfig struct {
	// FrameSize is the size of one chunk: a power of two from 2048 to the
	// page size (default 2048, room for a 1500-byte MTU frame after the
	// kernel's 256-byte XDP headroom).
	FrameSize int
	// FrameCount is the number of chunks (default 4096).
	FrameCount int
	// Headroom is extra space the kernel leaves before each received frame,
	// on top of its own XDP_PACKET_HEADROOM (default 0).
	Headroom int
	// MetaSize is the size of a region mapped after the frames in the same
	// memfd but not registered with the kernel: frame descriptors and other
	// state a second process must see (default 0).
	MetaSize int
}

func (c *UmemConfig) setDefaults() error {
	if c.FrameSize == 0 {
		c.FrameSize = 2048
	}
	if c.FrameCount == 0 {
		c.FrameCount = 4096
	}
	if c.FrameSize < 2048 || c.FrameSize > unix.Getpagesize() || bits.OnesCount(uint(c.FrameSize)) != 1 {
		return fmt.Errorf("umem frame size %d: must be a power of two from 2048 to the page size, %d", c.FrameSize, unix.Getpagesize())
	}
	if c.FrameCount < 1 || c.FrameCount > 1<<20 {
		return fmt.Errorf("umem frame count %d: must be from 1 to %d", c.FrameCount, 1<<20)
	}
	if c.Headroom < 0 || c.Headroom > c.FrameSize-unix.XDP_PACKET_HEADROOM-128 {
		return fmt.Errorf("umem headroom %d: must be from 0 to %d for %d-byte frames",
			c.Headroom, c.FrameSize-unix.XDP_PACKET_HEADROOM-128, c.FrameSize)
	}
	if c.MetaSize < 0 {
		return fmt.Errorf("umem metadata size %d: must not be negative", c.MetaSize)
	}
	return nil
}

// FramesLen is the size in bytes of the registered frame area.
func (c UmemConfig) FramesLen() int { return c.FrameSize * c.FrameCount }

// metaOffset is where the metadata region starts: the first page after the
// frames.
func (c UmemConfig) metaOffset() int { return pageAlign(c.FramesLen()) }

// MapLen is the size of the whole memfd.
func (c UmemConfig) MapLen() int { return c.metaOffset() + pageAlign(c.MetaSize) }

func pageAlign(n int) int {
	p := unix.Getpagesize()
	return (n + p - 1) &^ (p - 1)
}

// Umem is the packet memory shared by the kernel and every AF_XDP socket
// bound with it. It lives in a memfd mapped MAP_SHARED, so another process
// given the fd (onloadd taking a stalled stack over) maps the same frames.
//
// A UMEM is registered with the kernel on the first Socket opened with it;
// the kernel allows one UMEM per (device, queue), so every socket on the same
// device and queue must use the same UMEM, and a (device, queue) that another
// UMEM holds is refused with ErrQueueBusy.
type Umem struct {
	cfg    UmemConfig
	fd     int
	mem    []byte
	socks  []int // open sockets on this UMEM; the kernel's UMEM lives while any does
	closed bool
}

// NewUmem creates a memfd of the configured size and maps it.
func NewUmem(cfg UmemConfig) (*Umem, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate("onload-umem", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("create umem memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(cfg.MapLen())); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("size umem memfd to %d bytes: %w", cfg.MapLen(), err)
	}
	u, err := mapUmem(fd, cfg)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return u, nil
}

// OpenUmem maps an existing UMEM memfd, received from the process that
// created it. cfg must be the creator's configuration; the fd is owned by
// the returned Umem afterwards.
func OpenUmem(fd int, cfg UmemConfig) (*Umem, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat umem fd %d: %w", fd, err)
	}
	if st.Size < int64(cfg.MapLen()) {
		return nil, fmt.Errorf("umem fd %d holds %d bytes, configuration needs %d", fd, st.Size, cfg.MapLen())
	}
	return mapUmem(fd, cfg)
}

func mapUmem(fd int, cfg UmemConfig) (*Umem, error) {
	mem, err := unix.Mmap(fd, 0, cfg.MapLen(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map %d bytes of umem: %w", cfg.MapLen(), err)
	}
	return &Umem{cfg: cfg, fd: fd, mem: mem}, nil
}

// Config returns the configuration with defaults filled in.
func (u *Umem) Config() UmemConfig { return u.cfg }

// FD is the memfd; pass it to another process to share the frames.
func (u *Umem) FD() int { return u.fd }

// Frames is the registered frame area: FrameCount chunks of FrameSize bytes.
func (u *Umem) Frames() []byte { return u.mem[:u.cfg.FramesLen():u.cfg.FramesLen()] }

// Meta is the unregistered region after the frames (MetaSize bytes).
func (u *Umem) Meta() []byte {
	off := u.cfg.metaOffset()
	return u.mem[off : off+u.cfg.MetaSize : off+u.cfg.MetaSize]
}

// Close unmaps the memory and closes the memfd. It fails while sockets
// still use the UMEM: close them first.
func (u *Umem) Close() error {
	if u.closed {
		return nil
	}
	if len(u.socks) > 0 {
		return fmt.Errorf("close umem: %d sockets still use it; close them first", len(u.socks))
	}
	u.closed = true
	return errors.Join(unix.Munmap(u.mem), unix.Close(u.fd))
}
