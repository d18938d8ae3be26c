package test

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
)

// TestStackTCPReceiveShare: sixteen kernel senders in host a send 2 MiB
// each to our stack in b at once, while its program polls only every 5
// ms (a program busy with its own work, or waiting for a CPU). The kernel
// can deliver only into the frames of the fill ring, which only a poll
// refills; the connections' windows together fit in it (their shares of
// the NIC's receive depth), so the kernel drops no frame for want of one
// and every byte arrives. Without the shares each window opens to the
// receive buffer, and the senders' bursts overrun the ring.
func TestStackTCPReceiveShare(t *testing.T) {
	const (
		conns = 16
		each  = 2 << 20
		port  = 5230
	)
	a, b := Pair(t, LinkOptions{})
	st, s := ourStackNIC(t, b.Iface0(), SteerConfig{NIC: vnic.XDPConfig{FrameCount: 8192, FillDepth: 512}})
	l, _ := s.Open(stack.TCP)
	if err := s.Bind(l, netip.AddrPortFrom(netip.IPv4Unspecified(), port)); err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(l, conns); err != nil {
		t.Fatal(err)
	}
	stop := poller(s)
	var ks []net.Conn
	t.Cleanup(func() {
		for _, k := range ks {
			k.Close()
		}
	})
	if err := a.Do(func() error {
		for range conns {
			k, err := net.DialTimeout("tcp", netip.AddrPortFrom(b.Iface0().Addr(), port).String(), 5*time.Second)
			if err != nil {
				return err
			}
			ks = append(ks, k)
		}
		return nil
	}); err != nil {
		stop()
		t.Fatal(err)
	}
	var ids []stack.SockID
	for deadline := time.Now().Add(5 * time.Second); len(ids) < conns; {
		id, err := s.Accept(l)
		if err == nil {
			ids = append(ids, id)
			continue
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("accepted %d of %d connections", len(ids), conns)
		}
		time.Sleep(100 * time.Microsecond)
	}
	stop() // from here the test polls, every 5 ms
	before, err := st.NIC.Socket().Stats()
	if err != nil {
		t.Skipf("the kernel gives no AF_XDP statistics: %v", err)
	}

	var wg sync.WaitGroup
	data := random(each, 7)
	for _, k := range ks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k.SetWriteDeadline(time.Now().Add(60 * time.Second))
			k.Write(data)
			k.(*net.TCPConn).CloseWrite()
		}()
	}
	got := make([]int, conns)
	done := 0
	buf := make([]byte, 256<<10)
	for deadline := time.Now().Add(60 * time.Second); done < conns; {
		if time.Now().After(deadline) {
			t.Fatalf("received %v bytes of %d each in 60 s", got, each)
		}
		for range 1000 {
			if s.Poll() == 0 {
				break
			}
		}
		for i, id := range ids {
			if got[i] < 0 {
				continue
			}
			for {
				n, err := s.Recv(id, buf, false)
				if errors.Is(err, stack.ErrWouldBlock) {
					break
				}
				if err != nil {
					t.Fatalf("connection %d: recv after %d bytes: %v", i, got[i], err)
				}
				if n == 0 {
					if got[i] != each {
						t.Fatalf("connection %d: end of stream after %d of %d bytes", i, got[i], each)
					}
					got[i] = -1
					done++
					break
				}
				got[i] += n
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	after, _ := st.NIC.Socket().Stats()
	c := s.Counters()
	t.Logf("%d connections, %d bytes each; fill ring empty %d times, RX ring full %d; retransmitted by the senders: %d out of order here",
		conns, each, after.RxFillRingEmptyDescs-before.RxFillRingEmptyDescs, after.RxRingFull-before.RxRingFull, c.RxTCPOutOfOrder)
	if n := after.RxFillRingEmptyDescs - before.RxFillRingEmptyDescs; n != 0 {
		t.Errorf("the kernel found the fill ring empty %d times: the windows add up to more than the NIC's receive depth (%d frames)",
			n, st.NIC.Info().RxDepth)
	}
}
