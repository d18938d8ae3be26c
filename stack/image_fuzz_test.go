package stack

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/vnic"
)

// FuzzCorruptImage writes the fuzzer's bytes into a live stack's image and
// its frame pool's metadata, the memory an unprivileged process shares
// with onloadd and may scribble on at any moment, between polls of a
// connection that carries data both ways through loss and reordering
// (so that receive, out-of-order and send queues, SACK scoreboards and
// timers all hold something). The stack must not panic, must not hang
// (every call returns within the watchdog's time), and counts what it
// found wrong (ImageCorrupt, logged). The stack lock's word is left
// alone: a writer that holds the lock stalls the stack by design, and
// that is onloadd's to handle (the lock names its holder).
//
// Each input is a list of 9-byte writes: a target (even: the image, odd:
// the pool's metadata), a 32-bit offset (modulo the target's size) and a
// 32-bit value.
func FuzzCorruptImage(f *testing.F) {
	// Seeds: a socket's queue heads pointed at themselves, a frame's link
	// pointed back at itself, the wheel's header, counters.
	off := func(p unsafe.Pointer, base []byte) uint32 {
		return uint32(uintptr(p) - uintptr(unsafe.Pointer(&base[0])))
	}
	e := newCorruptEnv(f)
	img := e.a.img
	sk := &img.socks[e.c.index()]
	seed := func(ws ...[3]uint32) []byte {
		var b []byte
		for _, w := range ws {
			b = append(b, byte(w[0]))
			b = binary.LittleEndian.AppendUint32(b, w[1])
			b = binary.LittleEndian.AppendUint32(b, w[2])
		}
		return b
	}
	f.Add(seed([3]uint32{0, off(unsafe.Pointer(&sk.rcvFrames), img.mem), 0xffffffff}))
	f.Add(seed([3]uint32{0, off(unsafe.Pointer(&sk.sndWnd), img.mem), 0xffffffff}, [3]uint32{0, off(unsafe.Pointer(&sk.cwnd), img.mem), 0xffffffff}))
	f.Add(seed([3]uint32{0, uint32(img.hdr.offTimers), 0}, [3]uint32{0, uint32(img.hdr.offTimers) + 16, 0xffffffff}))
	f.Add(seed([3]uint32{1, 64, 0x41414141}, [3]uint32{1, 96, 0}, [3]uint32{1, 128, 0xffffffff}))
	f.Add(seed([3]uint32{0, off(unsafe.Pointer(&img.hdr.sockInUse), img.mem), 0}, [3]uint32{0, off(unsafe.Pointer(&img.hdr.sockFree), img.mem), 3}))
	e.close()

	f.Fuzz(func(t *testing.T, data []byte) {
		defer watchdog(10 * time.Second)()
		e := newCorruptEnv(t)
		defer e.close()
		imgMem, meta := e.imageBytes(t), e.ma.PoolMeta()
		lockOff := uint32(unsafe.Offsetof(header{}.lock))
		for ; len(data) >= 9; data = data[9:] {
			target, o, v := data[0], binary.LittleEndian.Uint32(data[1:]), binary.LittleEndian.Uint32(data[5:])
			mem := imgMem
			if target&1 == 1 {
				mem = meta
			}
			o = o % uint32(len(mem)) &^ 3
			if target&1 == 0 && o >= lockOff && o < lockOff+4 {
				continue
			}
			binary.LittleEndian.PutUint32(mem[o:], v)
		}
		e.exercise(t)
		t.Logf("ImageCorrupt %d", e.a.Counters().ImageCorrupt)
	})
}

// corruptEnv is two stacks over an in-memory wire that loses and
// reorders, with a connection between them carrying data both ways and a
// UDP socket with datagrams queued.
type corruptEnv struct {
	ma, mb *vnic.Mem
	a, b   *Stack
	c, s   SockID // a's end, b's end
	u      SockID
	imgMap []byte
}

