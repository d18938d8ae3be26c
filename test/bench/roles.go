package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/internal/pkt"
)

const benchPort = 7000

func openImpl(name, iface string) (bouncer, error) {
	switch name {
	case "ours":
		return openOurs(iface, benchPort)
	case "asavie":
		return openAsavie(iface, benchPort)
	}
	return nil, fmt.Errorf("unknown implementation %q: want ours or asavie", name)
}

// echoMain runs in the far host: it bounces every frame back until it is
// signalled or its time is up.
func echoMain(args []string) error {
	fs := flag.NewFlagSet("echo", flag.ExitOnError)
	impl := fs.String("impl", "ours", "ring library: ours or asavie")
	iface := fs.String("iface", "eth0", "interface")
	limit := fs.Duration("limit", time.Minute, "exit after this long whatever happens")
	fs.Parse(args)
	b, err := openImpl(*impl, *iface)
	if err != nil {
		return err
	}
	defer b.close()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("ready")
	deadline := time.Now().Add(*limit)
	for i := 0; ; i++ {
		b.echo()
		if i&0xffff == 0 {
			select {
			case <-stop:
				return nil
			default:
			}
			if time.Now().After(deadline) {
				return nil
			}
		}
	}
}

// pingResult is what a ping process reports on stdout.
type pingResult struct {
	RTTs []float64 `json:"rtts_us"` // sorted
	Lost int       `json:"lost"`
}

// pingMain runs in the near host: it sends a frame, spins until the echo
// comes back, and records the round trip, count times after warmup.
func pingMain(args []string) error {
	fs := flag.NewFlagSet("ping", flag.ExitOnError)
	impl := fs.String("impl", "ours", "ring library: ours or asavie")
	iface := fs.String("iface", "eth0", "interface")
	src := fs.String("src", "198.18.0.1", "our address")
	dst := fs.String("dst", "198.18.0.2", "echo's address")
	dstMAC := fs.String("dst-mac", "", "echo's MAC address")
	count := fs.Int("count", 100000, "round trips to measure")
	warmup := fs.Int("warmup", 5000, "round trips before measuring")
	limit := fs.Duration("limit", 30*time.Second, "give up after this long")
	fs.Parse(args)

	ifi, err := net.InterfaceByName(*iface)
	if err != nil {
		return err
	}
	mac, err := net.ParseMAC(*dstMAC)
	if err != nil {
		return fmt.Errorf("-dst-mac: %w", err)
	}
	srcAddr, err := netip.ParseAddr(*src)
	if err != nil {
		return err
	}
	dstAddr, err := netip.ParseAddr(*dst)
	if err != nil {
		return err
	}
	frame := make([]byte, 64)
	if _, err := pkt.UDP(frame,
		pkt.Endpoint{MAC: ifi.HardwareAddr, Addr: netip.AddrPortFrom(srcAddr, benchPort)},
		pkt.Endpoint{MAC: mac, Addr: netip.AddrPortFrom(dstAddr, benchPort)},
		make([]byte, 64-pkt.UDPLen(0))); err != nil {
		return err
	}
	// The UDP checksum covers the payload, which changes: send with no
	// checksum (allowed for UDP over IPv4).
	binary.BigEndian.PutUint16(frame[14+20+6:], 0)

	b, err := openImpl(*impl, *iface)
	if err != nil {
		return err
	}
	defer b.close()

	res := pingResult{RTTs: make([]float64, 0, *count)}
	deadline := time.Now().Add(*limit)
	for seq := uint64(1); len(res.RTTs) < *count; seq++ {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d round trips in %v (%d lost)", len(res.RTTs), *count, *limit, res.Lost)
		}
		binary.BigEndian.PutUint64(frame[seqOff:], seq)
		start := time.Now()
		if err := b.send(frame); err != nil {
			return err
		}
		for spins := 0; ; spins++ {
			got, ok := b.poll()
			if ok && got == seq {
				if seq > uint64(*warmup) {
					res.RTTs = append(res.RTTs, float64(time.Since(start).Nanoseconds())/1e3)
				}
				break
			}
			if spins&1023 == 0 && time.Since(start) > 100*time.Millisecond {
				res.Lost++
				break
			}
		}
	}
	slices.Sort(res.RTTs)
	if res.Lost > *count/100 {
		return errors.New("more than 1% of the frames were lost")
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
