// Package vnic is the virtual NIC the stack talks to: a pool of frames
// named by checked handles, batch receive and batch transmit. Two
// implementations satisfy the same interface and the same contract tests
// (vnic/vnictest): XDP, over an AF_XDP socket and its UMEM, and Mem, a
// connected pair in memory that can lose, duplicate, reorder, delay and
// corrupt frames, deterministically by seed, so that stack tests run
// without root or a network.
package vnic

import (
	"fmt"
	"net"
	"time"
)

// NIC is a virtual network interface: one queue of one device, or one end
// of an in-memory wire.
//
// Frames move by handle. Receive hands the caller frames it then owns;
// the caller passes each one on with Transmit (the NIC owns it then) or
// gives it back with Pool().Free. A handle stops working the moment its
// frame leaves the caller's hands.
//
// A NIC is not safe for concurrent use: one goroutine (the holder of the
// stack lock) drives it. The two ends of a Mem pair may be driven by two
// goroutines.
type NIC interface {
	// Pool is the frame pool the NIC receives into and sends from.
	Pool() *Pool
	// Receive moves up to len(hs) received frames into hs and returns how
	// many. It never blocks.
	Receive(hs []Handle) int
	// Transmit queues hs for sending and returns how many it took, which
	// it moves to the front of hs in their order: hs[:n] belong to the NIC
	// now. The rest stay the caller's: the ring was full, or a frame was
	// refused on its own (not a handle the caller holds: ErrStale; longer
	// than the MTU: ErrTooLong; busy: ErrBusy), which does not hold back
	// the frames after it. err names the first refusal.
	Transmit(hs []Handle) (n int, err error)
	// TransmitKeep queues hs for sending while the caller keeps them (a
	// TCP segment stays queued for retransmission): the handles stay
	// valid, and each frame is Busy until the NIC is done with it. A frame
	// that is already busy is refused with ErrBusy.
	TransmitKeep(hs []Handle) (n int, err error)
	// Idle reports, cheaply and without side effects, that there is nothing
	// to receive and no housekeeping due: a busy-poller may skip a poll.
	// False when in doubt.
	Idle() bool
	// Resync reloads whatever the NIC caches of shared state: another
	// process drove it since this one last did (a takeover).
	Resync()
	// Info describes the NIC.
	Info() Info
	// Stats returns the NIC's counters.
	Stats() Stats
	// Close releases the NIC. Handles die with it.
	Close() error
}

// MTUSetter is a NIC whose MTU follows the interface's (the stack tells
// it when the kernel's changes): it refuses frames larger than the MTU.
type MTUSetter interface {
	SetMTU(mtu int)
}

// KickHolder is a NIC whose doorbell can be put off (the xmit_more of a
// kernel driver): while held, a transmit puts its frames on the ring and
// leaves the kick owed; the next transmit not held, or the next Receive,
// kicks, and Idle is false while a kick is owed. A caller that knows more
// frames follow in a moment (other goroutines about to send) saves a
// system call per frame. Whoever holds a kick must see that somebody
// kicks: KickOwed says (lock-free) that frames wait, Kick hands them over
// (under the stack lock, as Transmit).
type KickHolder interface {
	HoldKicks(hold bool)
	KickOwed() bool
	Kick() error
}

// LateKicker is a NIC whose doorbell the stack rings after it has let
// the stack lock go. A kick is a system call in which the kernel sends
// the frames (in copy mode the whole transmit: on a veth, the peer's
// receive too), and made under the lock it holds every other thread and
// process of the stack off for as long. With late kicks on, where the
// NIC would kick it leaves the kick due instead; TakeKick, the last thing
// under the lock, takes it, and KickUnlocked, after the lock, gives it.
type LateKicker interface {
	SetLateKicks(on bool)
	TakeKick() bool
	KickUnlocked() error
}

// Drainer is a NIC that can wait until the kernel has taken every frame
// handed to it (Drain): for a process about to end, whose frames would
// otherwise go with it.
type Drainer interface {
	Drain(timeout time.Duration) bool
}

// Info describes a NIC.
type Info struct {
	Name string // e.g. "eth0 queue 0" or "mem a"
	Mode string // e.g. "xdp copy", "xdp zero-copy", "memory"
	MTU  int
	MAC  net.HardwareAddr
	// RxDepth is how many frames can arrive while nobody polls (the fill
	// ring's depth): more are dropped. 0: no such limit.
	RxDepth int
}

func (i Info) String() string {
	return fmt.Sprintf("%s (%s, mtu %d, %s)", i.Name, i.Mode, i.MTU, i.MAC)
}

// Stats are a NIC's counters.
type Stats struct {
	RxFrames, RxBytes uint64
	TxFrames, TxBytes uint64
	// RxDropped counts frames lost on the way in: no free frame to receive
	// into, a full ring, or kernel drops.
	RxDropped uint64
	// RxInvalid counts descriptors that named memory we never gave out
	// (checked and refused, never used).
	RxInvalid uint64
	// TxErrors counts frames refused or failed on the way out.
	TxErrors uint64
	// TxKicks counts the system calls that told the kernel to send (each
	// carries every frame queued since the one before).
	TxKicks uint64

	// Impairments applied by a Mem wire on this NIC's transmit side.
	Lost, Duplicated, Reordered, Corrupted, Delayed uint64
}
