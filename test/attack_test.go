package test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/stack"
)

// rawPeer is a TCP peer made of raw frames on the middle host M: it sends
// through an AF_PACKET socket on M's interface towards B, and sees B's
// answers through the path's tap (they are addressed to M's MAC, so they
// go no further than A's interface, which drops them).
type rawPeer struct {
	t        *testing.T
	fd       int
	ifindex  int
	src, dst pkt.Endpoint
	in       chan pkt.Frame
}

func newRawPeer(t *testing.T, p *Path, src netip.AddrPort, dst netip.AddrPort) *rawPeer {
	t.Helper()
	mb := p.M.Ifaces[1]
	r := &rawPeer{t: t, ifindex: mb.Index, in: make(chan pkt.Frame, 4096),
		src: pkt.Endpoint{MAC: mb.MAC, Addr: src}, dst: pkt.Endpoint{MAC: p.IfB.MAC, Addr: dst}}
	err := p.M.Do(func() (err error) {
		// Protocol 0: the socket only sends.
		r.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		t.Fatalf("AF_PACKET socket in M: %v", err)
	}
	t.Cleanup(func() { p.Tap(nil); unix.Close(r.fd) })
	p.Tap(func(side int, frame []byte) {
		if side != 1 {
			return
		}
		f, err := pkt.Parse(frame)
		if err != nil || f.Dst != src {
			return
		}
		f.Payload = append([]byte(nil), f.Payload...)
		select {
		case r.in <- f:
		default:
		}
	})
	return r
}

func (r *rawPeer) send(seg pkt.TCPSegment) {
	r.sendFrom(r.src, seg)
}

// sendFrom sends a segment with another source (a spoofed one).
func (r *rawPeer) sendFrom(src pkt.Endpoint, seg pkt.TCPSegment) {
	var b [2048]byte
	n, err := pkt.TCP(b[:], src, r.dst, seg)
	if err != nil {
		r.t.Error(err)
		return
	}
	sa := &unix.SockaddrLinklayer{Ifindex: r.ifindex, Halen: 6}
	copy(sa.Addr[:], r.dst.MAC)
	for range 100 {
		err = unix.Sendto(r.fd, b[:n], 0, sa)
		if err != unix.ENOBUFS && err != unix.EAGAIN {
			break
		}
		time.Sleep(100 * time.Microsecond) // the device queue is full
	}
	if err != nil {
		r.t.Errorf("AF_PACKET send: %v", err) // Error: senders run in goroutines too
	}
}

// next waits for B's next segment to the peer that matches want.
func (r *rawPeer) next(timeout time.Duration, want func(pkt.Frame) bool) (pkt.Frame, bool) {
	deadline := time.After(timeout)
	for {
		select {
		case f := <-r.in:
			if want == nil || want(f) {
				return f, true
			}
		case <-deadline:
			return pkt.Frame{}, false
		}
	}
}

// handshake connects the raw peer: it returns its next sequence number
// and B's.
func (r *rawPeer) handshake(wnd uint16) (snd, rcv uint32) {
	r.t.Helper()
	iss := rand.Uint32()
	r.send(pkt.TCPSegment{Seq: iss, Flags: header.TCPFlagSyn, Window: wnd, Options: []byte{2, 4, 5, 180}})
	f, ok := r.next(5*time.Second, func(f pkt.Frame) bool { return f.TCPFlags == header.TCPFlagSyn|header.TCPFlagAck })
	if !ok {
		r.t.Fatal("raw peer: no SYN-ACK")
	}
	r.send(pkt.TCPSegment{Seq: iss + 1, Ack: f.Seq + 1, Flags: header.TCPFlagAck, Window: wnd})
	return iss + 1, f.Seq + 1
}

// attackTarget is our stack in B with a listener whose connections are
// handed to serve, and a kernel client in A that moves data through it
// while the attack goes on.
type attackTarget struct {
	p  *Path
	s  *sockets.Stack
	ln net.Listener
}

func newAttackTarget(t *testing.T, serve func(net.Conn)) *attackTarget {
	p := FaultyPath(t, PathConfig{Seed: 9})
	s := ourSockets(t, p.B, sockets.Balanced)
	var ln net.Listener
	lc := sockets.ListenConfig{Stack: s}
	if err := p.B.Do(func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", p.IfB.Addr().String()+":7000")
		return
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return &attackTarget{p: p, s: s, ln: ln}
}

// kernelEchoRun dials the target from A's kernel and echoes n bytes
// through it, byte-exact.
func (a *attackTarget) kernelEchoRun(t *testing.T, n int, seed uint64) error {
	var c net.Conn
	if err := a.p.A.Do(func() (err error) { c, err = net.DialTimeout("tcp", a.ln.Addr().String(), 10*time.Second); return }); err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	data := random(n, seed)
	errc := make(chan error, 1)
	go func() { _, err := c.Write(data); errc <- err }()
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if err := <-errc; err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		return errorString("echo: the bytes differ")
	}
	return nil
}

func echoServe(c net.Conn) { io.Copy(c, c); c.Close() }

func attackSeconds(full, short time.Duration) time.Duration {
	if testing.Short() {
		return short
	}
	return full
}

// TestAttackBlindResetsAndSyns sends RSTs and SYNs spoofed from a live
// connection's peer, inside and outside the window, from M. No guess
// tears the connection down: in-window ones draw challenge ACKs, and the
// echo through it stays byte-exact.
func TestAttackBlindResetsAndSyns(t *testing.T) {
	RequireRoot(t)
	var mu sync.Mutex
	var conns []*sockets.TCPConn
	a := newAttackTarget(t, func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c.(*sockets.TCPConn))
		mu.Unlock()
		echoServe(c)
	})
	var kc net.Conn
	if err := a.p.A.Do(func() (err error) { kc, err = net.Dial("tcp", a.ln.Addr().String()); return }); err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	kc.Write([]byte("hello"))
	buf := make([]byte, 5)
	kc.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.ReadFull(kc, buf); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	ours := conns[0]
	mu.Unlock()
	info, err := ours.Info()
	if err != nil {
		t.Fatal(err)
	}
	kaddr := netip.MustParseAddrPort(kc.LocalAddr().String())
	r := newRawPeer(t, a.p, kaddr, netip.MustParseAddrPort(a.ln.Addr().String()))
	before := a.s.Engine().Counters()
	spoof := pkt.Endpoint{MAC: r.src.MAC, Addr: kaddr}
	const n = 200
	for i := range n {
		off := uint32(1 + i*97)
		r.sendFrom(spoof, pkt.TCPSegment{Seq: info.RcvNxt + off, Flags: header.TCPFlagRst})                             // in the window
		r.sendFrom(spoof, pkt.TCPSegment{Seq: info.RcvNxt + off, Flags: header.TCPFlagSyn, Window: 1000})               // in the window
		r.sendFrom(spoof, pkt.TCPSegment{Seq: info.RcvNxt + 1<<31 + off, Flags: header.TCPFlagRst})                     // far outside
		r.sendFrom(spoof, pkt.TCPSegment{Seq: info.RcvNxt - 1<<20 - off, Flags: header.TCPFlagRst | header.TCPFlagAck}) // behind
	}
	// Echo through the attacked connection.
	data := random(4<<20, 21)
	go kc.Write(data)
	got := make([]byte, len(data))
	if _, err := io.ReadFull(kc, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("echo through the attacked connection: %v", err)
	}
	after := a.s.Engine().Counters()
	t.Logf("challenge ACKs %d, limited %d, resets accepted %d, out of window %d",
		after.TCPChallengeAcks-before.TCPChallengeAcks, after.TCPChallengeAcksLimited-before.TCPChallengeAcksLimited,
		after.RxTCPResets-before.RxTCPResets, after.RxTCPOutOfWindow-before.RxTCPOutOfWindow)
	if after.RxTCPResets != before.RxTCPResets {
		t.Error("a blind RST was accepted")
	}
	if c := after.TCPChallengeAcks - before.TCPChallengeAcks; c < 2*n*9/10 {
		t.Errorf("%d challenge ACKs for %d in-window RSTs and SYNs", c, 2*n)
	}
	if after.RxTCPOutOfWindow-before.RxTCPOutOfWindow < 2*n*9/10 {
		t.Error("the out-of-window RSTs were not counted")
	}
}

