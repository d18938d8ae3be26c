package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	axdp "github.com/asavie/xdp"

	"github.com/xdp-onload/onload/bpf"
)

// asavie is github.com/asavie/xdp's socket with its default options, fed by
// our steering program (the same program for both libraries, so only the
// rings differ).
type asavie struct {
	xsk *axdp.Socket
	st  *steering
}

func openAsavie(iface string, port uint16) (bouncer, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	xsk, err := axdp.NewSocket(ifi.Index, 0, nil)
	if err != nil {
		return nil, err
	}
	st, err := steer(iface, bpf.UDP, port, xsk.FD())
	if err != nil {
		xsk.Close()
		return nil, err
	}
	a := &asavie{xsk: xsk, st: st}
	xsk.Fill(xsk.GetDescs(xsk.NumFreeFillSlots()))
	return a, nil
}

func (a *asavie) reclaim() {
	if n := a.xsk.NumCompleted(); n > 0 {
		a.xsk.Complete(n)
	}
}

func (a *asavie) send(frame []byte) error {
	a.reclaim()
	descs := a.xsk.GetDescs(1)
	if len(descs) == 0 {
		return errors.New("no free descriptors")
	}
	copy(a.xsk.GetFrame(descs[0]), frame)
	descs[0].Len = uint32(len(frame))
	if n := a.xsk.Transmit(descs); n != 1 {
		return fmt.Errorf("transmit: %d", n)
	}
	return nil
}

func (a *asavie) poll() (uint64, bool) {
	if a.xsk.NumReceived() == 0 {
		return 0, false
	}
	rx := a.xsk.Receive(1)
	f := a.xsk.GetFrame(rx[0])
	var seq uint64
	if len(f) >= seqOff+8 {
		seq = binary.BigEndian.Uint64(f[seqOff:])
	}
	a.xsk.Fill(rx)
	return seq, true
}

func (a *asavie) echo() int {
	a.reclaim()
	if free := a.xsk.NumFreeFillSlots(); free > 0 {
		a.xsk.Fill(a.xsk.GetDescs(free))
	}
	n := a.xsk.NumReceived()
	if n == 0 {
		return 0
	}
	rx := a.xsk.Receive(n)
	for _, d := range rx {
		swap(a.xsk.GetFrame(d))
	}
	a.xsk.Transmit(rx)
	return len(rx)
}

func (a *asavie) close() error { return errors.Join(a.st.close(), a.xsk.Close()) }
