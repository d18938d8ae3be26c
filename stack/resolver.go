package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KernelNeighbours resolves neighbours through the kernel's neighbour table
// over rtnetlink. ARP stays with the kernel (the steering program passes
// ARP frames to it): when an entry is missing, KernelNeighbours asks the
// kernel to resolve it (RTM_NEWNEIGH with NTF_USE, which sends an ARP
// request) and the stack holds its packets until the entry appears.
type KernelNeighbours struct {
	mu      sync.Mutex
	fd      int
	ifindex int
	seq     uint32
	buf     []byte
}

// NewKernelNeighbours opens a netlink socket for the interface. It must be
// called in the interface's network namespace; the socket stays there.
func NewKernelNeighbours(ifname string) (*KernelNeighbours, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("neighbour resolver: interface %q: %w", ifname, err)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("neighbour resolver: netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("neighbour resolver: bind netlink socket: %w", err)
	}
	tv := unix.Timeval{Sec: 1}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return &KernelNeighbours{fd: fd, ifindex: ifi.Index, buf: make([]byte, 8192)}, nil
}

// Close closes the netlink socket.
func (k *KernelNeighbours) Close() error { return unix.Close(k.fd) }

// nudValid are the kernel's neighbour states whose link address is usable.
const nudValid = unix.NUD_REACHABLE | unix.NUD_STALE | unix.NUD_DELAY | unix.NUD_PROBE | unix.NUD_PERMANENT | unix.NUD_NOARP

// Resolve looks ip up in the kernel's table; if the kernel has no usable
// entry it asks the kernel to resolve one and reports false.
func (k *KernelNeighbours) Resolve(ip netip.Addr) (net.HardwareAddr, bool) {
	if !ip.Is4() {
		return nil, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	mac, state, err := k.get(ip)
	if err == nil && state&nudValid != 0 && len(mac) == 6 {
		return mac, true
	}
	if err == nil && state&unix.NUD_INCOMPLETE != 0 {
		return nil, false // being resolved
	}
	k.use(ip)
	return nil, false
}

// request sends one rtnetlink message made of an ndmsg and an NDA_DST
// attribute and returns the reply.
func (k *KernelNeighbours) request(typ uint16, flags uint16, ndmFlags uint8, ip netip.Addr) ([]byte, error) {
	k.seq++
	const hdr = unix.SizeofNlMsghdr
	msg := make([]byte, hdr+unix.SizeofNdMsg+8)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], k.seq)
	nd := (*unix.NdMsg)(unsafe.Pointer(&msg[hdr]))
	nd.Family = unix.AF_INET
	nd.Ifindex = int32(k.ifindex)
	nd.Flags = ndmFlags
	nd.State = unix.NUD_NONE
	attr := msg[hdr+unix.SizeofNdMsg:]
	binary.NativeEndian.PutUint16(attr[0:], 8)
	binary.NativeEndian.PutUint16(attr[2:], unix.NDA_DST)
	a4 := ip.As4()
	copy(attr[4:], a4[:])
	if err := unix.Sendto(k.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	for {
		n, _, err := unix.Recvfrom(k.fd, k.buf, 0)
		if err != nil {
			return nil, err
		}
		msgs, err := syscallParse(k.buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.seq != k.seq {
				continue
			}
			if m.typ == unix.NLMSG_ERROR {
				if len(m.data) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(m.data)); e != 0 {
						return nil, unix.Errno(-e)
					}
				}
				return nil, nil // an ACK
			}
			return m.data, nil
		}
	}
}

type nlMsg struct {
	typ  uint16
	seq  uint32
	data []byte
}

func syscallParse(b []byte) ([]nlMsg, error) {
	var out []nlMsg
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return nil, errors.New("netlink: bad message length")
		}
		out = append(out, nlMsg{typ: binary.NativeEndian.Uint16(b[4:]), seq: binary.NativeEndian.Uint32(b[8:]), data: b[unix.SizeofNlMsghdr:l]})
		b = b[(l+3)&^3:]
	}
	return out, nil
}

// get asks the kernel for its entry for ip.
func (k *KernelNeighbours) get(ip netip.Addr) (net.HardwareAddr, uint16, error) {
	data, err := k.request(unix.RTM_GETNEIGH, 0, 0, ip)
	if err != nil {
		return nil, 0, err
	}
	if len(data) < unix.SizeofNdMsg {
		return nil, 0, errors.New("netlink: short neighbour reply")
	}
	state := (*unix.NdMsg)(unsafe.Pointer(&data[0])).State
	var mac net.HardwareAddr
	for a := data[unix.SizeofNdMsg:]; len(a) >= 4; {
		l := int(binary.NativeEndian.Uint16(a[0:]))
		if l < 4 || l > len(a) {
			break
		}
		if binary.NativeEndian.Uint16(a[2:]) == unix.NDA_LLADDR {
			mac = append(net.HardwareAddr(nil), a[4:l]...)
		}
		a = a[(l+3)&^3:]
	}
	return mac, state, nil
}

// use asks the kernel to resolve ip (it sends an ARP request).
func (k *KernelNeighbours) use(ip netip.Addr) error {
	_, err := k.request(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE, unix.NTF_USE, ip)
	return err
}