// TestAttackSynFlood sends 100,000 SYNs from spoofed addresses at our
// listener while a real client (A's kernel) connects and is served: the
// SYN queue overflows into SYN cookies, and the client gets in, with the
// timestamps, SACK and window scaling it offered (the cookie's timestamp
// carries them).
func TestAttackSynFlood(t *testing.T) {
	RequireRoot(t)
	var mu sync.Mutex
	var infos []stack.TCPInfo
	a := newAttackTarget(t, func(c net.Conn) {
		if info, err := c.(*sockets.TCPConn).Info(); err == nil {
			mu.Lock()
			infos = append(infos, info)
			mu.Unlock()
		}
		echoServe(c)
	})
	r := newRawPeer(t, a.p, netip.MustParseAddrPort("198.18.0.200:1"), netip.MustParseAddrPort(a.ln.Addr().String()))
	// A's kernel knows B's MAC before the flood, as a client's router
	// would: on this one link A's ARP requests meet the flood's SYNs on
	// M's side, and three of them lost in a row fail the dial ("no route
	// to host") before a SYN is sent, which says nothing of our stack.
	if _, err := a.p.A.Run("ip", "neigh", "replace", a.p.IfB.Addr().String(), "lladdr", a.p.IfB.MAC.String(), "dev", a.p.IfA.Name, "nud", "permanent"); err != nil {
		t.Fatal(err)
	}
	total := 100_000
	if testing.Short() {
		total = 20_000
	}
	before := a.s.Engine().Counters()
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(1, 2))
		// At least total SYNs, and on until the real clients are done,
		// so that every one of them meets a full SYN queue.
		for i := 0; i < 10*total; i++ {
			if i >= total {
				select {
				case <-stop:
					return
				default:
				}
			}
			src := r.src
			src.Addr = netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(100 + rng.IntN(150))}), uint16(1024+rng.IntN(60000)))
			r.sendFrom(src, pkt.TCPSegment{Seq: rng.Uint32(), Flags: header.TCPFlagSyn, Window: 65535, Options: []byte{2, 4, 5, 180}})
		}
	}()
	// Let the queue fill, then connect for real, three times over, each
	// once the flood has just made the stack send a cookie (its queue is
	// full).
	time.Sleep(200 * time.Millisecond)
	for i := range 3 {
		sent := a.s.Engine().Counters().TCPSynCookiesSent
		for end := time.Now().Add(2 * time.Second); a.s.Engine().Counters().TCPSynCookiesSent == sent && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		if err := a.kernelEchoRun(t, 256<<10, uint64(30+i)); err != nil {
			close(stop)
			<-done
			t.Fatalf("real client %d during the flood: %v", i+1, err)
		}
	}
	close(stop)
	<-done
	after := a.s.Engine().Counters()
	t.Logf("SYN cookies sent %d, connections from cookies %d, listen drops %d",
		after.TCPSynCookiesSent-before.TCPSynCookiesSent, after.TCPSynCookiesOK-before.TCPSynCookiesOK, after.TCPListenDrops-before.TCPListenDrops)
	if after.TCPSynCookiesSent-before.TCPSynCookiesSent < uint64(total)/2 {
		t.Errorf("%d SYN cookies for %d spoofed SYNs", after.TCPSynCookiesSent-before.TCPSynCookiesSent, total)
	}
	// The spoofed SYNs never come back with an ACK: every connection made
	// from a cookie is a real client's. Each real client met a queue that
	// was full a moment before; a slow flooder (the race detector slows
	// it several times over) may let an embryonic entry time out just as
	// one arrives, and that client gets in the ordinary way. So: at least
	// one by cookie, none that is not a real client's.
	if ok := after.TCPSynCookiesOK - before.TCPSynCookiesOK; ok < 1 || ok > 3 {
		t.Errorf("%d connections made from SYN cookies, want from 1 to the 3 real clients'", ok)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(infos) != 3 {
		t.Fatalf("%d connections served, want 3", len(infos))
	}
	for i, in := range infos {
		if !in.Timestamps || !in.SACK || in.SndWScale < 0 || in.RcvWScale < 0 {
			t.Errorf("connection %d: timestamps %v, SACK %v, window scale %d/%d; the kernel client offers all three",
				i+1, in.Timestamps, in.SACK, in.SndWScale, in.RcvWScale)
		}
	}
}

