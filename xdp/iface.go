package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Interface is a network device as seen from the calling thread's network
// namespace.
type Interface struct {
	Name     string
	Index    int
	MTU      int
	MAC      net.HardwareAddr
	RxQueues int // 0 when the kernel does not say
}

// LookupInterface finds an interface by name in the calling thread's network
// namespace.
func LookupInterface(name string) (Interface, error) {
	ifi, err := net.InterfaceByName(name)
	if err != nil {
		return Interface{}, &Error{
			Msg:  fmt.Sprintf("interface %q not found in this network namespace (see `ip link`)", name),
			Kind: ErrNoInterface, Err: err,
		}
	}
	q, _ := rxQueues(ifi.Index)
	return Interface{Name: ifi.Name, Index: ifi.Index, MTU: ifi.MTU, MAC: ifi.HardwareAddr, RxQueues: q}, nil
}

// rxQueues asks the kernel over rtnetlink how many receive queues an
// interface has. sysfs cannot be used: it shows the namespace it was
// mounted in, not the calling thread's.
func rxQueues(ifindex int) (int, error) {
	rib, err := syscall.NetlinkRIB(syscall.RTM_GETLINK, syscall.AF_UNSPEC)
	if err != nil {
		return 0, fmt.Errorf("dump links: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(rib)
	if err != nil {
		return 0, fmt.Errorf("parse links: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != syscall.RTM_NEWLINK || len(m.Data) < syscall.SizeofIfInfomsg {
			continue
		}
		ifim := (*syscall.IfInfomsg)(unsafe.Pointer(&m.Data[0]))
		if int(ifim.Index) != ifindex {
			continue
		}
		attrs, err := syscall.ParseNetlinkRouteAttr(&m)
		if err != nil {
			return 0, fmt.Errorf("parse link attributes: %w", err)
		}
		for _, a := range attrs {
			if a.Attr.Type == unix.IFLA_NUM_RX_QUEUES && len(a.Value) >= 4 {
				return int(binary.NativeEndian.Uint32(a.Value)), nil
			}
		}
		return 0, nil
	}
	return 0, errors.New("interface not in link dump")
}
