package test

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// disableTxChecksum turns off transmit checksum offload on an interface of
// the calling thread's namespace (ethtool -K name tx off). A veth has no
// hardware to finish checksums the kernel leaves partial, so without this
// the frames an AF_XDP socket on the other end sees carry incomplete TCP
// and UDP checksums. A real NIC fills them in before the wire; turning
// offload off makes the veth behave like a wire.
func disableTxChecksum(name string) error {
	const ethtoolSTxCsum = 0x17 // ETHTOOL_STXCSUM
	val := struct{ cmd, data uint32 }{cmd: ethtoolSTxCsum, data: 0}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], name)
	ifr.data = uintptr(unsafe.Pointer(&val))
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return fmt.Errorf("turn off tx checksum offload on %s: %w", name, errno)
	}
	return nil
}