// TestAttackZeroWindowPeer connects a raw peer that advertises a zero
// window (a minute; 3 seconds with -short) while our server has data for
// it: our stack probes the window on its persist timer without giving up
// or stalling anything else, then delivers the data in order once the
// window opens.
func TestAttackZeroWindowPeer(t *testing.T) {
	RequireRoot(t)
	payload := random(64<<10, 41)
	a := newAttackTarget(t, func(c net.Conn) {
		if c.RemoteAddr().(*net.TCPAddr).Port == 5555 {
			// Keepalive probes look like window probes on the wire (an
			// ACK one byte back): off, so that every one seen is a window
			// probe.
			c.(*sockets.TCPConn).SetKeepAlive(false)
			c.Write(payload)
		} else {
			echoServe(c)
		}
	})
	r := newRawPeer(t, a.p, netip.MustParseAddrPort("198.18.0.201:5555"), netip.MustParseAddrPort(a.ln.Addr().String()))
	before := a.s.Engine().Counters() // before any probe can go
	snd, rcv := r.handshake(0)
	probes := 0
	end := time.Now().Add(attackSeconds(time.Minute, 3*time.Second))
	echoDone := make(chan error, 1)
	go func() { echoDone <- a.kernelEchoRun(t, 8<<20, 42) }()
	for time.Now().Before(end) {
		f, ok := r.next(time.Until(end), nil)
		if !ok {
			break
		}
		if f.TCPFlags&header.TCPFlagRst != 0 {
			t.Fatal("our stack reset the zero-window peer")
		}
		// A window probe (RFC 9293 3.8.6.1): an ACK one byte behind what
		// we have acknowledged, carrying nothing, so that it draws an ACK
		// with the current window. Data into a zero window is not one.
		if len(f.Payload) > 0 {
			t.Fatalf("our stack sent %d bytes into a zero window (seq %d, window edge %d)", len(f.Payload), f.Seq, rcv)
		}
		if f.Seq == rcv-1 && f.TCPFlags == header.TCPFlagAck {
			probes++
		}
		r.send(pkt.TCPSegment{Seq: snd, Ack: rcv, Flags: header.TCPFlagAck, Window: 0})
	}
	if err := <-echoDone; err != nil {
		t.Fatalf("another connection during the zero window: %v", err)
	}
	if probes < 2 {
		t.Errorf("%d window probes in the zero window", probes)
	}
	// Open the window and take the data in order.
	r.send(pkt.TCPSegment{Seq: snd, Ack: rcv, Flags: header.TCPFlagAck, Window: 65535})
	var got []byte
	for len(got) < len(payload) {
		f, ok := r.next(10*time.Second, nil)
		if !ok {
			t.Fatalf("after the window opened: %d of %d bytes", len(got), len(payload))
		}
		if f.Seq == rcv && len(f.Payload) > 0 {
			got = append(got, f.Payload...)
			rcv += uint32(len(f.Payload))
		}
		r.send(pkt.TCPSegment{Seq: snd, Ack: rcv, Flags: header.TCPFlagAck, Window: 65535})
	}
	if !bytes.Equal(got[:len(payload)], payload) {
		t.Error("the data after the zero window differs")
	}
	after := a.s.Engine().Counters()
	t.Logf("%d probes seen; window probes counted %d", probes, after.TCPWindowProbes-before.TCPWindowProbes)
	if c := after.TCPWindowProbes - before.TCPWindowProbes; c < uint64(probes) {
		t.Errorf("TCPWindowProbes counted %d of the %d probes seen", c, probes)
	}
}

