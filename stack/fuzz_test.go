package stack_test

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// fuzzEnv is a stack (a) with a live TCP connection and a UDP socket,
// whose peer (b, also our stack) stays in step; frames from the fuzzer
// are injected on a's wire as if they came from b.
type fuzzEnv struct {
	ma, mb *vnic.Mem
	a, b   *stack.Stack
	c, s   stack.SockID // a's end, b's end
	lport  uint16
	u      stack.SockID
	free   int // a's frames free with the connection new
}

var env *fuzzEnv

func newFuzzEnv(t testing.TB) *fuzzEnv {
	ma, mb, err := vnic.NewMemPair(vnic.MemConfig{FrameCount: 1024})
	if err != nil {
		t.Fatal(err)
	}
	a, err := stack.New(ma, stack.Config{Addr: addrA, MAC: ma.Info().MAC, Sockets: 64}, stack.Options{
		Neighbours: map[netip.Addr]net.HardwareAddr{addrB.Addr(): mb.Info().MAC}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := stack.New(mb, stack.Config{Addr: addrB, MAC: mb.Info().MAC, Sockets: 64}, stack.Options{
		Neighbours: map[netip.Addr]net.HardwareAddr{addrA.Addr(): ma.Info().MAC}})
	if err != nil {
		t.Fatal(err)
	}
	e := &fuzzEnv{ma: ma, mb: mb, a: a, b: b}
	e.u, _ = a.Open(stack.UDP)
	a.Bind(e.u, netip.MustParseAddrPort("0.0.0.0:5000"))
	e.connect(t)
	e.free = ma.Pool().Available()
	return e
}

// connect (re)makes the TCP connection: b listens on 80, a connects.
func (e *fuzzEnv) connect(t testing.TB) {
	l, _ := e.b.Open(stack.TCP)
	e.b.Bind(l, netip.MustParseAddrPort("0.0.0.0:80"))
	e.b.Listen(l, 4)
	e.c, _ = e.a.Open(stack.TCP)
	e.a.Connect(e.c, netip.AddrPortFrom(addrB.Addr(), 80))
	for i := 0; i < 1000; i++ {
		e.a.Poll()
		e.b.Poll()
		if s, err := e.b.Accept(l); err == nil {
			e.s = s
			break
		}
	}
	e.b.Close(l)
	la, _ := e.a.LocalAddr(e.c)
	e.lport = la.Port()
}

// inject puts a frame on a's wire, from b's side.
func (e *fuzzEnv) inject(frame []byte) {
	p := e.mb.Pool()
	h := p.Alloc()
	if h == vnic.Null {
		return
	}
	n := copy(p.Buf(h), frame)
	p.SetLen(h, n)
	if k, _ := e.mb.Transmit([]vnic.Handle{h}); k != 1 {
		p.Free(h)
	}
}

// fixChecksums makes the IPv4 and transport checksums of a frame right,
// where its lengths allow, so that the fuzzer reaches past them.
func fixChecksums(f []byte) {
	if len(f) < 34 || f[12] != 8 || f[13] != 0 {
		return
	}
	ip := f[14:]
	ihl := int(ip[0]&0xf) * 4
	total := int(binary.BigEndian.Uint16(ip[2:]))
	if ihl < 20 || ihl > len(ip) {
		return
	}
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], ^checksum.Checksum(ip[:ihl], 0))
	if total < ihl || total > len(ip) {
		return
	}
	l4 := ip[ihl:total]
	var off int
	switch ip[9] {
	case 6:
		off = 16
	case 17:
		off = 6
	default:
		return
	}
	if len(l4) < off+2 {
		return
	}
	l4[off], l4[off+1] = 0, 0
	var ph [12]byte
	copy(ph[0:8], ip[12:20])
	ph[9] = ip[9]
	binary.BigEndian.PutUint16(ph[10:], uint16(len(l4)))
	binary.BigEndian.PutUint16(l4[off:], ^checksum.Checksum(l4, checksum.Checksum(ph[:], 0)))
}

