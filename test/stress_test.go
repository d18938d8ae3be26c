package test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdp-onload/onload/sockets"
)

// TestNoLostWakeup runs our stack at both ends of a veth (so both sides
// sleep and wake through the steering program's interrupts) with many
// goroutines moving random amounts of data with random pauses, for a
// minute (ONLOAD_STRESS_SECONDS changes it). Each connection streams a
// seeded byte stream through an echo with random read and write sizes
// and random pauses, and checks every byte that comes back. A connection
// that makes no progress for 10s is a stall: a lost wake-up.
func TestNoLostWakeup(t *testing.T) {
	RequireRoot(t)
	dur := time.Minute
	if s := os.Getenv("ONLOAD_STRESS_SECONDS"); s != "" {
		var n int
		fmt.Sscan(s, &n)
		dur = time.Duration(n) * time.Second
	}
	if testing.Short() {
		dur = 5 * time.Second
	}
	cfg, _ := sockets.DefaultConfig(sockets.Balanced)
	stress(t, dur, cfg)
}

func stress(t *testing.T, dur time.Duration, cfg sockets.Config) {
	const conns = 12
	a, b := Pair(t, LinkOptions{})
	sa := ourSocketsConfig(t, a, cfg)
	sb := ourSocketsConfig(t, b, cfg)

	var ln net.Listener
	if err := b.Do(func() (err error) {
		lc := sockets.ListenConfig{Stack: sb}
		ln, err = lc.Listen(context.Background(), "tcp", b.Iface0().Addr().String()+":0")
		return
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()

	var serverRead sync.Map                 // client address -> *atomic.Int64, bytes the server read
	progress := make([]atomic.Int64, conns) // UnixNano of each connection's last progress
	moved := make([]atomic.Int64, conns)
	var wg sync.WaitGroup
	errs := make(chan error, 4*conns)
	// Servers: echo with random chunk sizes and pauses.
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				rng := rand.New(rand.NewPCG(uint64(i), 99))
				buf := make([]byte, 256<<10)
				var got atomic.Int64
				serverRead.Store(c.RemoteAddr().String(), &got)
				for {
					n, err := c.Read(buf[:1+rng.IntN(len(buf))])
					got.Add(int64(n))
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							errs <- fmt.Errorf("server write: %w", werr)
							return
						}
					}
					if err == io.EOF {
						c.(interface{ CloseWrite() error }).CloseWrite()
						return
					}
					if err != nil {
						errs <- fmt.Errorf("server read: %w", err)
						return
					}
					pause(rng)
				}
			}()
		}
	}()

	stop := time.Now().Add(dur)
	d := sockets.Dialer{Stack: sa}
	for i := range conns {
		var c net.Conn
		if err := a.Do(func() (err error) { c, err = d.Dial("tcp", ln.Addr().String()); return }); err != nil {
			t.Fatal(err)
		}
		progress[i].Store(time.Now().UnixNano())
		seed := [32]byte{byte(i)}
		var written atomic.Int64
		wdone := make(chan struct{})
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			defer close(wdone)
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			src := rand.NewChaCha8(seed)
			buf := make([]byte, 128<<10)
			for time.Now().Before(stop) {
				n := randSize(rng, len(buf))
				src.Read(buf[:n])
				if _, err := c.Write(buf[:n]); err != nil {
					errs <- fmt.Errorf("conn %d write: %w", i, err)
					return
				}
				written.Add(int64(n))
				progress[i].Store(time.Now().UnixNano())
				pause(rng)
			}
			c.(interface{ CloseWrite() error }).CloseWrite()
		}()
		go func() { // reader: checks the echo against the same stream
			defer wg.Done()
			defer c.Close()
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			want := rand.NewChaCha8(seed)
			buf := make([]byte, 128<<10)
			exp := make([]byte, len(buf))
			var total int64
			for {
				n, err := c.Read(buf[:randSize(rng, len(buf))])
				if n > 0 {
					want.Read(exp[:n])
					if !bytes.Equal(buf[:n], exp[:n]) {
						errs <- fmt.Errorf("conn %d: echo differs from what was sent at byte %d+%d", i, total, firstDiff(buf[:n], exp[:n]))
						return
					}
					total += int64(n)
					moved[i].Store(total)
					progress[i].Store(time.Now().UnixNano())
				}
				if errors.Is(err, io.EOF) {
					<-wdone
					if total != written.Load() {
						var sr int64 = -1
						if v, ok := serverRead.Load(c.LocalAddr().String()); ok {
							sr = v.(*atomic.Int64).Load()
						}
						errs <- fmt.Errorf("conn %d (%v): %d bytes came back of %d sent; the server read %d\na: %s\nb: %s", i, c.LocalAddr(), total, written.Load(), sr, sa.Dump(), sb.Dump())
					}
					return
				}
				if err != nil {
					errs <- fmt.Errorf("conn %d read: %w", i, err)
					return
				}
				pause(rng)
			}
		}()
	}

	// The watchdog.
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := stop.Add(time.Minute)
	for {
		select {
		case err := <-errs:
			t.Fatal(err)
		case <-finished:
			var sum int64
			for i := range moved {
				sum += moved[i].Load()
			}
			t.Logf("%d connections for %v: %d MiB echoed; sleeper a %+v, b %+v", conns, dur, sum>>20, sa.Sleeper().Stats(), sb.Sleeper().Stats())
			return
		case now := <-tick.C:
			for i := range progress {
				if idle := now.Sub(time.Unix(0, progress[i].Load())); idle > 10*time.Second {
					t.Fatalf("conn %d made no progress for %v (after %d bytes): a lost wake-up\na: %s\nb: %s", i, idle.Round(time.Second), moved[i].Load(), sa.Dump(), sb.Dump())
				}
			}
			if now.After(deadline) {
				t.Fatal("connections did not finish a minute after the end")
			}
		}
	}
}

// randSize is mostly small, sometimes up to max.
func randSize(rng *rand.Rand, max int) int {
	switch rng.IntN(4) {
	case 0:
		return 1 + rng.IntN(16)
	case 1:
		return 1 + rng.IntN(1500)
	case 2:
		return 1 + rng.IntN(16<<10)
	}
	return 1 + rng.IntN(max)
}

// pause sleeps, now and then, long enough for the spin to end and the
// goroutine to park.
func pause(rng *rand.Rand) {
	if rng.IntN(8) == 0 {
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
}
