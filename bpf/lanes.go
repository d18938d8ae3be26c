package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Lanes (steer.c): more receive rings of a stack on one queue, AF_XDP
// sockets sharing its UMEM and fill ring (xdp.OpenLane), each in slot
// stack × MaxLanes + lane of lane_xsks. A flow's frames go to the lane
// its hash bucket names (SetLane), if that lane has a socket on the
// queue they arrive on, and to the stack's own socket otherwise. Lane 0
// is the stack's own socket.
const (
	MaxLanes    = 16
	LaneBuckets = 1024
)

// LaneBucket is flow f's bucket, as the program computes it (lane_hash):
// flows in one bucket share its lane.
func LaneBucket(f Flow) (uint32, error) {
	k, err := flowKey(f)
	if err != nil {
		return 0, err
	}
	return laneHash(k), nil
}

func laneHash(k steerFlowKey) uint32 {
	h := k.RemoteAddr * 0x9E3779B1
	h ^= k.LocalAddr * 0x85EBCA77
	h ^= (uint32(k.RemotePort)<<16 | uint32(k.LocalPort)) * 0xC2B2AE3D
	return (h ^ h>>15) & (LaneBuckets - 1)
}

func laneSlot(id StackID, lane int) (uint32, error) {
	if err := checkStack(id); err != nil {
		return 0, err
	}
	if lane < 1 || lane >= MaxLanes {
		return 0, fmt.Errorf("lane %d out of range: must be from 1 to %d", lane, MaxLanes-1)
	}
	return uint32(id)*MaxLanes + uint32(lane), nil
}

// SetLaneSocket makes the AF_XDP socket fd (a lane of stack id's socket,
// xdp.OpenLane) the one that receives the frames of the flows SetLane
// puts in lane.
func (s *Steering) SetLaneSocket(id StackID, lane int, fd int) error {
	k, err := laneSlot(id, lane)
	if err != nil {
		return err
	}
	if err := s.objs.LaneXsks.Put(k, uint32(fd)); err != nil {
		return fmt.Errorf("register lane %d of stack %d: %w", lane, id, err)
	}
	return nil
}

// ClearLaneSocket removes lane's socket: its flows go to the stack's own
// socket again.
func (s *Steering) ClearLaneSocket(id StackID, lane int) error {
	k, err := laneSlot(id, lane)
	if err != nil {
		return err
	}
	if err := s.objs.LaneXsks.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unregister lane %d of stack %d: %w", lane, id, err)
	}
	return nil
}

// SetLane sends the frames of flow f (and of every flow in its bucket)
// arriving on queue to stack id's lane; lane 0 sends them to the stack's
// own socket.
func (s *Steering) SetLane(id StackID, f Flow, lane, queue int) error {
	if err := checkStack(id); err != nil {
		return err
	}
	if lane < 0 || lane >= MaxLanes {
		return fmt.Errorf("lane %d out of range: must be below %d", lane, MaxLanes)
	}
	if err := checkQueue(queue); err != nil {
		return err
	}
	b, err := LaneBucket(f)
	if err != nil {
		return err
	}
	v := uint32(0)
	if lane > 0 {
		v = uint32(lane) | uint32(queue)<<8
	}
	if err := s.objs.Lanes.Put(uint32(id)*LaneBuckets+b, v); err != nil {
		return fmt.Errorf("set lane %d for %s %s -> %s: %w", lane, f.Proto, f.Local, f.Remote, err)
	}
	return nil
}
