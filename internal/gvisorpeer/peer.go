// Package gvisorpeer runs gVisor's netstack over a vnic.NIC, as an
// independent TCP/IP implementation to test our stack against in-process
// (over the in-memory NIC pair), deterministically and without root.
package gvisorpeer

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/xdp-onload/onload/vnic"
)

const nicID = 1

// Peer is a gVisor netstack whose only interface is a vnic.NIC.
type Peer struct {
	Stack *stack.Stack
	Addr  netip.Addr
	ep    *channel.Endpoint
	nic   vnic.NIC
	mu    sync.Mutex // serialises Pump
	hs    []vnic.Handle
	stop  chan struct{}
	done  chan struct{}
}

// New starts a netstack with address addr on nic. neighbours are static
// ARP entries (the in-memory wire carries no ARP).
func New(nic vnic.NIC, addr netip.Prefix, neighbours map[netip.Addr]net.HardwareAddr) (*Peer, error) {
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	info := nic.Info()
	ep := channel.New(1024, uint32(info.MTU), tcpip.LinkAddress(info.MAC))
	if err := s.CreateNIC(nicID, ethernet.New(ep)); err != nil {
		return nil, fmt.Errorf("gvisor: create nic: %s", err)
	}
	a := tcpip.AddrFrom4(addr.Addr().As4())
	if err := s.AddProtocolAddress(nicID, tcpip.ProtocolAddress{
		Protocol:          ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: a, PrefixLen: addr.Bits()},
	}, stack.AddressProperties{}); err != nil {
		return nil, fmt.Errorf("gvisor: add address: %s", err)
	}
	subnet, _ := tcpip.NewSubnet(tcpip.AddrFrom4(addr.Masked().Addr().As4()), tcpip.MaskFromBytes(net.CIDRMask(addr.Bits(), 32)))
	s.SetRouteTable([]tcpip.Route{{Destination: subnet, NIC: nicID}})
	for ip, mac := range neighbours {
		if err := s.AddStaticNeighbor(nicID, ipv4.ProtocolNumber, tcpip.AddrFrom4(ip.As4()), tcpip.LinkAddress(mac)); err != nil {
			return nil, fmt.Errorf("gvisor: add neighbour %v: %s", ip, err)
		}
	}
	return &Peer{Stack: s, Addr: addr.Addr(), ep: ep, nic: nic, hs: make([]vnic.Handle, 64)}, nil
}

// Pump moves frames once in each direction: from the NIC into netstack
// and from netstack onto the NIC. It returns how many it moved.
func (p *Peer) Pump() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	moved := 0
	pool := p.nic.Pool()
	n := p.nic.Receive(p.hs)
	for _, h := range p.hs[:n] {
		data := append([]byte(nil), pool.Data(h)...)
		pool.Free(h)
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(data)})
		p.ep.InjectInbound(header.IPv4ProtocolNumber, pkt)
		pkt.DecRef()
		moved++
	}
	for range 64 {
		pkt := p.ep.Read()
		if pkt == nil {
			break
		}
		view := pkt.ToView()
		h := pool.Alloc()
		if h != vnic.Null {
			m := copy(pool.Buf(h), view.AsSlice())
			pool.SetLen(h, m)
			p.hs[0] = h
			if k, _ := p.nic.Transmit(p.hs[:1]); k != 1 {
				pool.Free(h)
			}
		}
		view.Release()
		pkt.DecRef()
		moved++
	}
	return moved
}

// Run pumps in a goroutine until Close.
func (p *Peer) Run() {
	p.stop, p.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			if p.Pump() == 0 {
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
}

// Close stops the pump and netstack.
func (p *Peer) Close() {
	if p.stop != nil {
		close(p.stop)
		<-p.done
		p.stop = nil
	}
	p.Stack.Close()
	p.Stack.Wait()
}

// DialUDP opens a netstack UDP socket bound to local (port 0: any) and
// connected to remote.
func (p *Peer) DialUDP(local, remote netip.AddrPort) (*gonet.UDPConn, error) {
	var la, ra *tcpip.FullAddress
	if local.IsValid() {
		la = &tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(local.Addr().As4()), Port: local.Port()}
	}
	if remote.IsValid() {
		ra = &tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(remote.Addr().As4()), Port: remote.Port()}
	}
	c, err := gonet.DialUDP(p.Stack, la, ra, ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("gvisor: udp: %w", err)
	}
	return c, nil
}

// DialTCP connects from netstack to remote.
func (p *Peer) DialTCP(ctx context.Context, remote netip.AddrPort) (*gonet.TCPConn, error) {
	c, err := gonet.DialContextTCP(ctx, p.Stack, tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(remote.Addr().As4()), Port: remote.Port()}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("gvisor: dial %v: %w", remote, err)
	}
	return c, nil
}

// ListenTCP listens on netstack's address at port.
func (p *Peer) ListenTCP(port uint16) (*gonet.TCPListener, error) {
	l, err := gonet.ListenTCP(p.Stack, tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(p.Addr.As4()), Port: port}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("gvisor: listen on %d: %w", port, err)
	}
	return l, nil
}