// relative rewrites a TCP frame's numbers as offsets into the live
// connection: seq from what a expects next, ack and every SACK block edge
// from what a has unacknowledged, so that the fuzzer's options, SACK
// blocks and timestamps reach the scoreboard, RACK and PAWS rather than
// the window check.
func (e *fuzzEnv) relative(f []byte) {
	info, err := e.a.TCPInfo(e.c)
	if err != nil || len(f) < 34 || f[12] != 8 || f[13] != 0 || f[23] != 6 {
		return
	}
	ihl := int(f[14]&0xf) * 4
	if ihl < 20 || 14+ihl+20 > len(f) {
		return
	}
	t := f[14+ihl:]
	add := func(b []byte, v uint32) { binary.BigEndian.PutUint32(b, binary.BigEndian.Uint32(b)+v) }
	add(t[4:], info.RcvNxt)
	add(t[8:], info.SndUna)
	doff := int(t[12]>>4) * 4
	if doff < 20 || doff > len(t) {
		return
	}
	for o := t[20:doff]; len(o) >= 2; {
		if o[0] == 0 || o[0] == 1 {
			o = o[1:]
			continue
		}
		l := int(o[1])
		if l < 2 || l > len(o) {
			return
		}
		if o[0] == 5 {
			for i := 2; i+4 <= l; i += 4 {
				add(o[i:], info.SndUna)
			}
		}
		o = o[l:]
	}
}

// FuzzInput feeds arbitrary frames to a stack with live connections, with
// data in flight. The first byte's bit 0 chooses whether the checksums are
// fixed first, bit 1 whether TCP numbers are taken as offsets into the
// live connection (relative). Nothing may panic, the connection either
// keeps working or ends cleanly, and no frame may leak.
func FuzzInput(f *testing.F) {
	e := newFuzzEnv(f)
	src := pkt.Endpoint{MAC: e.mb.Info().MAC, Addr: netip.AddrPortFrom(addrB.Addr(), 80)}
	dst := pkt.Endpoint{MAC: e.ma.Info().MAC, Addr: netip.AddrPortFrom(addrA.Addr(), e.lport)}
	seed := func(flags uint8, opts []byte, payload string) {
		b := make([]byte, 2048)
		n, err := pkt.TCP(b, src, dst, pkt.TCPSegment{Seq: 1000, Ack: 2000, Flags: header.TCPFlags(flags), Window: 1000, Options: opts, Payload: []byte(payload)})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append([]byte{1}, b[:n]...))
	}
	ts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 1}
	sack := []byte{1, 1, 5, 10, 0, 0, 3, 232, 0, 0, 7, 208}
	seed(0x18, nil, "data")
	seed(0x10, ts, "")
	seed(0x10, sack, "")
	seed(0x11, ts, "")
	seed(0x04, nil, "")
	seed(0x02, []byte{2, 4, 5, 180, 3, 3, 7, 1, 4, 2, 0, 0}, "")
	seed(0x12, []byte{2, 4, 5, 180, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7}, "")
	seed(0x18, []byte{8, 10, 0, 0, 0, 1, 0, 0, 0, 1, 5, 18, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 1, 1, 0, 0}, "x")
	u := make([]byte, 100)
	n, _ := pkt.UDP(u, pkt.Endpoint{MAC: src.MAC, Addr: netip.AddrPortFrom(addrB.Addr(), 9)},
		pkt.Endpoint{MAC: dst.MAC, Addr: netip.AddrPortFrom(addrA.Addr(), 5000)}, []byte("datagram"))
	f.Add(append([]byte{1}, u[:n]...))
	f.Add([]byte{0, 1, 2, 3})
	// Relative seeds: within the live connection's windows, with data in
	// flight. Timestamps far ahead pass PAWS.
	rel := func(flags uint8, opts []byte, payload string) {
		b := make([]byte, 2048)
		n, err := pkt.TCP(b, src, dst, pkt.TCPSegment{Seq: 0, Ack: 0, Flags: header.TCPFlags(flags), Window: 1000, Options: opts, Payload: []byte(payload)})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append([]byte{3}, b[:n]...))
	}
	tsFar := []byte{1, 1, 8, 10, 0x40, 0, 0, 0, 0, 0, 0, 1}
	sackRel := func(blocks ...uint32) []byte {
		o := []byte{1, 1, 5, byte(2 + 8*len(blocks)/2)}
		for _, v := range blocks {
			o = binary.BigEndian.AppendUint32(o, v)
		}
		return o
	}
	rel(0x10, nil, "")                                     // a duplicate ACK
	rel(0x10, sackRel(1000, 2000), "")                     // a hole at the head
	rel(0x10, sackRel(0, 100, 1000, 2000, 3000, 4000), "") // a D-SACK first, then two blocks
	rel(0x10, sackRel(5000, 1000), "")                     // a reversed block
	rel(0x10, append(tsFar, sackRel(100, 200, 300, 400)...), "")
	rel(0x18, tsFar, "in order")
	rel(0x18, tsFar[:], "ahead")
	rel(0x14, nil, "")                  // an in-window RST (challenge ACK)
	rel(0x12, nil, "")                  // a SYN on the connection (challenge ACK)
	rel(0x10, []byte{1, 1, 5, 255}, "") // a SACK option longer than the header

	f.Fuzz(func(t *testing.T, in []byte) { e.input(t, in) })
}

