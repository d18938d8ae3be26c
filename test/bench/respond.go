package main

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/vnic"
)

// The server floor: what any AF_XDP server could at most serve a kernel
// client on this path. respond answers every request that comes in on
// its port at once with a canned reply, from the frame alone: no
// connection state, no queues, no timers, no windows (the reply's
// sequence number is the request's acknowledgment number, which holds
// while a client waits for each answer before its next request, as
// redis-benchmark, wrk and memcslap do). It is the request/response
// counterpart of the ping-pong floor: the rings, the copy in and out, a
// kick a batch and the wake-up, and nothing of a TCP stack. A server
// under the shim is held to it where the floor itself does not reach the
// kernel ratio an issue asks for.

// protocols: each appends to out the replies to the requests in a
// segment's payload.
var protocols = map[string]func(out, in []byte) []byte{
	// redis-benchmark -t get: each request is a RESP array; the key was
	// never set, so redis answers nil. PING (redis-cli's, before the
	// benchmark) gets its PONG.
	"redis": func(out, in []byte) []byte {
		cmd := false // the next line that is not a length names the command
		return forLines(out, in, func(out, line []byte) []byte {
			switch {
			case bytes.HasPrefix(line, []byte("*")):
				cmd = true
			case bytes.HasPrefix(line, []byte("$")):
			case cmd:
				cmd = false
				if bytes.EqualFold(line, []byte("PING")) {
					return append(out, "+PONG\r\n"...)
				}
				return append(out, "$-1\r\n"...)
			}
			return out
		})
	},
	// wrk: each request ends with an empty line; the reply is nginx's for
	// the bench's 1 KiB file, headers of the same length.
	"http": func(out, in []byte) []byte {
		for range bytes.Count(in, []byte("\r\n\r\n")) {
			out = append(out, httpReply...)
		}
		return out
	},
	// memcslap: sets are stored; a get finds a value of memcslap's size
	// (about 2.4 KiB on average), as memcached answers the keys memcslap set.
	"memcache": func(out, in []byte) []byte {
		return forLines(out, in, func(out, line []byte) []byte {
			switch {
			case bytes.HasPrefix(line, []byte("set ")):
				out = append(out, "STORED\r\n"...)
			case bytes.HasPrefix(line, []byte("get ")):
				out = append(out, "VALUE "...)
				out = append(out, line[4:]...)
				out = append(out, " 0 2400\r\n"...)
				out = append(out, memcacheValue...)
				out = append(out, "\r\nEND\r\n"...)
			}
			return out
		})
	},
}

var (
	httpReply     = makeHTTPReply()
	memcacheValue = bytes.Repeat([]byte("v"), 2400)
)

// forLines calls f with each CRLF-ended line of in.
func forLines(out, in []byte, f func(out, line []byte) []byte) []byte {
	for {
		i := bytes.Index(in, []byte("\r\n"))
		if i < 0 {
			return out
		}
		out = f(out, in[:i])
		in = in[i+2:]
	}
}

func makeHTTPReply() []byte {
	body := bytes.Repeat([]byte("x"), 1024)
	h := fmt.Sprintf("HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Wed, 25 Nov 2026 07:00:00 GMT\r\n"+
		"Content-Type: text/html\r\nContent-Length: %d\r\nLast-Modified: Wed, 25 Nov 2026 07:00:00 GMT\r\n"+
		"Connection: keep-alive\r\nETag: \"6925e0d0-400\"\r\nAccept-Ranges: bytes\r\n\r\n", len(body))
	return append([]byte(h), body...)
}

// respondMain serves one port on iface from the AF_XDP socket of queue 0
// until it is signalled or its limit passes. It spins on the ring for
// -spin after the last frame, then blocks in poll on the socket, as a
// server under the shim's balanced profile does.
func respondMain(args []string) error {
	fs := flag.NewFlagSet("respond", flag.ExitOnError)
	iface := fs.String("iface", "eth0", "interface")
	port := fs.Int("port", 6380, "TCP port to answer on")
	proto := fs.String("proto", "redis", "requests and replies: redis, http or memcache")
	spin := fs.Duration("spin", 50*time.Microsecond, "spin this long on an empty ring before blocking")
	limit := fs.Duration("limit", 2*time.Minute, "exit after this long whatever happens")
	fs.Parse(args)
	answer, ok := protocols[*proto]
	if !ok {
		return fmt.Errorf("respond: unknown -proto %q: want redis, http or memcache", *proto)
	}
	if *port <= 0 || *port > 65535 {
		return fmt.Errorf("respond: -port %d is not a TCP port", *port)
	}
	nic, err := vnic.OpenXDP(vnic.XDPConfig{Interface: *iface})
	if err != nil {
		return fmt.Errorf("respond: %w", err)
	}
	defer nic.Close()
	st, err := steer(*iface, bpf.TCP, uint16(*port), nic.FD())
	if err != nil {
		return fmt.Errorf("respond: %w", err)
	}
	defer st.close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	r := responder{nic: nic, pool: nic.Pool(), protocol: answer}
	fmt.Println("ready")
	deadline := time.Now().Add(*limit)
	pfd := []unix.PollFd{{Fd: int32(nic.FD()), Events: unix.POLLIN}}
	last := time.Now()
	for i := 0; ; i++ {
		if r.serve() > 0 {
			last = time.Now()
			continue
		}
		if i&0xff == 0 {
			select {
			case <-stop:
				return nil
			default:
			}
			now := time.Now()
			if now.After(deadline) {
				return nil
			}
			if now.Sub(last) >= *spin {
				unix.Poll(pfd, 100)
				last = time.Now()
			}
		}
	}
}

