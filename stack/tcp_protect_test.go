package stack_test

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// injectFrom puts a TCP segment on the wire from nic, as if sent by src.
func injectFrom(t *testing.T, nic *vnic.Mem, src, dst pkt.Endpoint, seg pkt.TCPSegment) {
	t.Helper()
	p := nic.Pool()
	h := p.Alloc()
	n, err := pkt.TCP(p.Buf(h), src, dst, seg)
	if err != nil {
		t.Fatal(err)
	}
	p.SetLen(h, n)
	if k, err := nic.Transmit([]vnic.Handle{h}); k != 1 {
		t.Fatalf("inject: %v", err)
	}
}

// drain throws away what reached nic: hosts that do not answer.
func drain(nic *vnic.Mem) {
	hs := make([]vnic.Handle, 64)
	for {
		n := nic.Receive(hs)
		if n == 0 {
			return
		}
		for _, h := range hs[:n] {
			nic.Pool().Free(h)
		}
	}
}

// TestSynCookies floods a listener's SYN queue with spoofed SYNs whose
// senders never answer; a real client still connects, through a SYN
// cookie, and moves data both ways. An ACK with a forged cookie gets a
// reset.
func TestSynCookies(t *testing.T) {
	a, b, na, nb := twoStacksNICs(t, vnic.MemConfig{})
	l, _ := b.Open(stack.TCP)
	b.Bind(l, netip.AddrPortFrom(netip.Addr{}, 80))
	if err := b.Listen(l, 4); err != nil {
		t.Fatal(err)
	}
	dst := pkt.Endpoint{MAC: nb.Info().MAC, Addr: netip.AddrPortFrom(addrB.Addr(), 80)}
	for i := range 200 {
		src := pkt.Endpoint{MAC: na.Info().MAC, Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, byte(10 + i%200)}), uint16(10000+i))}
		injectFrom(t, na, src, dst, pkt.TCPSegment{Seq: uint32(i * 7919), Flags: header.TCPFlagSyn, Window: 65535, Options: []byte{2, 4, 5, 180}})
		if i%32 == 31 {
			b.Poll()
		}
	}
	for range 10 {
		b.Poll()
	}
	drain(na)
	c := b.Counters()
	if c.TCPSynCookiesSent < 190 {
		t.Fatalf("%d SYN cookies sent for 200 SYNs on a queue of 4 (%s)", c.TCPSynCookiesSent, &c)
	}

	poll := pollBoth(a, b)
	cl, _ := a.Open(stack.TCP)
	a.Connect(cl, netip.AddrPortFrom(addrB.Addr(), 80))
	var srv stack.SockID
	waitFor(t, "accept through a cookie", 5*time.Second, poll, func() bool {
		var err error
		srv, err = b.Accept(l)
		return err == nil
	})
	if c := b.Counters(); c.TCPSynCookiesOK != 1 {
		t.Errorf("TCPSynCookiesOK = %d, want 1", c.TCPSynCookiesOK)
	}
	// The client offered timestamps, SACK and window scaling; the cookie's
	// timestamp carried them, and both ends agree on them.
	si, _ := b.TCPInfo(srv)
	ci, _ := a.TCPInfo(cl)
	if !si.Timestamps || !si.SACK || si.SndWScale < 0 || si.RcvWScale < 0 {
		t.Errorf("cookie connection's options: timestamps %v, SACK %v, window scale %d/%d", si.Timestamps, si.SACK, si.SndWScale, si.RcvWScale)
	}
	if ci.Timestamps != si.Timestamps || ci.SACK != si.SACK || ci.SndWScale != si.RcvWScale || ci.RcvWScale != si.SndWScale {
		t.Errorf("the ends disagree: client %+v, server %+v", ci, si)
	}
	data := randomBytes(200<<10, 5)
	if got := transfer(t, a, cl, b, srv, data, poll, 10*time.Second); !bytes.Equal(got, data) {
		t.Fatalf("client to server: %d of %d bytes", len(got), len(data))
	}
	if got := transfer(t, b, srv, a, cl, data, poll, 10*time.Second); !bytes.Equal(got, data) {
		t.Fatalf("server to client: %d of %d bytes", len(got), len(data))
	}

	// A forged cookie: an ACK out of nowhere.
	before := b.Counters()
	src := pkt.Endpoint{MAC: na.Info().MAC, Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 0, 99}), 4444)}
	injectFrom(t, na, src, dst, pkt.TCPSegment{Seq: 1, Ack: 0x12345678, Flags: header.TCPFlagAck, Window: 1000})
	b.Poll()
	after := b.Counters()
	if after.TCPSynCookiesFailed != before.TCPSynCookiesFailed+1 || after.TxTCPResets != before.TxTCPResets+1 || after.TCPSynCookiesOK != 1 {
		t.Errorf("forged cookie: failed %d->%d, resets %d->%d, ok %d", before.TCPSynCookiesFailed, after.TCPSynCookiesFailed,
			before.TxTCPResets, after.TxTCPResets, after.TCPSynCookiesOK)
	}
}

