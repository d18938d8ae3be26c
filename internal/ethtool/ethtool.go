// Package ethtool makes the few SIOCETHTOOL requests this project needs,
// on an interface of the calling thread's network namespace.
package ethtool

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ifreq is struct ifreq with the ethtool request in its union. data is an
// unsafe.Pointer, not a uintptr, so that the request it points to stays
// reachable and is followed if the stack holding it moves.
type ifreq struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte
}

// do sends one ethtool request; req starts with its command word.
func do(ifname string, req unsafe.Pointer) error {
	if len(ifname) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q is longer than %d bytes", ifname, unix.IFNAMSIZ-1)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	ifr := ifreq{data: req}
	copy(ifr.name[:], ifname)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}

// RxQueues is how many receive queues the interface uses now: its
// receive-only channels plus its combined ones (ethtool -l). A driver
// without channel counts returns an error.
func RxQueues(ifname string) (int, error) {
	const gChannels = 0x3c // ETHTOOL_GCHANNELS
	ch := struct {
		cmd                                         uint32
		maxRx, maxTx, maxOther, maxCombined         uint32
		rxCount, txCount, otherCount, combinedCount uint32
	}{cmd: gChannels}
	if err := do(ifname, unsafe.Pointer(&ch)); err != nil {
		return 0, fmt.Errorf("channels of %s: %w", ifname, err)
	}
	return int(ch.rxCount + ch.combinedCount), nil
}

// DisableTxChecksum turns off transmit checksum offload (ethtool -K name
// tx off).
func DisableTxChecksum(ifname string) error {
	const sTxCsum = 0x17 // ETHTOOL_STXCSUM
	val := struct{ cmd, data uint32 }{cmd: sTxCsum, data: 0}
	if err := do(ifname, unsafe.Pointer(&val)); err != nil {
		return fmt.Errorf("turn off tx checksum offload on %s: %w", ifname, err)
	}
	return nil
}
