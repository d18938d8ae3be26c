package main

// The public API benchmark: what a Go programmer sees. A client in host a
// talks to one kernel server in host b through three socket libraries in
// turn: package sockets (this project), the standard net package (the
// kernel's TCP), and gVisor's netstack over AF_XDP with its gonet adapter
// (what a Go user would pick instead). The server is the same for all:
// the kernel's TCP driven by a busy-polling loop of raw system calls, the
// fastest peer the kernel offers, so that the client's side is what
// differs.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	xdplink "gvisor.dev/gvisor/pkg/tcpip/link/xdp"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	gstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/sockets"
	"github.com/xdp-onload/onload/xdp"
)

const (
	apiEchoPort = 7200
	apiSinkPort = 7201
	apiMsg      = 64
)

// bulkResult is a bulk transfer's outcome.
type bulkResult struct {
	Bytes   int64   `json:"bytes"`
	Seconds float64 `json:"seconds"`
}

// apiServerMain is the far side: an echo on apiEchoPort and a sink on
// apiSinkPort (it reads to the end of the stream, then answers with the
// byte count), each connection served by a busy-polling loop of raw
// read and write calls on a locked thread.
func apiServerMain(args []string) error {
	fs := flag.NewFlagSet("api-server", flag.ExitOnError)
	addr := fs.String("addr", "198.18.0.2", "address to listen on")
	limit := fs.Duration("limit", 2*time.Minute, "exit after this long whatever happens")
	fs.Parse(args)
	echo, err := net.Listen("tcp", net.JoinHostPort(*addr, fmt.Sprint(apiEchoPort)))
	if err != nil {
		return err
	}
	sink, err := net.Listen("tcp", net.JoinHostPort(*addr, fmt.Sprint(apiSinkPort)))
	if err != nil {
		return err
	}
	serve := func(ln net.Listener, fn func(fd int) error) {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				runtime.LockOSThread()
				defer c.Close()
				raw, _ := c.(*net.TCPConn).SyscallConn()
				raw.Control(func(fd uintptr) {
					if err := fn(int(fd)); err != nil {
						fmt.Fprintln(os.Stderr, "api-server:", err)
					}
				})
			}()
		}
	}
	go serve(echo, echoLoop)
	go serve(sink, sinkLoop)
	fmt.Println("ready")
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-stop:
	case <-time.After(*limit):
	}
	return nil
}

// echoLoop echoes on a non-blocking socket, spinning on EAGAIN.
func echoLoop(fd int) error {
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return err
		}
		for off := 0; off < n; {
			m, err := unix.Write(fd, buf[off:n])
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil {
				return err
			}
			off += m
		}
	}
}

// sinkLoop reads to the end of the stream and answers with the count.
func sinkLoop(fd int) error {
	buf := make([]byte, 1<<20)
	var total uint64
	for {
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			break
		}
		total += uint64(n)
	}
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], total)
	for {
		_, err := unix.Write(fd, b[:])
		if err != unix.EAGAIN && err != unix.EINTR {
			return err
		}
	}
}