// TestChallengeAcks sends blind RSTs and SYNs into a live connection: in
// the window but not exact, they draw challenge ACKs (RFC 5961) and the
// connection lives on; outside the window, RSTs are dropped silently.
func TestChallengeAcks(t *testing.T) {
	a, b, na, nb := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	info, _ := b.TCPInfo(s)
	bl, _ := b.LocalAddr(s)
	al, _ := a.LocalAddr(c)
	src := pkt.Endpoint{MAC: na.Info().MAC, Addr: al}
	dst := pkt.Endpoint{MAC: nb.Info().MAC, Addr: bl}
	before := b.Counters()
	for i := range 10 {
		injectFrom(t, na, src, dst, pkt.TCPSegment{Seq: info.RcvNxt + uint32(100+i), Flags: header.TCPFlagRst})
		injectFrom(t, na, src, dst, pkt.TCPSegment{Seq: info.RcvNxt + uint32(500+i), Flags: header.TCPFlagSyn, Window: 100})
		injectFrom(t, na, src, dst, pkt.TCPSegment{Seq: info.RcvNxt + 1<<30, Flags: header.TCPFlagRst})
	}
	for range 5 {
		poll()
	}
	after := b.Counters()
	if n := after.TCPChallengeAcks - before.TCPChallengeAcks; n != 20 {
		t.Errorf("%d challenge ACKs for 10 in-window RSTs and 10 SYNs, want 20", n)
	}
	if after.RxTCPResets != before.RxTCPResets {
		t.Error("a blind RST was accepted")
	}
	data := randomBytes(64<<10, 6)
	if got := transfer(t, a, c, b, s, data, poll, 5*time.Second); !bytes.Equal(got, data) {
		t.Fatalf("after the attack: %d of %d bytes", len(got), len(data))
	}
}

