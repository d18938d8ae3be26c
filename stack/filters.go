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

// listener is the steering's entry for p traffic to local.
func listener(p Proto, local netip.AddrPort) bpf.Listener {
	return bpf.Listener{Proto: bpfProto(p), Addr: local.Addr(), Port: local.Port()}
}

// flow is the steering's entry for one connection's p traffic.
func flow(p Proto, local, remote netip.AddrPort) bpf.Flow {
	return bpf.Flow{Proto: bpfProto(p), Local: local, Remote: remote}
}

// AddListener steers p traffic to local to the stack.
func (f SteeringFilters) AddListener(p Proto, local netip.AddrPort) error {
	return f.Steering.AddListener(listener(p, local), f.Stack)
}

// CheckKernelFlows lets the steering program stop looking the listening
// port's segments up in the kernel's tables once the kernel is found to
// have no connection on it (bpf.Steering.CheckKernelFlows, in the
// calling thread's network namespace, the interface's).
func (f SteeringFilters) CheckKernelFlows(p Proto, local netip.AddrPort) {
	f.Steering.CheckKernelFlows(listener(p, local), bpf.KernelFlowsGrace)
}

// RemoveListener stops steering p traffic to local.
func (f SteeringFilters) RemoveListener(p Proto, local netip.AddrPort) error {
	return f.Steering.RemoveListener(listener(p, local))
}

// SteerFlow steers one connection's frames to the stack by a flow entry
// of its own (FlowSteerer).
func (f SteeringFilters) SteerFlow(p Proto, local, remote netip.AddrPort) error {
	return f.Steering.AddFlow(flow(p, local, remote), f.Stack)
}

// UnsteerFlow removes SteerFlow's entry.
func (f SteeringFilters) UnsteerFlow(p Proto, local, remote netip.AddrPort) error {
	return f.Steering.RemoveFlow(flow(p, local, remote))
}

// PinFlow steers one connection's frames to the stack ahead of every
// listener entry and of the kernel's own sockets (a handover).
func (f SteeringFilters) PinFlow(p Proto, local, remote netip.AddrPort) error {
	return f.Steering.AddFlow(flow(p, local, remote), f.Stack)
}

// UnpinFlow removes PinFlow's entry. The connection may be the kernel's
// now (a handover), on a port a listener entry steers: the steering
// program looks listener ports' segments up in the kernel's tables from
// then on.
func (f SteeringFilters) UnpinFlow(p Proto, local, remote netip.AddrPort) error {
	if err := f.Steering.MarkKernelFlows(); err != nil {
		return err
	}
	return f.Steering.RemoveFlow(flow(p, local, remote))
}
