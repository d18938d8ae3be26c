package main

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/vnic"
)

var (
	client = pkt.Endpoint{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, Addr: netip.MustParseAddrPort("198.18.0.1:40000")}
	srvEnd = pkt.Endpoint{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, Addr: netip.MustParseAddrPort("198.18.0.2:6380")}
)

// reply is what the responder sent back to one segment from the client.
func reply(t *testing.T, r *responder, seg pkt.TCPSegment) []pkt.Frame {
	t.Helper()
	buf := make([]byte, 2048)
	n, err := pkt.TCP(buf, client, srvEnd, seg)
	if err != nil {
		t.Fatal(err)
	}
	r.ntx = 0
	r.answer(buf[:n])
	var out []pkt.Frame
	for _, h := range r.tx[:r.ntx] {
		f, err := pkt.Parse(bytes.Clone(r.pool.Data(h)))
		if err != nil {
			t.Fatalf("the reply does not parse: %v", err)
		}
		if f.Src != srvEnd.Addr || f.Dst != client.Addr || !bytes.Equal(f.DstMAC, client.MAC) {
			t.Fatalf("reply from %v (%v) to %v: want from %v to %v (%v)", f.Src, f.SrcMAC, f.Dst, srvEnd.Addr, client.Addr, client.MAC)
		}
		out = append(out, f)
		r.pool.Free(h)
	}
	return out
}

func newResponder(t *testing.T, proto string) *responder {
	a, _, err := vnic.NewMemPair(vnic.MemConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &responder{pool: a.Pool(), protocol: protocols[proto]}
}

// TestRespond checks the server floor's answers: the handshake, a reply
// per request at the request's acknowledgment number, a reply longer than
// a segment in several, an ACK for a segment that asks nothing yet, and
// the close.
func TestRespond(t *testing.T) {
	r := newResponder(t, "redis")
	syn := pkt.TCPSegment{Seq: 1000, Flags: header.TCPFlagSyn, Window: 65535}
	got := reply(t, r, syn)
	if len(got) != 1 || got[0].TCPFlags != header.TCPFlagSyn|header.TCPFlagAck || got[0].Ack != 1001 {
		t.Fatalf("SYN answered with %v, want one SYN-ACK acknowledging 1001", got)
	}
	isn := got[0].Seq
	if again := reply(t, r, syn); len(again) != 1 || again[0].Seq != isn {
		t.Fatalf("the SYN again answered with %v, want the same ISN %d", again, isn)
	}
	if got := reply(t, r, pkt.TCPSegment{Seq: 1001, Ack: isn + 1, Flags: header.TCPFlagAck}); len(got) != 0 {
		t.Fatalf("an ACK alone answered with %v", got)
	}

	get := "*2\r\n$3\r\nGET\r\n$16\r\nkey:__rand_int__\r\n"
	req := strings.Repeat(get, 2) + "*1\r\n$4\r\nPING\r\n"
	got = reply(t, r, pkt.TCPSegment{Seq: 1001, Ack: isn + 1, Flags: header.TCPFlagAck | header.TCPFlagPsh, Payload: []byte(req)})
	want := "$-1\r\n$-1\r\n+PONG\r\n"
	if len(got) != 1 || string(got[0].Payload) != want || got[0].Seq != isn+1 || got[0].Ack != 1001+uint32(len(req)) {
		t.Fatalf("two GETs and a PING answered with %v, want %q at seq %d ack %d", got, want, isn+1, 1001+len(req))
	}

	fin := pkt.TCPSegment{Seq: 5000, Ack: 7000, Flags: header.TCPFlagFin | header.TCPFlagAck}
	got = reply(t, r, fin)
	if len(got) != 1 || got[0].TCPFlags != header.TCPFlagFin|header.TCPFlagAck || got[0].Seq != 7000 || got[0].Ack != 5001 {
		t.Fatalf("FIN answered with %v, want FIN-ACK at seq 7000 acknowledging 5001", got)
	}

	h := newResponder(t, "http")
	two := strings.Repeat("GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", 2)
	got = reply(t, h, pkt.TCPSegment{Seq: 1, Ack: 100, Flags: header.TCPFlagAck, Payload: []byte(two)})
	var body []byte
	seq := uint32(100)
	for i, f := range got {
		if f.Seq != seq || len(f.Payload) > mss || (f.TCPFlags&header.TCPFlagPsh != 0) != (i == len(got)-1) {
			t.Fatalf("segment %d of the reply: seq %d (want %d), %d bytes, flags %v: want consecutive segments of at most %d bytes, PSH on the last", i, f.Seq, seq, len(f.Payload), f.TCPFlags, mss)
		}
		seq += uint32(len(f.Payload))
		body = append(body, f.Payload...)
	}
	if want := append(bytes.Clone(httpReply), httpReply...); len(got) < 2 || !bytes.Equal(body, want) {
		t.Fatalf("two HTTP requests answered with %d bytes in %d segments, want both replies (%d bytes) in more than one", len(body), len(got), len(want))
	}

	m := newResponder(t, "memcache")
	got = reply(t, m, pkt.TCPSegment{Seq: 1, Ack: 100, Flags: header.TCPFlagAck, Payload: []byte("set k 0 0 5\r\n")})
	if len(got) != 1 || string(got[0].Payload) != "STORED\r\n" {
		t.Fatalf("set answered with %v, want STORED", got)
	}
	got = reply(t, m, pkt.TCPSegment{Seq: 14, Ack: 108, Flags: header.TCPFlagAck, Payload: []byte("hello\r\n")})
	if len(got) != 1 || len(got[0].Payload) != 0 || got[0].Ack != 21 || got[0].TCPFlags != header.TCPFlagAck {
		t.Fatalf("the rest of a value answered with %v, want an ACK of 21 alone", got)
	}
	got = reply(t, m, pkt.TCPSegment{Seq: 21, Ack: 108, Flags: header.TCPFlagAck, Payload: []byte("get k\r\n")})
	var v []byte
	for _, f := range got {
		v = append(v, f.Payload...)
	}
	if !bytes.HasPrefix(v, []byte("VALUE k 0 2400\r\n")) || !bytes.HasSuffix(v, []byte("\r\nEND\r\n")) || len(v) != len("VALUE k 0 2400\r\n")+2400+len("\r\nEND\r\n") {
		t.Fatalf("get answered with %q..., want VALUE k with 2400 bytes and END", v[:min(len(v), 40)])
	}
}