// TestUserTimeout cuts the wire under a connection with data in flight:
// with a 300ms user timeout (RFC 5482) the connection ends with
// ErrTimedOut after about that long, not after minutes of backoff.
func TestUserTimeout(t *testing.T) {
	a, b, _, nb := twoStacksNICs(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, _ := connectPair(t, a, b, poll)
	if err := a.SetOption(c, stack.UserTimeout, 300); err != nil {
		t.Fatal(err)
	}
	if v, _ := a.Option(c, stack.UserTimeout); v != 300 {
		t.Fatalf("UserTimeout reads %d", v)
	}
	if err := a.SetOption(c, stack.UserTimeout, -1); err == nil {
		t.Error("UserTimeout -1 accepted")
	}
	nb.Impair(vnic.Impairment{Loss: 1}) // b's ACKs go nowhere
	start := time.Now()
	a.Send(c, make([]byte, 4096))
	waitFor(t, "the user timeout", 5*time.Second, poll, func() bool {
		_, err := a.Send(c, []byte("x"))
		return errors.Is(err, stack.ErrTimedOut) || errors.Is(err, stack.ErrPipe)
	})
	if el := time.Since(start); el < 250*time.Millisecond || el > 2*time.Second {
		t.Errorf("the connection ended after %v, want about 300ms", el)
	}
}

// TestCongestionOption switches a connection between CUBIC and NewReno.
func TestCongestionOption(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	poll := pollBoth(a, b)
	c, s := connectPair(t, a, b, poll)
	if info, _ := a.TCPInfo(c); info.Congestion != "cubic" {
		t.Errorf("default congestion control %q, want cubic", info.Congestion)
	}
	if err := a.SetOption(c, stack.Congestion, stack.CongestionReno); err != nil {
		t.Fatal(err)
	}
	if info, _ := a.TCPInfo(c); info.Congestion != "reno" {
		t.Errorf("after setting reno: %q", info.Congestion)
	}
	if err := a.SetOption(c, stack.Congestion, 7); err == nil {
		t.Error("congestion control 7 accepted")
	}
	data := randomBytes(1<<20, 8)
	if got := transfer(t, a, c, b, s, data, poll, 10*time.Second); !bytes.Equal(got, data) {
		t.Fatal("transfer with reno")
	}
}

// TestIPClassOption: IP_TOS and IP_TTL take what Linux's setsockopt
// takes (a TTL of -1 is the default; TCP keeps the ECN bits of the TOS
// to itself), refuse the rest, and read back.
func TestIPClassOption(t *testing.T) {
	a, b := twoStacks(t, vnic.MemConfig{})
	c, _ := connectPair(t, a, b, pollBoth(a, b))
	for _, tc := range []struct {
		opt     stack.Option
		set     int
		ok      bool
		readsAs int
	}{
		{stack.TOS, 0xb8, true, 0xb8}, {stack.TOS, 0x2b, true, 0x28}, {stack.TOS, 0, true, 0},
		{stack.TOS, 256, false, 0}, {stack.TOS, -1, false, 0},
		{stack.TTL, 1, true, 1}, {stack.TTL, 255, true, 255}, {stack.TTL, -1, true, 64},
		{stack.TTL, 0, false, 64}, {stack.TTL, 256, false, 64},
	} {
		err := a.SetOption(c, tc.opt, tc.set)
		if (err == nil) != tc.ok {
			t.Errorf("option %d set to %d: %v, want accepted %v", tc.opt, tc.set, err, tc.ok)
		}
		if v, err := a.Option(c, tc.opt); err != nil || v != tc.readsAs {
			t.Errorf("option %d after setting %d reads %d, %v; want %d", tc.opt, tc.set, v, err, tc.readsAs)
		}
	}
}

// TestTinySegments: a peer that sends hundreds of tiny segments cannot
// hold more frames than the receive buffer (with Linux's quarter more)
// holds halves of frames: a frame is charged half a frame's bytes at
// least. Before, each 5-byte segment ahead of rcvNxt (with a gap before
// it) took a frame of its own within the window's bytes, and FuzzInput
// found the pool draining (318 frames for 1,592 bytes); so did a FIN
// alone ahead of rcvNxt, and segments in order that the application does
// not read, which the fast path took.
func TestTinySegments(t *testing.T) {
	t.Run("out of order", func(t *testing.T) { tinySegments(t, header.TCPFlagAck|header.TCPFlagPsh, "tiny!", 10, 10) })
	t.Run("FIN out of order", func(t *testing.T) { tinySegments(t, header.TCPFlagAck|header.TCPFlagFin, "", 10, 10) })
	t.Run("in order, unread", func(t *testing.T) { tinySegments(t, header.TCPFlagAck|header.TCPFlagPsh, "tiny!", 0, 0) })
}

// tinySegments sends 600 segments with flags and payload, the i-th at
// first + stride*i past rcvNxt as it is when it is sent (0 and 0: each in
// order), and checks the frames they hold.
func tinySegments(t *testing.T, flags header.TCPFlags, payload string, first, stride int) {
	e := newFuzzEnv(t)
	src := pkt.Endpoint{MAC: e.mb.Info().MAC, Addr: netip.AddrPortFrom(addrB.Addr(), 80)}
	dst := pkt.Endpoint{MAC: e.ma.Info().MAC, Addr: netip.AddrPortFrom(addrA.Addr(), e.lport)}
	tsFar := []byte{1, 1, 8, 10, 0x40, 0, 0, 0, 0, 0, 0, 1}
	free := e.ma.Pool().Available()
	buf := make([]byte, 2048)
	// Fewer than would run the pool down to its reserve, where the stack
	// gives up out-of-order data anyway (lowFramesLocked).
	const segs = 600
	for i := range segs {
		n, err := pkt.TCP(buf, src, dst, pkt.TCPSegment{Seq: uint32(first + stride*i), Flags: flags,
			Window: 1000, Options: tsFar, Payload: []byte(payload)})
		if err != nil {
			t.Fatal(err)
		}
		frame := append([]byte(nil), buf[:n]...)
		e.relative(frame)
		fixChecksums(frame)
		e.inject(frame)
		e.a.Poll()
		e.b.Poll()
	}
	info, err := e.a.TCPInfo(e.c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held %d frames, %d bytes unread, %d out of order", free-e.ma.Pool().Available(), info.Unread, info.OutOfOrder)
	most := (info.RcvBuf + info.RcvBuf/4) / 1024
	if held := free - e.ma.Pool().Available(); held > int(most)+8 {
		t.Errorf("%d tiny segments hold %d frames, want at most %d (a %d-byte buffer, a frame charged 1 KiB)",
			segs, held, most, info.RcvBuf)
	}
}

// TestSynSentOldConnection: our SYN meets a peer that still has an old
// connection on the four-tuple (its TIME-WAIT, whose answer to a SYN below
// its sequence space is an ACK of that space). We reset the old
// connection and send the SYN again at once, not a second later; once a
// connection: a second such ACK gets the reset only. The handshake then
// completes.
func TestSynSentOldConnection(t *testing.T) {
	s, na, nb := memPair(t, vnic.MemConfig{})
	c, err := s.Open(stack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	remote := netip.AddrPortFrom(addrB.Addr(), 80)
	s.Connect(c, remote)
	local, _ := s.LocalAddr(c)
	// sent is what our stack put on the wire since the last look.
	sent := func() []pkt.Frame {
		t.Helper()
		s.Poll()
		var out []pkt.Frame
		hs := make([]vnic.Handle, 16)
		for n := nb.Receive(hs); n > 0; n = nb.Receive(hs) {
			for _, h := range hs[:n] {
				f, err := pkt.Parse(nb.Pool().Data(h))
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, f)
				nb.Pool().Free(h)
			}
		}
		return out
	}
	syn := sent()
	if len(syn) != 1 || syn[0].TCPFlags != header.TCPFlagSyn {
		t.Fatalf("connect sent %+v, want one SYN", syn)
	}
	iss := syn[0].Seq
	src := pkt.Endpoint{MAC: nb.Info().MAC, Addr: remote}
	dst := pkt.Endpoint{MAC: na.Info().MAC, Addr: local}
	const oldNxt = 0x12345678
	for round, want := range [][]header.TCPFlags{{header.TCPFlagRst, header.TCPFlagSyn}, {header.TCPFlagRst}} {
		injectFrom(t, nb, src, dst, pkt.TCPSegment{Seq: 0x0abcdef0, Ack: oldNxt, Flags: header.TCPFlagAck, Window: 100})
		got := sent()
		if len(got) != len(want) {
			t.Fatalf("old connection's ACK %d: we sent %+v, want %v", round+1, got, want)
		}
		for i, f := range got {
			if f.TCPFlags != want[i] {
				t.Fatalf("old connection's ACK %d: segment %d is %v, want %v", round+1, i, f.TCPFlags, want[i])
			}
		}
		if got[0].Seq != oldNxt {
			t.Fatalf("the reset's sequence number is %#x, want the ACK's %#x", got[0].Seq, oldNxt)
		}
		if len(got) > 1 && got[1].Seq != iss {
			t.Fatalf("the SYN again has sequence number %#x, want the first's %#x", got[1].Seq, iss)
		}
	}
	injectFrom(t, nb, src, dst, pkt.TCPSegment{Seq: 1000, Ack: iss + 1, Flags: header.TCPFlagSyn | header.TCPFlagAck, Window: 65535})
	waitFor(t, "established", 5*time.Second, func() { s.Poll() }, func() bool { return s.Events(c)&stack.Writable != 0 })
}
