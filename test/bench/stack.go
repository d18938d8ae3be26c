package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"syscall"
	"time"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/stack"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/xdp"
)

const tcpBenchPort = 7100

// ourStack brings our stack up on iface: the steering program, an XDP NIC
// and a stack that resolves neighbours through the kernel.
func ourStack(iface string, addr netip.Prefix) (*stack.Stack, func(), error) {
	cfg, err := stack.KernelConfig(iface)
	if err != nil {
		return nil, nil, err
	}
	if cfg.Addr != addr {
		return nil, nil, fmt.Errorf("interface %s has %v, not %v", iface, cfg.Addr, addr)
	}
	nic, err := vnic.OpenXDP(vnic.XDPConfig{Interface: iface})
	if err != nil {
		return nil, nil, err
	}
	st, err := bpf.Load()
	if err != nil {
		nic.Close()
		return nil, nil, err
	}
	att, err := xdp.Attach(st.Program(), iface, xdp.AttachNative)
	if err != nil {
		st.Close()
		nic.Close()
		return nil, nil, err
	}
	cleanup := func() { att.Close(); st.Close(); nic.Close() }
	if err := st.SetSocket(0, 0, nic.FD()); err != nil {
		cleanup()
		return nil, nil, err
	}
	kn, err := stack.NewKernelNeighbours(iface)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	s, err := stack.New(nic, cfg, stack.Options{
		Filters:  stack.SteeringFilters{Steering: st, Stack: 0},
		Resolver: kn,
	})
	if err != nil {
		kn.Close()
		cleanup()
		return nil, nil, err
	}
	return s, func() { s.Destroy(); kn.Close(); cleanup() }, nil
}

// stackEchoMain serves TCP echo on our stack, busy-polling, until signalled.
func stackEchoMain(args []string) error {
	fs := flag.NewFlagSet("stack-echo", flag.ExitOnError)
	iface := fs.String("iface", "eth0", "interface")
	addr := fs.String("addr", "198.18.0.2/24", "our address and prefix")
	limit := fs.Duration("limit", time.Minute, "exit after this long whatever happens")
	fs.Parse(args)
	prefix, err := netip.ParsePrefix(*addr)
	if err != nil {
		return err
	}
	s, done, err := ourStack(*iface, prefix)
	if err != nil {
		return err
	}
	defer done()
	l, _ := s.Open(stack.TCP)
	if err := s.Bind(l, netip.AddrPortFrom(netip.Addr{}, tcpBenchPort)); err != nil {
		return err
	}
	if err := s.Listen(l, 16); err != nil {
		return err
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fmt.Println("ready")
	var conns []stack.SockID
	buf := make([]byte, 64<<10)
	deadline := time.Now().Add(*limit)
	for i := 0; ; i++ {
		// Recv polls the stack when its socket has nothing queued; with no
		// connection yet, poll here.
		if len(conns) == 0 {
			s.Poll()
		}
		if len(conns) == 0 || i&1023 == 0 {
			if c, err := s.Accept(l); err == nil {
				s.SetOption(c, stack.NoDelay, 1)
				conns = append(conns, c)
			}
		}
		for _, c := range conns {
			n, err := s.Recv(c, buf, false)
			if n > 0 {
				s.Send(c, buf[:n])
			} else if err == nil {
				s.Close(c)
				conns = slices.DeleteFunc(conns, func(x stack.SockID) bool { return x == c })
				break
			}
		}
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

// stackPingMain connects to the echo and times 64-byte round trips through
// our stack on both ends, busy-polling.
func stackPingMain(args []string) error {
	fs := flag.NewFlagSet("stack-ping", flag.ExitOnError)
	iface := fs.String("iface", "eth0", "interface")
	addr := fs.String("addr", "198.18.0.1/24", "our address and prefix")
	dst := fs.String("dst", "198.18.0.2", "echo's address")
	count := fs.Int("count", 100000, "round trips to measure")
	warmup := fs.Int("warmup", 5000, "round trips before measuring")
	limit := fs.Duration("limit", 30*time.Second, "give up after this long")
	profile := fs.String("cpuprofile", "", "write a CPU profile here")
	fs.Parse(args)
	prefix, err := netip.ParsePrefix(*addr)
	if err != nil {
		return err
	}
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	dstAddr, err := netip.ParseAddr(*dst)
	if err != nil {
		return err
	}
	s, done, err := ourStack(*iface, prefix)
	if err != nil {
		return err
	}
	defer done()
	c, _ := s.Open(stack.TCP)
	s.SetOption(c, stack.NoDelay, 1)
	if err := s.Connect(c, netip.AddrPortFrom(dstAddr, tcpBenchPort)); !errors.Is(err, stack.ErrInProgress) {
		return err
	}
	deadline := time.Now().Add(*limit)
	for s.Events(c)&(stack.Writable|stack.Error) == 0 {
		s.Poll()
		if time.Now().After(deadline) {
			return fmt.Errorf("connect: %s", s.DumpSocket(c))
		}
	}
	if err := s.SockError(c); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	msg := make([]byte, 64)
	buf := make([]byte, 4096)
	res := pingResult{RTTs: make([]float64, 0, *count)}
	for i := 0; len(res.RTTs) < *count; i++ {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d round trips in %v", len(res.RTTs), *count, *limit)
		}
		start := time.Now()
		if n, err := s.Send(c, msg); n != len(msg) {
			return fmt.Errorf("send: %d, %v", n, err)
		}
		for got, spins := 0, 0; got < len(msg); spins++ {
			n, err := s.Recv(c, buf, false) // polls the stack when nothing is queued
			if err != nil && !errors.Is(err, stack.ErrWouldBlock) {
				return fmt.Errorf("recv: %w", err)
			}
			got += n
			if n == 0 && spins&4095 == 4095 && time.Since(start) > time.Second {
				return fmt.Errorf("round trip %d: no reply in 1s: %s", i, s.DumpSocket(c))
			}
		}
		if i >= *warmup {
			res.RTTs = append(res.RTTs, float64(time.Since(start).Nanoseconds())/1e3)
		}
	}
	cs := s.Counters()
	fmt.Fprintf(os.Stderr, "stack-ping counters: %s\n", &cs)
	s.Close(c)
	for range 1000 {
		s.Poll()
	}
	slices.Sort(res.RTTs)
	return json.NewEncoder(os.Stdout).Encode(res)
}
