package test

import (
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// QueueSteer picks the transmit queue of a host's frames by destination
// port, so that they arrive on the receive queue of that number at the
// other end of the veth (a veth frame lands on the receive queue whose
// number is the sender's transmit queue). It is a TCX egress program on
// the sending interface that sets the frame's queue_mapping (the queue
// plus one: 0 means no preference) from a map of ports; frames to other
// ports are hashed as usual. Install it before the sender's sockets send:
// a connected socket keeps the queue it used first (and XPS, where set,
// wins over it).
type QueueSteer struct {
	prog  *ebpf.Program
	ports *ebpf.Map
	link  link.Link
}

// NewQueueSteer attaches the program to interface ifname of host h.
func NewQueueSteer(h *Host, ifname string) (*QueueSteer, error) {
	ports, err := ebpf.NewMap(&ebpf.MapSpec{Name: "steer_ports", Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 64})
	if err != nil {
		return nil, fmt.Errorf("queue steering map: %w", err)
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "steer_txq", Type: ebpf.SchedCLS, License: "GPL", Instructions: queueSteerInsns(ports.FD()),
	})
	if err != nil {
		ports.Close()
		return nil, fmt.Errorf("queue steering program: %w", err)
	}
	q := &QueueSteer{prog: prog, ports: ports}
	err = h.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		q.link, err = link.AttachTCX(link.TCXOptions{Interface: ifi.Index, Program: prog, Attach: ebpf.AttachTCXEgress})
		return err
	})
	if err != nil {
		q.Close()
		return nil, fmt.Errorf("attach queue steering to %s in host %s: %w", ifname, h.Name, err)
	}
	return q, nil
}

// Port sends the host's TCP and UDP frames to destination port through
// transmit queue queue.
func (q *QueueSteer) Port(port uint16, queue int) error {
	return q.ports.Put(portKey(port), uint32(queue+1))
}

// Spread spreads the host's TCP and UDP frames to destination port over
// transmit queues 0 to queues-1 by a hash of their source port, so that
// each connection keeps to one queue and a client's connections spread
// evenly, as a NIC's RSS hash spreads them (the test hosts' stand-in for
// RSS, for a cluster's port). Before, the queue was a bit of the port's
// high byte: a client's connections, whose ports come 2 apart, went to
// one queue, or split unevenly where they crossed a multiple of 256.
func (q *QueueSteer) Spread(port uint16, queues int) error {
	if queues < 1 || queues > 255 {
		return fmt.Errorf("spread over %d queues: from 1 to 255", queues)
	}
	return q.ports.Put(portKey(port), uint32(spreadBit|queues))
}

// portKey is port as the frame holds it, read little-endian: the map's
// key.
func portKey(port uint16) uint32 { return uint32(port>>8) | uint32(port&0xff)<<8 }

const spreadBit = 0x80000000 // a map value that spreads: the number of queues below it

// SpreadQueue is the transmit queue Spread over queues puts a frame from
// source port port on (the program's hash).
func SpreadQueue(port uint16, queues int) int {
	le := uint32(port>>8 | port<<8) // the port as the program reads it
	return int((le * 2654435761 >> 16) % uint32(queues))
}

// Close detaches the program.
func (q *QueueSteer) Close() error {
	var errs []error
	if q.link != nil {
		errs = append(errs, q.link.Close())
	}
	errs = append(errs, q.prog.Close(), q.ports.Close())
	return errors.Join(errs...)
}

// queueSteerInsns: an IPv4 TCP or UDP frame without IP options whose
// destination port is in the map gets the map's queue_mapping.
func queueSteerInsns(mapFD int) asm.Instructions {
	const (
		skbQueueMapping = 12 // offsetof(struct __sk_buff, queue_mapping)
		skbData         = 76
		skbDataEnd      = 80
		tcxNext         = -1
	)
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, skbData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, skbDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 38), // Ethernet 14, IPv4 20, ports 4
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half), // EtherType
		asm.JNE.Imm(asm.R5, 0x0008, "pass"),       // 0x0800, read little-endian
		asm.LoadMem(asm.R5, asm.R2, 14, asm.Byte), // version and IHL
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 23, asm.Byte), // protocol
		asm.JEq.Imm(asm.R5, 6, "port"),
		asm.JNE.Imm(asm.R5, 17, "pass"),
		asm.LoadMem(asm.R7, asm.R2, 34, asm.Half).WithSymbol("port"), // source port (for Spread)
		asm.LoadMem(asm.R5, asm.R2, 36, asm.Half),                    // destination port
		asm.StoreMem(asm.R10, -4, asm.R5, asm.Word),
		asm.LoadMapPtr(asm.R1, mapFD),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R5, asm.R0, 0, asm.Word),
		asm.JSet.Imm(asm.R5, int32(-spreadBit), "spread"),
		asm.StoreMem(asm.R6, skbQueueMapping, asm.R5, asm.Word),
		asm.Ja.Label("pass"),
		asm.And.Imm(asm.R5, 0xff).WithSymbol("spread"), // queues, at least 1
		// A multiplicative hash of the source port (Knuth's 2654435761,
		// its top 16 bits): a connect's ports come 2 apart, and the port
		// itself (read byte-swapped) put them on the same queue.
		asm.Mul.Imm32(asm.R7, -1640531535),
		asm.RSh.Imm32(asm.R7, 16),
		asm.Mod.Reg(asm.R7, asm.R5),
		asm.Add.Imm(asm.R7, 1),
		asm.StoreMem(asm.R6, skbQueueMapping, asm.R7, asm.Word),
		asm.Mov.Imm(asm.R0, tcxNext).WithSymbol("pass"),
		asm.Return(),
	}
}
