package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/internal/pkt"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/xdp"
)

// ports parses a comma-separated list of ports.
func ports(s string) ([]uint16, error) {
	var out []uint16
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := strconv.ParseUint(f, 10, 16)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("port %q: must be a number from 1 to 65535", f)
		}
		out = append(out, uint16(p))
	}
	return out, nil
}

func capture(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("capture", flag.ContinueOnError)
	iface := fs.String("iface", "", "interface to steer on (required)")
	queue := fs.Int("queue", 0, "receive queue to bind")
	addr := fs.String("addr", "", "local IPv4 address to match (default: every address)")
	udp := fs.String("udp", "", "UDP ports to steer, comma-separated")
	tcp := fs.String("tcp", "", "TCP ports to steer, comma-separated")
	duration := fs.Duration("duration", 0, "stop after this long (default: until interrupted)")
	count := fs.Int("count", 0, "stop after this many frames (default: no limit)")
	mode := fs.String("mode", "auto", "XDP attach mode: auto, native or generic")
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *iface == "" {
		return errors.New("capture: -iface is required (see `ip link`)")
	}
	var local netip.Addr
	if *addr != "" {
		a, err := netip.ParseAddr(*addr)
		if err != nil || !a.Is4() {
			return fmt.Errorf("capture: -addr %q: want an IPv4 address", *addr)
		}
		local = a
	}
	var listeners []bpf.Listener
	var what []string
	for _, pp := range []struct {
		proto bpf.Proto
		list  string
	}{{bpf.UDP, *udp}, {bpf.TCP, *tcp}} {
		ps, err := ports(pp.list)
		if err != nil {
			return fmt.Errorf("capture: -%s: %w", pp.proto, err)
		}
		for _, p := range ps {
			listeners = append(listeners, bpf.Listener{Proto: pp.proto, Addr: local, Port: p})
			what = append(what, fmt.Sprintf("%s/%d", pp.proto, p))
		}
	}
	if len(listeners) == 0 {
		return errors.New("capture: nothing to steer: give -udp and/or -tcp ports")
	}
	attachMode := map[string]xdp.AttachMode{"auto": xdp.AttachAuto, "native": xdp.AttachNative, "generic": xdp.AttachGeneric}
	am, ok := attachMode[*mode]
	if !ok {
		return fmt.Errorf("capture: -mode %q: want auto, native or generic", *mode)
	}

	steering, err := bpf.Load()
	if err != nil {
		return err
	}
	defer steering.Close()
	att, err := xdp.Attach(steering.Program(), *iface, am)
	if err != nil {
		return err
	}
	defer att.Close()
	nic, err := vnic.OpenXDP(vnic.XDPConfig{Interface: *iface, Queue: *queue, FrameCount: 1024, RingSize: 512, FillDepth: 512})
	if err != nil {
		return err
	}
	defer nic.Close()
	const stack = 0
	if err := steering.SetSocket(stack, *queue, nic.FD()); err != nil {
		return err
	}
	for _, l := range listeners {
		if err := steering.AddListener(l, stack); err != nil {
			return err
		}
	}
	where := "every local address"
	if local.IsValid() {
		where = local.String()
	}
	fmt.Fprintf(out, "capture: steering %s to %s on %s (%s XDP, %s); ^C to stop\n",
		strings.Join(what, " "), where, nic.Info().Name, att.Mode, nic.Info().Mode)
	if att.NativeErr != nil {
		fmt.Fprintf(out, "capture: native XDP refused (%v); using generic mode\n", att.NativeErr)
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	var deadline time.Time
	if *duration > 0 {
		deadline = time.Now().Add(*duration)
	}
	hs := make([]vnic.Handle, 32)
	seen := 0
loop:
	for *count == 0 || seen < *count {
		select {
		case <-stop:
			break loop
		default:
		}
		if !deadline.IsZero() && time.Now().After(deadline) {
			break
		}
		n := nic.Receive(hs)
		if n == 0 {
			if err := nic.Socket().Wait(50 * time.Millisecond); err != nil {
				return err
			}
			continue
		}
		for _, h := range hs[:n] {
			fmt.Fprintln(out, describe(nic.Pool().Data(h)))
			nic.Pool().Free(h)
			seen++
		}
	}
	c, err := steering.Counters()
	if err != nil {
		return err
	}
	st := nic.Stats()
	fmt.Fprintf(out, "capture: %d frames in the AF_XDP socket (dropped by the kernel: %d)\n", seen, st.RxDropped)
	fmt.Fprintf(out, "capture: steering counters: %s\n", c)
	return nil
}

// describe prints one frame on one line: the headers, then up to 40 bytes
// of payload, quoted.
func describe(b []byte) string {
	f, err := pkt.Parse(b)
	if err != nil {
		return fmt.Sprintf("%d-byte frame that does not parse: %v", len(b), err)
	}
	s := f.String()
	if len(f.Payload) > 0 {
		p := f.Payload
		more := ""
		if len(p) > 40 {
			p, more = p[:40], "..."
		}
		s += fmt.Sprintf(" %q%s", p, more)
	}
	return s
}
