package stack

import (
	"net/netip"

	"github.com/xdp-onload/onload/bpf"
)

// SteeringFilters steers a stack's ports with the XDP steering program:
// every port the stack binds gets a listener entry naming the stack.
type SteeringFilters struct {
	Steering *bpf.Steering
	Stack    bpf.StackID
}

func bpfProto(p Proto) bpf.Proto {
	if p == TCP {
		return bpf.TCP
	}
	return bpf.UDP
}

// AddListener steers p traffic to local to the stack.
func (f SteeringFilters) AddListener(p Proto, local netip.AddrPort) error {
	return f.Steering.AddListener(bpf.Listener{Proto: bpfProto(p), Addr: local.Addr(), Port: local.Port()}, f.Stack)
}

// RemoveListener stops steering p traffic to local.
func (f SteeringFilters) RemoveListener(p Proto, local netip.AddrPort) error {
	return f.Steering.RemoveListener(bpf.Listener{Proto: bpfProto(p), Addr: local.Addr(), Port: local.Port()})
}

// PinFlow steers one connection's frames to the stack ahead of every
// listener entry and of the kernel's own sockets (a handover).
func (f SteeringFilters) PinFlow(p Proto, local, remote netip.AddrPort) error {
	return f.Steering.AddFlow(bpf.Flow{Proto: bpfProto(p), Local: local, Remote: remote}, f.Stack)
}

// UnpinFlow removes PinFlow's entry.
func (f SteeringFilters) UnpinFlow(p Proto, local, remote netip.AddrPort) error {
	return f.Steering.RemoveFlow(bpf.Flow{Proto: bpfProto(p), Local: local, Remote: remote})
}
