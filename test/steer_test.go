package test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/vnic"
)

// TestSteeringOnVeth is the foundation's end-to-end check. Host b runs the
// steering program with UDP 7000 and TCP 7001 registered to an AF_XDP
// socket. From host a, at the same time: a UDP datagram to 7000 and a TCP
// SYN to 7001 must land in the socket byte for byte; ping and a TCP
// connection to 8080 must be answered by b's kernel.
func TestSteeringOnVeth(t *testing.T) {
	a, b := Pair(t, LinkOptions{})
	ia, ib := a.Iface0(), b.Iface0()
	s, err := Steer(ib, SteerConfig{Listeners: []bpf.Listener{
		{Proto: bpf.UDP, Addr: ib.Addr(), Port: 7000},
		{Proto: bpf.TCP, Port: 7001},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Logf("steering on %s in %s mode, nic %v", ib.Name, s.Attach.Mode, s.NIC.Info())

	// b's kernel: an echo server on 8080, and a UDP socket on 7000 that
	// must see nothing (the kernel never gets those datagrams).
	echo, err := b.KernelEcho(ib.Addr().String() + ":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	var reserved net.PacketConn
	if err := b.Do(func() (err error) {
		reserved, err = net.ListenPacket("udp", ib.Addr().String()+":7000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer reserved.Close()

	before, _ := s.Steering.Counters()
	udpPayload := []byte("steered datagram: \x00\x01\x02\xff and some bytes after")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	bAddr := ib.Addr().String()
	wg.Add(3)
	go func() { // ping, answered by b's kernel
		defer wg.Done()
		out, err := a.Run("ping", "-c", "5", "-i", "0.05", "-W", "2", bAddr)
		if err != nil || !strings.Contains(out, "5 received") {
			errs <- fmt.Errorf("ping: %v\n%s", err, out)
		}
	}()
	go func() { // TCP to an unregistered port, answered by b's kernel
		defer wg.Done()
		errs <- a.Do(func() error {
			c, err := net.DialTimeout("tcp", bAddr+":8080", 2*time.Second)
			if err != nil {
				return fmt.Errorf("tcp to the kernel's port: %w", err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 1000)
			for i := range 100 {
				msg := bytes.Repeat([]byte{byte(i)}, 1+i*9)
				if _, err := c.Write(msg); err != nil {
					return err
				}
				if _, err := io.ReadFull(c, buf[:len(msg)]); err != nil {
					return fmt.Errorf("echo %d: %w", i, err)
				}
				if !bytes.Equal(buf[:len(msg)], msg) {
					return fmt.Errorf("echo %d differs", i)
				}
			}
			return nil
		})
	}()
	var synErr error
	go func() { // UDP and a SYN to registered ports, from a's kernel
		defer wg.Done()
		errs <- a.Do(func() error {
			u, err := net.Dial("udp", bAddr+":7000")
			if err != nil {
				return err
			}
			defer u.Close()
			if _, err := u.Write(udpPayload); err != nil {
				return err
			}
			// Nothing answers the SYN (our socket does not speak TCP yet),
			// so the dial must time out: a refusal would mean b's kernel
			// saw it.
			_, synErr = net.DialTimeout("tcp", bAddr+":7001", time.Second)
			return nil
		})
	}()

	// Meanwhile, read b's AF_XDP socket.
	var gotUDP, gotSYN *pkt.Frame
	hs := make([]vnic.Handle, 16)
	deadline := time.Now().Add(5 * time.Second)
	for (gotUDP == nil || gotSYN == nil) && time.Now().Before(deadline) {
		n := s.NIC.Receive(hs)
		for _, h := range hs[:n] {
			raw := s.NIC.Pool().Data(h)
			f, err := pkt.Parse(raw)
			if err != nil {
				t.Errorf("frame in the AF_XDP socket does not parse (%v): %x", err, raw)
			} else {
				f.Payload = append([]byte(nil), f.Payload...)
				switch {
				case f.Proto == header.UDPProtocolNumber && f.Dst.Port() == 7000:
					gotUDP = &f
				case f.Proto == header.TCPProtocolNumber && f.Dst.Port() == 7001 && f.TCPFlags == header.TCPFlagSyn:
					gotSYN = &f
				default:
					t.Errorf("unexpected frame in the AF_XDP socket: %v", f)
				}
			}
			s.NIC.Pool().Free(h)
		}
		if n == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	src := netip.AddrPortFrom(ia.Addr(), 0)
	if gotUDP == nil {
		t.Error("the UDP datagram to port 7000 did not arrive in the AF_XDP socket")
	} else {
		if !bytes.Equal(gotUDP.Payload, udpPayload) {
			t.Errorf("UDP payload = %q, want %q", gotUDP.Payload, udpPayload)
		}
		if gotUDP.Src.Addr() != src.Addr() || gotUDP.Dst.Addr() != ib.Addr() ||
			!bytes.Equal(gotUDP.SrcMAC, ia.MAC) || !bytes.Equal(gotUDP.DstMAC, ib.MAC) {
			t.Errorf("UDP frame addresses %v %s->%s, want %s->%s", gotUDP, gotUDP.SrcMAC, gotUDP.DstMAC, ia.MAC, ib.MAC)
		}
	}
	if gotSYN == nil {
		t.Error("the TCP SYN to port 7001 did not arrive in the AF_XDP socket")
	} else if gotSYN.Src.Addr() != src.Addr() || len(gotSYN.Payload) != 0 {
		t.Errorf("SYN = %v", gotSYN)
	}
	var ne net.Error
	if !errors.As(synErr, &ne) || !ne.Timeout() {
		t.Errorf("dial to the steered TCP port: %v, want a timeout (b's kernel must not answer)", synErr)
	}

	// b's kernel never saw the datagram.
	reserved.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, _, err := reserved.ReadFrom(make([]byte, 1500)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("b's kernel UDP socket on 7000 got %d bytes (%v): the datagram was not stolen", n, err)
	}

	after, _ := s.Steering.Counters()
	c := after.Sub(before)
	t.Logf("counters: %s", c)
	if c[bpf.CounterRedirectListener] < 2 {
		t.Errorf("redirect_listener = %d, want at least 2 (the datagram and the SYN)", c[bpf.CounterRedirectListener])
	}
	if c[bpf.CounterPassOtherProto] < 5 {
		t.Errorf("pass_other_proto = %d, want at least 5 (the pings)", c[bpf.CounterPassOtherProto])
	}
	if c[bpf.CounterPassNoMatch] < 100 {
		t.Errorf("pass_no_match = %d, want at least 100 (the TCP connection to 8080)", c[bpf.CounterPassNoMatch])
	}
	if c.Dropped() != 0 {
		t.Errorf("%d frames dropped", c.Dropped())
	}
}
