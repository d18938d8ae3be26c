package bpf

import (
	"fmt"
)

// Clusters (steer.c): stacks that each listen on one port, a queue each,
// as Onload's clusters serve SO_REUSEPORT. The port's listener entry names
// the cluster; cluster_members names the stack for each of its queues, and
// a frame goes to the member for the queue it arrived on, or to the
// kernel if that queue has none (CounterPassNoMember). A queue may be
// held for a member that does not listen yet (SetClusterHeld): its SYNs
// are dropped (CounterDropHeld), to come again once the member listens.

// ClusterID names a cluster in the steering maps: 0 to MaxStacks-1.
type ClusterID uint32

const clusterBit = 0x80000000 // CLUSTER_BIT in steer.c

func checkCluster(c ClusterID) error {
	if c >= MaxStacks {
		return fmt.Errorf("cluster id %d out of range: must be below %d", c, MaxStacks)
	}
	return nil
}

// AddClusterListener steers frames matching l to cluster c's member for
// the queue they arrive on, replacing any entry for the same listener.
func (s *Steering) AddClusterListener(l Listener, c ClusterID) error {
	if err := checkCluster(c); err != nil {
		return err
	}
	k, err := listenerKey(l)
	if err != nil {
		return err
	}
	if err := s.putListener(k, uint32(c)|clusterBit); err != nil {
		return fmt.Errorf("add listener %s %s:%d for cluster %d: %w", l.Proto, l.Addr, l.Port, c, err)
	}
	return nil
}

func memberSlot(c ClusterID, queue int) (uint32, error) {
	if err := checkCluster(c); err != nil {
		return 0, err
	}
	if err := checkQueue(queue); err != nil {
		return 0, err
	}
	return uint32(c)*MaxQueues + uint32(queue), nil
}

// SetClusterMember makes stack id cluster c's member for queue: the
// cluster's frames arriving on queue go to it.
func (s *Steering) SetClusterMember(c ClusterID, queue int, id StackID) error {
	if err := checkStack(id); err != nil {
		return err
	}
	k, err := memberSlot(c, queue)
	if err != nil {
		return err
	}
	if err := s.objs.ClusterMembers.Put(k, uint32(id)+1); err != nil {
		return fmt.Errorf("cluster %d queue %d: member stack %d: %w", c, queue, id, err)
	}
	return nil
}

// HeldMember is what ClusterMembers reads for a queue held for its member
// (SetClusterHeld).
const HeldMember StackID = memberHeld

const memberHeld = 0xffffffff // MEMBER_HELD in steer.c

// SetClusterHeld holds cluster c's queue for a member that is coming: a
// SYN arriving there is dropped, so that the client's next one goes to
// the member once it listens (SetClusterMember); the rest go to the
// kernel, as with no member (ClearClusterMember).
func (s *Steering) SetClusterHeld(c ClusterID, queue int) error {
	k, err := memberSlot(c, queue)
	if err != nil {
		return err
	}
	if err := s.objs.ClusterMembers.Put(k, uint32(memberHeld)); err != nil {
		return fmt.Errorf("cluster %d queue %d: hold it: %w", c, queue, err)
	}
	return nil
}

// ClearClusterMember leaves cluster c without a member for queue: its
// frames arriving there go to the kernel.
func (s *Steering) ClearClusterMember(c ClusterID, queue int) error {
	k, err := memberSlot(c, queue)
	if err != nil {
		return err
	}
	if err := s.objs.ClusterMembers.Put(k, uint32(0)); err != nil {
		return fmt.Errorf("cluster %d queue %d: clear its member: %w", c, queue, err)
	}
	return nil
}

// ClusterMembers reads cluster c's member slots from the steering
// program's map: the member stack of each queue that has one, HeldMember
// for a queue held (SetClusterHeld).
func (s *Steering) ClusterMembers(c ClusterID) (map[int]StackID, error) {
	out := map[int]StackID{}
	for q := range MaxQueues {
		k, err := memberSlot(c, q)
		if err != nil {
			return nil, err
		}
		var v uint32
		if err := s.objs.ClusterMembers.Lookup(k, &v); err != nil {
			return nil, fmt.Errorf("cluster %d queue %d: %w", c, q, err)
		}
		switch v {
		case 0:
		case memberHeld:
			out[q] = HeldMember
		default:
			out[q] = StackID(v - 1)
		}
	}
	return out, nil
}