// TestAttackOutOfOrderFlood connects a raw peer that sends out-of-order
// data without end (the first segment never comes) while A's kernel
// echoes through our stack: the out-of-order queue stays within the
// receive buffer, frames do not run out, and the echo stays byte-exact.
func TestAttackOutOfOrderFlood(t *testing.T) {
	RequireRoot(t)
	var mu sync.Mutex
	var victim *sockets.TCPConn
	a := newAttackTarget(t, func(c net.Conn) {
		if c.RemoteAddr().(*net.TCPAddr).Port == 5556 {
			mu.Lock()
			victim = c.(*sockets.TCPConn)
			mu.Unlock()
			io.Copy(io.Discard, c)
			return
		}
		echoServe(c)
	})
	r := newRawPeer(t, a.p, netip.MustParseAddrPort("198.18.0.202:5556"), netip.MustParseAddrPort(a.ln.Addr().String()))
	snd, rcv := r.handshake(65535)
	before := a.s.Engine().Counters()
	stop := make(chan struct{})
	flooded := make(chan int)
	go func() {
		seg := make([]byte, 1400)
		n := 0
		for k := 0; ; k++ {
			select {
			case <-stop:
				flooded <- n
				return
			default:
			}
			binary.BigEndian.PutUint32(seg, uint32(k))
			off := uint32(1400 * (1 + k%4096)) // never the first segment
			r.send(pkt.TCPSegment{Seq: snd + off, Ack: rcv, Flags: header.TCPFlagAck, Window: 65535, Payload: seg})
			n++
		}
	}()
	echo := 32 << 20
	if testing.Short() {
		echo = 4 << 20
	}
	err := a.kernelEchoRun(t, echo, 51)
	time.Sleep(attackSeconds(10*time.Second, time.Second))
	close(stop)
	sent := <-flooded
	if err != nil {
		t.Fatalf("echo during the out-of-order flood: %v", err)
	}
	mu.Lock()
	v := victim
	mu.Unlock()
	info, ierr := v.Info()
	if ierr != nil {
		t.Fatal(ierr)
	}
	after := a.s.Engine().Counters()
	t.Logf("%d out-of-order segments sent; held %d bytes out of order (buffer %d); counters: ooo %d, buffer full %d, low frames %d",
		sent, info.OutOfOrder, info.RcvBuf, after.RxTCPOutOfOrder-before.RxTCPOutOfOrder, after.RxTCPBufferFull-before.RxTCPBufferFull, after.RxLowFrames-before.RxLowFrames)
	// Out-of-order data lies within the window we offered, so within the
	// receive buffer (docs/ARCHITECTURE.md, "Protections").
	if info.OutOfOrder > info.RcvBuf {
		t.Errorf("%d bytes held out of order, beyond the receive buffer %d", info.OutOfOrder, info.RcvBuf)
	}
	if info.OutOfOrder == 0 {
		t.Error("nothing was held out of order: the flood missed the window, and the test proves nothing")
	}
	if after.RxTCPOutOfOrder == before.RxTCPOutOfOrder {
		t.Error("RxTCPOutOfOrder did not move")
	}
	// The missing first segment: the queue drains to the reader. (First
	// let the flood's answers, still on their way through M, go by.)
	for quiet := time.After(300 * time.Millisecond); ; {
		select {
		case <-r.in:
			quiet = time.After(300 * time.Millisecond)
			continue
		case <-quiet:
		}
		break
	}
	drained := false
	for try := 0; try < 3 && !drained; try++ {
		r.send(pkt.TCPSegment{Seq: snd, Ack: rcv, Flags: header.TCPFlagAck, Window: 65535, Payload: make([]byte, 1400)})
		_, drained = r.next(5*time.Second, func(f pkt.Frame) bool { return f.Ack-snd > 1400 })
	}
	if !drained {
		now, _ := v.Info()
		t.Errorf("the queue did not drain when the hole was filled: rcvNxt %d (the hole was at %d), %d bytes out of order, %d unread",
			now.RcvNxt, snd, now.OutOfOrder, now.Unread)
	}
}