func newCorruptEnv(t testing.TB) *corruptEnv {
	ma, mb, err := vnic.NewMemPair(vnic.MemConfig{FrameCount: 512, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	addrA, addrB := netip.MustParsePrefix("198.18.0.1/24"), netip.MustParsePrefix("198.18.0.2/24")
	cfg := func(p netip.Prefix, m *vnic.Mem) Config {
		return Config{Addr: p, MAC: m.Info().MAC, Sockets: 16, MinRTO: 5 * time.Millisecond, RecvBuffer: 64 << 10, SendBuffer: 64 << 10}
	}
	a, err := New(ma, cfg(addrA, ma), Options{Neighbours: map[netip.Addr]net.HardwareAddr{addrB.Addr(): mb.Info().MAC}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(mb, cfg(addrB, mb), Options{Neighbours: map[netip.Addr]net.HardwareAddr{addrA.Addr(): ma.Info().MAC}})
	if err != nil {
		t.Fatal(err)
	}
	e := &corruptEnv{ma: ma, mb: mb, a: a, b: b}
	l, _ := b.Open(TCP)
	b.Bind(l, netip.MustParseAddrPort("0.0.0.0:80"))
	b.Listen(l, 4)
	e.c, _ = a.Open(TCP)
	if err := a.Connect(e.c, netip.AddrPortFrom(addrB.Addr(), 80)); !errors.Is(err, ErrInProgress) {
		t.Fatal(err)
	}
	for i := 0; i < 1000 && e.s == 0; i++ {
		a.Poll()
		b.Poll()
		if s, err := b.Accept(l); err == nil {
			e.s = s
		}
	}
	if e.s == 0 {
		t.Fatal("no connection")
	}
	b.Close(l)
	e.u, _ = a.Open(UDP)
	a.Bind(e.u, netip.MustParseAddrPort("0.0.0.0:5000"))
	// Loss and reordering from here on, so that the queues fill.
	imp := vnic.Impairment{Loss: 0.05, Reorder: 0.1, ReorderDelay: 200 * time.Microsecond}
	ma.Impair(imp)
	mb.Impair(imp)
	buf := make([]byte, 16<<10)
	for range 50 {
		a.Send(e.c, buf)
		b.Send(e.s, buf[:4<<10])
		a.Poll()
		b.Poll()
		b.Recv(e.s, buf, false)
	}
	u, _ := b.Open(UDP)
	for range 8 {
		b.SendTo(u, buf[:100], netip.AddrPortFrom(addrA.Addr(), 5000))
	}
	b.Close(u)
	a.Poll()
	return e
}

// imageBytes maps a's image from its memfd, as another process would.
func (e *corruptEnv) imageBytes(t testing.TB) []byte {
	m, err := unix.Mmap(e.a.img.FD(), 0, e.a.img.Size(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	e.imgMap = m
	return m
}

// exercise drives a through every kind of call for a while.
func (e *corruptEnv) exercise(t *testing.T) {
	buf := make([]byte, 8<<10)
	for i := range 200 {
		e.a.Poll()
		e.b.Poll()
		e.a.Send(e.c, buf[:1+i*37%len(buf)])
		e.a.Recv(e.c, buf, i%3 == 0)
		e.b.Recv(e.s, buf, false)
		e.b.Send(e.s, buf[:1+i*53%len(buf)])
		e.a.RecvFrom(e.u, buf, false)
		e.a.Events(e.c)
		e.a.TCPInfo(e.c)
		e.a.NextTimeout()
		e.a.Idle()
		if i%50 == 0 {
			e.a.Dump()
			id, _ := e.a.Open(TCP)
			e.a.Close(id)
		}
		if i == 150 {
			e.a.Close(e.c)
		}
		if i%20 == 19 {
			time.Sleep(time.Millisecond) // for the wire's held frames and the timers
		}
	}
}

// watchdog panics, with every goroutine's stack, if the returned stop
// is not called within d: a call that never returns is a hang.
func watchdog(d time.Duration) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(d):
			buf := make([]byte, 1<<20)
			panic("corrupt image: not done after " + d.String() + ": a hang\n" + string(buf[:runtime.Stack(buf, true)]))
		}
	}()
	return func() { close(done) }
}

func (e *corruptEnv) close() {
	if e.imgMap != nil {
		unix.Munmap(e.imgMap)
	}
	e.a.Destroy()
	e.b.Destroy()
	e.ma.Close()
	e.mb.Close()
}

// TestCorruptCyclesCounted makes the frame lists a walk follows into
// cycles, through the pool's links as a hostile writer of the metadata
// could, and checks that every walk ends and counts the damage.
func TestCorruptCyclesCounted(t *testing.T) {
	defer watchdog(20 * time.Second)()
	for _, list := range []string{"send", "receive", "out of order"} {
		t.Run(list, func(t *testing.T) {
			e := newCorruptEnv(t)
			defer e.close()
			a, p := e.a, e.a.pool
			// Sent and unacknowledged data (b does not poll), and data
			// queued for a's reader, some of it out of order.
			buf := make([]byte, 32<<10)
			sk := &a.img.socks[e.c.index()]
			var head vnic.Handle
			switch list {
			case "send":
				// All of it sent (the walks of the sent frames then reach
				// the tail), none of it acknowledged: b does not poll.
				e.ma.Impair(vnic.Impairment{})
				e.mb.Impair(vnic.Impairment{})
				for i := 0; i < 5000 && sk.sndHead != vnic.Null; i++ {
					a.Poll()
					e.b.Poll()
					e.b.Recv(e.s, buf, false)
					time.Sleep(10 * time.Microsecond)
				}
				a.SetOption(e.c, NoDelay, 1)
				a.Send(e.c, buf[:8<<10])
				if sk.sndUnsent != vnic.Null {
					t.Skip("the send queue was not all sent (the window)")
				}
				head = sk.sndHead
			case "receive":
				for i := 0; i < 100 && sk.rcvHead == vnic.Null; i++ {
					e.b.Send(e.s, buf[:4<<10])
					e.b.Poll()
					a.Poll()
					time.Sleep(100 * time.Microsecond)
				}
				head = sk.rcvHead
			case "out of order":
				for i := 0; i < 2000 && sk.oooHead == vnic.Null; i++ {
					e.b.Send(e.s, buf[:4<<10])
					e.b.Poll()
					a.Poll()
					a.Recv(e.c, buf, false)
				}
				head = sk.oooHead
			}
			if head == vnic.Null {
				t.Skipf("no %s queue to corrupt formed (the wire's losses are seeded; the setup changed?)", list)
			}
			// Find the last frame and link it back to the first.
			last := head
			for n := 0; p.Next(last) != vnic.Null && n < p.Count(); n++ {
				last = p.Next(last)
			}
			if err := p.SetNext(last, head); err != nil {
				t.Fatal(err)
			}
			before := a.Counters().ImageCorrupt
			if list == "out of order" {
				// The SACK walk, at once: a's polls below may change the
				// queue (a segment ahead of head, a merge) before a
				// segment a sends describes it, and a's send window
				// (filled by the setup, its persist timer backed off)
				// may keep it from sending at all.
				var blocks [4]sackBlock
				a.lock()
				a.sackBlocksLocked(sk, blocks[:])
				a.unlock()
			}
			big := make([]byte, 4<<20) // more than the queue holds
			for range 20 {
				a.Recv(e.c, big, true) // peek: walks without freeing
				a.Poll()
				a.TCPInfo(e.c)
				a.Dump()
				time.Sleep(time.Millisecond)
			}
			// a walks the out-of-order queue when it describes it in the
			// SACK option of a segment it sends, and when b's
			// retransmissions fill the holes and a merges it: a sends a
			// little data each round, so that the walk does not wait for
			// b's retransmission timer (backed off by the losses, under
			// the race detector beside other packages' tests, past any
			// wait).
			e.mb.Impair(vnic.Impairment{})
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && a.Counters().ImageCorrupt == before; {
				if list == "out of order" {
					a.Send(e.c, buf[:64])
				}
				e.b.Poll()
				a.Poll()
				time.Sleep(time.Millisecond)
			}
			if after := a.Counters().ImageCorrupt; after == before {
				t.Errorf("a cycle in the %s queue was walked and not counted (ImageCorrupt %d)\n%s", list, after, a.DumpSocket(e.c))
			} else {
				t.Logf("%s queue cycle: ImageCorrupt %d -> %d", list, before, after)
			}
		})
	}
}

// TestTryCheckCountsBadSlots: TryCheck finds a socket slot of no known
// kind and a link out of range, and counts them; a sound table has none.
func TestTryCheckCountsBadSlots(t *testing.T) {
	e := newCorruptEnv(t)
	defer e.close()
	a := e.a
	if bad, ok := a.TryCheck(); !ok || bad != 0 {
		t.Fatalf("a sound table: TryCheck = %d, %v; want 0, true", bad, ok)
	}
	before := a.CorruptSeen()
	last := len(a.img.socks) - 1
	a.img.socks[last].kind = 77
	a.img.socks[last-1].next = uint32(len(a.img.socks)) + 5
	if bad, ok := a.TryCheck(); !ok || bad != 2 {
		t.Fatalf("a slot of kind 77 and a link past the table: TryCheck = %d, %v; want 2, true", bad, ok)
	}
	if got := a.CorruptSeen() - before; got != 2 {
		t.Fatalf("CorruptSeen grew by %d, want 2", got)
	}
}