// input is one of FuzzInput's inputs, on e.
func (e *fuzzEnv) input(t *testing.T, in []byte) {
	if len(in) < 1 || len(in) > 1600 {
		return
	}
	// A hang is a failure too: show where.
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			panic("input hung:\n" + string(buf[:n]))
		}
	}()
	frame := append([]byte(nil), in[1:]...)
	// Data in flight, so that ACKs and SACK blocks have something to
	// act on.
	e.a.Send(e.c, make([]byte, 8192))
	e.a.Poll()
	if in[0]&2 != 0 {
		e.relative(frame)
	}
	if in[0]&1 != 0 {
		fixChecksums(frame)
	}
	e.inject(frame)
	for range 3 {
		e.a.Poll()
		e.b.Poll()
	}
	// Drain the UDP socket and the connection.
	buf := make([]byte, 4096)
	for range 64 {
		if _, _, err := e.a.RecvFrom(e.u, buf, false); err != nil {
			break
		}
	}
	e.a.Recv(e.c, buf, false)
	// The connection still works, or it ended and is made again.
	if _, err := e.a.Send(e.c, []byte("still alive?")); err != nil && !errors.Is(err, stack.ErrWouldBlock) {
		e.reconnect(t)
	}
	// Few frames free is no leak by itself: the send queues may hold
	// half the pool (b never reads) and a's receive queues their buffer's
	// worth at least a KiB a frame (tiny segments out of order). It is one
	// if they do not come back when the connection is gone.
	// A reset ends it at once, whatever the fuzzer made of its numbers
	// (a FIN behind unsent data would wait for a peer that is gone).
	if p := e.ma.Pool(); p.Available() < p.Count()/4 {
		before := e.a.Dump()
		e.a.SetOption(e.c, stack.Linger, 0)
		e.reconnect(t)
		if p.Available() < e.free-16 {
			t.Fatalf("frames leaking: %d of %d free after the connection was reset and made again, %d at the start (%s)\nbefore the reset: %s\nafter: %s",
				p.Available(), p.Count(), e.free, ptr(e.a.Counters()), before, e.a.Dump())
		}
	}
}

// reconnect ends the TCP connection at both ends, lets the stacks settle
// and makes it again.
func (e *fuzzEnv) reconnect(t testing.TB) {
	e.a.Close(e.c)
	e.b.Close(e.s)
	for range 50 {
		e.a.Poll()
		e.b.Poll()
	}
	e.connect(t)
}