type responder struct {
	nic      *vnic.XDP
	pool     *vnic.Pool
	protocol func(out, in []byte) []byte
	rx       [64]vnic.Handle
	tx       [256]vnic.Handle
	ntx      int
	buf      []byte
}

// serve answers the frames in the ring: how many it took.
func (r *responder) serve() int {
	n := r.nic.Receive(r.rx[:])
	r.ntx = 0
	for _, h := range r.rx[:n] {
		r.answer(r.pool.Data(h))
		r.pool.Free(h)
	}
	if r.ntx > 0 {
		sent, _ := r.nic.Transmit(r.tx[:r.ntx])
		for _, h := range r.tx[sent:r.ntx] {
			r.pool.Free(h)
		}
	}
	return n
}

// mss is the most a reply segment carries: the client's MSS on veth.
const mss = 1460

// answer queues the reply to one frame on r.tx, if it asks for one.
func (r *responder) answer(b []byte) {
	f, err := pkt.Parse(b)
	if err != nil || f.Proto != header.TCPProtocolNumber || f.TCPFlags&header.TCPFlagRst != 0 {
		return
	}
	seg := pkt.TCPSegment{Window: 65535}
	switch {
	case f.TCPFlags&header.TCPFlagSyn != 0:
		// The ISN from the 4-tuple, so that a SYN sent again gets the
		// same answer.
		var k [12]byte
		copy(k[0:4], f.Src.Addr().AsSlice())
		copy(k[4:8], f.Dst.Addr().AsSlice())
		binary.BigEndian.PutUint16(k[8:], f.Src.Port())
		binary.BigEndian.PutUint16(k[10:], f.Dst.Port())
		seg.Seq, seg.Ack = crc32.ChecksumIEEE(k[:]), f.Seq+1
		seg.Flags = header.TCPFlagSyn | header.TCPFlagAck
		seg.Options = []byte{2, 4, 0x05, 0xb4} // MSS 1460
	case f.TCPFlags&header.TCPFlagFin != 0:
		seg.Seq, seg.Ack = f.Ack, f.Seq+uint32(len(f.Payload))+1
		seg.Flags = header.TCPFlagFin | header.TCPFlagAck
	case len(f.Payload) > 0:
		seg.Seq, seg.Ack = f.Ack, f.Seq+uint32(len(f.Payload))
		seg.Flags = header.TCPFlagAck
		r.buf = r.protocol(r.buf[:0], f.Payload)
		if len(r.buf) == 0 {
			break // no reply yet (the rest of a value): an ACK
		}
		for out := r.buf; len(out) > 0; {
			seg.Payload = out[:min(len(out), mss)]
			out = out[len(seg.Payload):]
			if len(out) == 0 {
				seg.Flags |= header.TCPFlagPsh
			}
			if !r.queue(f, seg) {
				return
			}
			seg.Seq += uint32(len(seg.Payload))
		}
		return
	default:
		return // an ACK alone
	}
	r.queue(f, seg)
}

// queue builds seg, the reply to f, in a new frame on r.tx.
func (r *responder) queue(f pkt.Frame, seg pkt.TCPSegment) bool {
	if r.ntx == len(r.tx) {
		return false
	}
	h := r.pool.Alloc()
	if h == vnic.Null {
		return false
	}
	src := pkt.Endpoint{MAC: f.DstMAC, Addr: f.Dst}
	dst := pkt.Endpoint{MAC: f.SrcMAC, Addr: f.Src}
	n, err := pkt.TCP(r.pool.Buf(h), src, dst, seg)
	if err != nil {
		r.pool.Free(h)
		return false
	}
	r.pool.SetLen(h, n)
	r.tx[r.ntx] = h
	r.ntx++
	return true
}
