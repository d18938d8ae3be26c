// Package ethtool makes the few SIOCETHTOOL requests this project needs,
// on an interface of the calling thread's network namespace.
package ethtool

import (
	"encoding/binary"
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

// Driver is the name of the interface's driver (ethtool -i).
func Driver(ifname string) (string, error) {
	const gDrvInfo = 0x3 // ETHTOOL_GDRVINFO
	info := struct {
		cmd    uint32
		driver [32]byte
		_      [164]byte // version, firmware, bus, ... (struct ethtool_drvinfo)
	}{cmd: gDrvInfo}
	if err := do(ifname, unsafe.Pointer(&info)); err != nil {
		return "", fmt.Errorf("driver of %s: %w", ifname, err)
	}
	return unix.ByteSliceToString(info.driver[:]), nil
}

// NtupleOn reports whether the interface's n-tuple filters are on
// (ethtool -k: ntuple-filters), the receive flow steering Rule needs. The
// kernel answers for every device, from its features.
func NtupleOn(ifname string) (bool, error) {
	const (
		gFlags     = 0x25    // ETHTOOL_GFLAGS
		flagNtuple = 1 << 27 // ETH_FLAG_NTUPLE
	)
	val := struct{ cmd, data uint32 }{cmd: gFlags}
	if err := do(ifname, unsafe.Pointer(&val)); err != nil {
		return false, fmt.Errorf("features of %s: %w", ifname, err)
	}
	return val.data&flagNtuple != 0, nil
}

// Rule is a receive flow steering rule (an n-tuple filter: ethtool -N
// flow-type tcp4 dst-ip A dst-port P action Q): IPv4 frames of the
// protocol to the address (any, if unspecified) and port go to the queue.
type Rule struct {
	UDP   bool
	Addr  [4]byte // the destination address; zero: any
	Port  uint16  // the destination port
	Queue uint32
}

// rxFlowSpec is struct ethtool_rx_flow_spec; rxnfc is struct
// ethtool_rxnfc without its trailing rule locations. Both are laid out
// by hand as the kernel's, padding included (checked by the tests).
type rxFlowSpec struct {
	flowType   uint32
	h          [52]byte // union ethtool_flow_union: the values
	hExt       [20]byte // struct ethtool_flow_ext
	m          [52]byte // the masks: set bits must match
	mExt       [20]byte
	_          [4]byte
	ringCookie uint64 // the queue
	location   uint32
	_          [4]byte
}

type rxnfc struct {
	cmd, flowType uint32
	data          uint64
	fs            rxFlowSpec
	ruleCnt       uint32
	_             [4]byte
}

const (
	sRxClsRlDel = 0x31       // ETHTOOL_SRXCLSRLDEL
	sRxClsRlIns = 0x32       // ETHTOOL_SRXCLSRLINS
	tcpV4Flow   = 0x01       // TCP_V4_FLOW
	udpV4Flow   = 0x02       // UDP_V4_FLOW
	locAny      = 0xffffffff // RX_CLS_LOC_ANY: the driver picks the place
)

// spec is the rule as the kernel takes it: struct ethtool_tcpip4_spec
// (ip4src, ip4dst, psrc, pdst, tos) in the value and mask unions.
func (r Rule) spec() rxFlowSpec {
	fs := rxFlowSpec{flowType: tcpV4Flow, ringCookie: uint64(r.Queue), location: locAny}
	if r.UDP {
		fs.flowType = udpV4Flow
	}
	if r.Addr != ([4]byte{}) {
		copy(fs.h[4:8], r.Addr[:])
		copy(fs.m[4:8], []byte{0xff, 0xff, 0xff, 0xff})
	}
	binary.BigEndian.PutUint16(fs.h[10:12], r.Port)
	fs.m[10], fs.m[11] = 0xff, 0xff
	return fs
}

// InsertRule adds the rule to the interface's n-tuple filters and returns
// where the driver put it, for DeleteRule.
func InsertRule(ifname string, r Rule) (uint32, error) {
	req := rxnfc{cmd: sRxClsRlIns, fs: r.spec()}
	if err := do(ifname, unsafe.Pointer(&req)); err != nil {
		proto := "tcp"
		if r.UDP {
			proto = "udp"
		}
		return 0, fmt.Errorf("n-tuple rule on %s steering %s port %d to queue %d: %w", ifname, proto, r.Port, r.Queue, err)
	}
	return req.fs.location, nil
}

// DeleteRule removes the rule InsertRule put at loc.
func DeleteRule(ifname string, loc uint32) error {
	req := rxnfc{cmd: sRxClsRlDel, fs: rxFlowSpec{location: loc}}
	if err := do(ifname, unsafe.Pointer(&req)); err != nil {
		return fmt.Errorf("n-tuple rule %d on %s: %w", loc, ifname, err)
	}
	return nil
}
