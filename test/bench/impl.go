package main

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/vnic"
	"github.com/xdp-onload/onload/xdp"
)

// bouncer is one AF_XDP ring library under test, seen from the ping and
// echo loops.
type bouncer interface {
	// send transmits a copy of frame.
	send(frame []byte) error
	// poll looks once for a received frame and returns its sequence number.
	poll() (seq uint64, ok bool)
	// echo looks once for received frames and sends each straight back,
	// addresses swapped in place; it returns how many.
	echo() int
	close() error
}

// seqOff is where the sequence number sits in the frame: the UDP payload.
const seqOff = 14 + 20 + 8

// swap turns a frame around: Ethernet, IPv4 and UDP source and destination
// exchange places. The IPv4 and UDP checksums stay valid: they are sums
// over both addresses.
func swap(f []byte) {
	var t [6]byte
	copy(t[:], f[0:6])
	copy(f[0:6], f[6:12])
	copy(f[6:12], t[:])
	copy(t[:4], f[26:30])
	copy(f[26:30], f[30:34])
	copy(f[30:34], t[:4])
	copy(t[:2], f[34:36])
	copy(f[34:36], f[36:38])
	copy(f[36:38], t[:2])
}

// steering attaches the steering program to iface and registers fd (the
// AF_XDP socket on queue 0) as stack 0, receiving proto on port.
type steering struct {
	s *bpf.Steering
	a *xdp.Attachment
}

func steer(iface string, proto bpf.Proto, port uint16, fd int) (*steering, error) {
	s, err := bpf.Load()
	if err != nil {
		return nil, err
	}
	a, err := xdp.Attach(s.Program(), iface, xdp.AttachNative)
	if err != nil {
		s.Close()
		return nil, err
	}
	st := &steering{s, a}
	if err := s.SetSocket(0, 0, fd); err != nil {
		st.close()
		return nil, err
	}
	l := bpf.Listener{Proto: proto, Port: port}
	if err := s.AddListener(l, 0); err != nil {
		st.close()
		return nil, err
	}
	// As a stack's listener: no look-up of the kernel's sockets once none
	// is found on the port (this process runs in the host's namespace).
	s.CheckKernelFlows(l, bpf.KernelFlowsGrace)
	return st, nil
}

func (s *steering) close() error { return errors.Join(s.a.Close(), s.s.Close()) }

// ours is this project's rings: vnic.XDP over xdp.Socket.
type ours struct {
	nic *vnic.XDP
	st  *steering
	hs  [64]vnic.Handle
}

func openOurs(iface string, port uint16) (bouncer, error) {
	nic, err := vnic.OpenXDP(vnic.XDPConfig{Interface: iface})
	if err != nil {
		return nil, err
	}
	st, err := steer(iface, bpf.UDP, port, nic.FD())
	if err != nil {
		nic.Close()
		return nil, err
	}
	return &ours{nic: nic, st: st}, nil
}

func (o *ours) send(frame []byte) error {
	p := o.nic.Pool()
	h := p.Alloc()
	if h == vnic.Null {
		return errors.New("pool empty")
	}
	copy(p.Buf(h), frame)
	p.SetLen(h, len(frame))
	o.hs[0] = h
	if n, err := o.nic.Transmit(o.hs[:1]); n != 1 {
		p.Free(h)
		return fmt.Errorf("transmit: %d, %v", n, err)
	}
	return nil
}

func (o *ours) poll() (uint64, bool) {
	if o.nic.Receive(o.hs[:1]) == 0 {
		return 0, false
	}
	p := o.nic.Pool()
	d := p.Data(o.hs[0])
	var seq uint64
	if len(d) >= seqOff+8 {
		seq = binary.BigEndian.Uint64(d[seqOff:])
	}
	p.Free(o.hs[0])
	return seq, true
}

func (o *ours) echo() int {
	n := o.nic.Receive(o.hs[:])
	if n == 0 {
		return 0
	}
	p := o.nic.Pool()
	for _, h := range o.hs[:n] {
		swap(p.Data(h))
	}
	sent, _ := o.nic.Transmit(o.hs[:n])
	for _, h := range o.hs[sent:n] {
		p.Free(h)
	}
	return n
}

func (o *ours) close() error { return errors.Join(o.st.close(), o.nic.Close()) }