// apiClientMain is the near side: it dials the server through one library
// and either times 64-byte request/response round trips (Write, then
// ReadFull) or pushes bytes for a while and reads the sink's count.
func apiClientMain(args []string) error {
	fs := flag.NewFlagSet("api-client", flag.ExitOnError)
	impl := fs.String("impl", "sockets", "sockets, net or gonet")
	mode := fs.String("mode", "pingpong", "pingpong or bulk")
	dst := fs.String("dst", "198.18.0.2", "server address")
	count := fs.Int("count", 10000, "round trips to time (pingpong)")
	warmup := fs.Int("warmup", 1000, "round trips before timing")
	seconds := fs.Float64("seconds", 2, "how long to push (bulk)")
	iface := fs.String("iface", "", "gonet: the interface")
	addr := fs.String("addr", "", "gonet: our address and prefix")
	dstMAC := fs.String("dst-mac", "", "gonet: the server's Ethernet address (netstack's ARP does not pass the steering program)")
	echoPort := fs.Int("port", apiEchoPort, "the server's echo port; its sink is the next one")
	fs.Parse(args)
	if *echoPort < 1 || *echoPort > 65534 {
		return fmt.Errorf("-port %d: must be from 1 to 65534", *echoPort)
	}
	if *mode != "pingpong" && *mode != "bulk" {
		return fmt.Errorf("-mode %q: want pingpong or bulk", *mode)
	}
	port := *echoPort
	if *mode == "bulk" {
		port++
	}
	target := net.JoinHostPort(*dst, fmt.Sprint(port))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var c net.Conn
	var err error
	switch *impl {
	case "sockets":
		c, err = sockets.DialTimeout("tcp", target, 10*time.Second)
		if err == nil {
			if _, ok := c.(*sockets.TCPConn); !ok {
				err = fmt.Errorf("sockets.Dial fell back to the kernel (%T): is ONLOAD_INTERFACE right?", c)
			}
		}
	case "net":
		c, err = net.DialTimeout("tcp", target, 10*time.Second)
	case "gonet":
		c, err = gonetDial(ctx, *iface, *addr, *dstMAC, target)
	default:
		return fmt.Errorf("unknown -impl %q: want sockets, net or gonet", *impl)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	if *mode == "bulk" {
		res, err := bulk(c, time.Duration(*seconds*float64(time.Second)))
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	res, err := pingPong(c, *warmup, *count)
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

func pingPong(c net.Conn, warmup, count int) (*pingResult, error) {
	msg := make([]byte, apiMsg)
	buf := make([]byte, apiMsg)
	res := &pingResult{RTTs: make([]float64, 0, count)}
	for i := 0; i < warmup+count; i++ {
		start := time.Now()
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
		if i >= warmup {
			res.RTTs = append(res.RTTs, float64(time.Since(start).Nanoseconds())/1e3)
		}
	}
	slices.Sort(res.RTTs)
	return res, nil
}

func bulk(c net.Conn, d time.Duration) (bulkResult, error) {
	buf := make([]byte, 256<<10)
	start := time.Now()
	c.SetDeadline(start.Add(d + 10*time.Second))
	var sent int64
	for time.Since(start) < d {
		n, err := c.Write(buf)
		sent += int64(n)
		if err != nil {
			return bulkResult{}, fmt.Errorf("write after %d bytes: %w", sent, err)
		}
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return bulkResult{}, fmt.Errorf("close write: %w", err)
	}
	var b [8]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return bulkResult{}, fmt.Errorf("reading the count after %d bytes: %w", sent, err)
	}
	res := bulkResult{Bytes: int64(binary.BigEndian.Uint64(b[:])), Seconds: time.Since(start).Seconds()}
	if res.Bytes != sent {
		return res, fmt.Errorf("sent %d bytes, the server counted %d", sent, res.Bytes)
	}
	return res, nil
}

// gonetKeep holds what gonetDial set up for the life of the process.
var gonetKeep []any

// gonetDial brings up gVisor's netstack on iface over gVisor's own AF_XDP
// link endpoint (its UMEM, its rings, its dispatch goroutine blocked in
// poll), steered by our XDP program to the port it dials from, and dials
// through its gonet adapter.
func gonetDial(ctx context.Context, iface, addr, dstMAC, target string) (net.Conn, error) {
	prefix, err := netip.ParsePrefix(addr)
	if err != nil {
		return nil, fmt.Errorf("-addr: %w", err)
	}
	mac, err := net.ParseMAC(dstMAC)
	if err != nil {
		return nil, fmt.Errorf("-dst-mac: %w", err)
	}
	raddr, err := netip.ParseAddrPort(target)
	if err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("AF_XDP socket: %w", err)
	}
	ep, err := xdplink.New(&xdplink.Options{
		FD: fd, Address: tcpip.LinkAddress(ifi.HardwareAddr), InterfaceIndex: ifi.Index, Bind: true,
	})
	if err != nil {
		return nil, fmt.Errorf("gvisor xdp endpoint: %w", err)
	}
	steer, err := bpf.Load()
	if err != nil {
		return nil, err
	}
	// Held for the life of the process: an attachment the collector
	// finalizes detaches the program, and the kernel then answers the
	// connection's segments with resets.
	att, err := xdp.Attach(steer.Program(), iface, xdp.AttachNative)
	if err != nil {
		return nil, err
	}
	gonetKeep = append(gonetKeep, att, steer)
	const localPort = 47000
	if err := steer.SetSocket(0, 0, fd); err != nil {
		return nil, err
	}
	if err := steer.AddListener(bpf.Listener{Proto: bpf.TCP, Addr: prefix.Addr(), Port: localPort}, 0); err != nil {
		return nil, err
	}
	s := gstack.New(gstack.Options{
		NetworkProtocols:   []gstack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []gstack.TransportProtocolFactory{tcp.NewProtocol},
	})
	if err := s.CreateNIC(1, ep); err != nil {
		return nil, fmt.Errorf("gvisor: create nic: %s", err)
	}
	me := tcpip.AddrFrom4(prefix.Addr().As4())
	if err := s.AddProtocolAddress(1, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: me, PrefixLen: prefix.Bits()},
	}, gstack.AddressProperties{}); err != nil {
		return nil, fmt.Errorf("gvisor: add address: %s", err)
	}
	subnet, _ := tcpip.NewSubnet(tcpip.AddrFrom4(prefix.Masked().Addr().As4()), tcpip.MaskFromBytes(net.CIDRMask(prefix.Bits(), 32)))
	s.SetRouteTable([]tcpip.Route{{Destination: subnet, NIC: 1}})
	dst := tcpip.AddrFrom4(raddr.Addr().As4())
	if err := s.AddStaticNeighbor(1, ipv4.ProtocolNumber, dst, tcpip.LinkAddress(mac)); err != nil {
		return nil, fmt.Errorf("gvisor: neighbour: %s", err)
	}
	c, err := gonet.DialTCPWithBind(ctx, s,
		tcpip.FullAddress{NIC: 1, Addr: me, Port: localPort},
		tcpip.FullAddress{NIC: 1, Addr: dst, Port: raddr.Port()}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, errors.New("gonet dial: " + err.Error())
	}
	return c, nil // netstack sends without Nagle by default, as net and sockets do
}
