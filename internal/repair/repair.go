// Package repair re-creates an established TCP connection in the Linux
// kernel with TCP_REPAIR, the mechanism CRIU migrates live connections
// with: a socket in repair mode takes the connection's sequence numbers,
// options, windows and queued bytes, connects without a handshake, and
// when it leaves repair mode the connection goes on where it was. The
// peer sees one window probe and nothing else.
//
// It needs CAP_NET_ADMIN in the socket's network namespace. The order of
// the steps is the kernel's: sequence numbers while the socket is closed,
// then connect, then options (before any byte is queued), the queues,
// the windows (which the kernel checks against the restored rcv_nxt).
package repair

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"

	"github.com/xdp-onload/onload/internal/inet4"
)

// The queues TCP_REPAIR_QUEUE selects (linux/tcp.h), and the option
// codes TCP_REPAIR_OPTIONS takes (RFC 9293 3.2, RFC 7323, RFC 2018).
const (
	noQueue   = 0
	recvQueue = 1
	sendQueue = 2

	optMSS       = 2
	optWindow    = 3
	optSACKPerm  = 4
	optTimestamp = 8
)

// Conn is an established connection as the kernel restores it. Sequence
// numbers are the connection's own (RFC 9293 names).
type Conn struct {
	Local, Remote netip.AddrPort

	// SndUna is the first byte not acknowledged; Sent follows it (sent,
	// not acknowledged), then Unsent (queued, never sent).
	SndUna       uint32
	Sent, Unsent []byte
	// RcvNxt is the next byte expected from the peer; Unread ends there
	// (received, not read by the application).
	RcvNxt uint32
	Unread []byte

	MSS          uint16 // the peer's maximum segment size
	WS           bool   // window scaling was negotiated
	SndWS, RcvWS uint8  // shifts of the peer's window and of ours
	SACK         bool   // SACK was negotiated
	TS           bool   // timestamps were negotiated
	TSVal        uint32 // our timestamp clock now: the kernel's continues from it

	SndWnd uint32 // the peer's window, scaled, and the sequence number
	SndWl1 uint32 // of the segment that set it
	RcvWnd uint32 // the window we advertised, from RcvNxt

	// FinReceived: the peer's FIN came (CLOSE-WAIT), and RcvNxt counts
	// it. Repair mode cannot make that state: the connection is made
	// ESTABLISHED without the FIN, and after Finish, InjectFIN hands the
	// kernel socket the peer's FIN again. PeerTSVal is the peer's last
	// timestamp, for it.
	FinReceived bool
	PeerTSVal   uint32

	// FinQueued: our FIN was queued or sent (the user closed the
	// connection or shut its sending side), and not acknowledged. The
	// connection is made without it; whoever hands it over shuts the
	// kernel socket's sending side once the data is there
	// (stack.Handover), and the kernel sends its FIN at the same place.
	FinQueued bool
}

// msClock is the value for TCP_TIMESTAMP that keeps the kernel's
// timestamp clock in milliseconds and continues ts: since Linux 6.7 the
// option's low bit asks for microsecond timestamps (a clock a thousand
// times faster, whose reordered segments the peer's PAWS check drops and
// whose 2^31 wrap comes after 36 minutes), so an odd ts is rounded up,
// never down (RFC 7323 5.4: a sender's timestamps do not go back).
func msClock(ts uint32) uint32 { return ts + ts&1 }

// ErrPermission is returned when the process may not repair sockets.
var ErrPermission = errors.New("TCP_REPAIR needs CAP_NET_ADMIN (run as root or through onloadd)")

// Prepare puts fd, a TCP socket that is not connected, in repair mode
// and binds it to local unless it is bound already (repair mode lets it
// share a port another socket holds). Nothing of a connection has
// changed yet, so a caller that fails here may simply go on.
//
// It returns the socket's SO_REUSEADDR: the kernel clears a socket's
// reuse as it leaves repair mode (tcp_sock_set_repair), and the
// connection's TIME-WAIT then kept a restarted server from binding its
// port, SO_REUSEADDR or not, for a minute. Finish, or Abandon where the
// handover goes no further, sets it again.
func Prepare(fd int, local netip.AddrPort) (reuseAddr bool, err error) {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR)
	if err != nil {
		return false, os.NewSyscallError("getsockopt SO_REUSEADDR", err)
	}
	reuseAddr = v != 0
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1); err != nil {
		if errors.Is(err, unix.EPERM) {
			return false, ErrPermission
		}
		return false, os.NewSyscallError("setsockopt TCP_REPAIR", err)
	}
	if err := bindTo(fd, local); err != nil {
		Abandon(fd, reuseAddr)
		return false, err
	}
	return reuseAddr, nil
}

// Abandon takes fd, prepared by Prepare and not restored, out of repair
// mode as it was, SO_REUSEADDR and all.
func Abandon(fd int, reuseAddr bool) {
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0)
	setReuseAddr(fd, reuseAddr)
}

func setReuseAddr(fd int, on bool) error {
	v := 0
	if on {
		v = 1
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, v); err != nil {
		return os.NewSyscallError("setsockopt SO_REUSEADDR", err)
	}
	return nil
}

// bindTo binds fd, IPv4 or IPv6 (an IPv4-mapped name, inet4), to local,
// unless it is bound to its port already.
func bindTo(fd int, local netip.AddrPort) error {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return os.NewSyscallError("getsockname", err)
	}
	port, v6, ok := inet4.Port(sa)
	if !ok {
		return fmt.Errorf("not an IP socket (its name is %T)", sa)
	}
	if port != 0 {
		if port != local.Port() {
			return fmt.Errorf("socket is bound to port %d, the connection's is %d", port, local.Port())
		}
		return nil
	}
	if err := unix.Bind(fd, inet4.Sockaddr(local, v6)); err != nil {
		return os.NewSyscallError("bind", err)
	}
	return nil
}

// Restore makes fd, prepared by Prepare, the connection c, and leaves
// it in repair mode: Receive may add bytes that arrived since c was
// read, and Finish hands it to the kernel. c.Unsent is not written: the
// caller writes it (WriteAll) after Finish, once the peer's segments
// reach the socket, or the kernel could not make room for it.
func Restore(fd int, c *Conn) error { return restoreRepairing(fd, c) }

// Receive adds b to the receive queue of fd, a socket Restore made and
// Finish has not finished: bytes that followed on from c.RcvNxt.
func Receive(fd int, b []byte) error {
	if err := fitBuffer(fd, unix.SO_RCVBUF, unix.SO_RCVBUFFORCE, len(b)); err != nil {
		return err
	}
	if err := fillQueue(fd, recvQueue, b); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, noQueue); err != nil {
		return os.NewSyscallError("setsockopt TCP_REPAIR_QUEUE", err)
	}
	return nil
}

// Finish takes fd out of repair mode: the kernel sends a window probe,
// which the peer answers with its current acknowledgment and window, and
// the connection is the kernel's, with reuseAddr (Prepare's) as its
// SO_REUSEADDR again.
func Finish(fd int, reuseAddr bool) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0); err != nil {
		return os.NewSyscallError("setsockopt TCP_REPAIR off", err)
	}
	return setReuseAddr(fd, reuseAddr)
}

func restoreRepairing(fd int, c *Conn) error {
	if !c.Local.Addr().Is4() || !c.Remote.Addr().Is4() {
		return fmt.Errorf("%v to %v: only IPv4 connections", c.Local, c.Remote)
	}
	if c.SndWS > 14 || c.RcvWS > 14 {
		return fmt.Errorf("window scale %d/%d out of range", c.SndWS, c.RcvWS)
	}
	// The receive queue starts before the unread bytes, which advance
	// it to RcvNxt (less a FIN, which InjectFIN brings) as they are
	// queued; the send queue starts at SndUna.
	if err := setQueueSeq(fd, recvQueue, c.rcvData()-uint32(len(c.Unread))); err != nil {
		return err
	}
	if err := setQueueSeq(fd, sendQueue, c.SndUna); err != nil {
		return err
	}
	// The kernel's buffers must hold what is queued now; past that they
	// tune themselves as usual.
	if err := fitBuffer(fd, unix.SO_SNDBUF, unix.SO_SNDBUFFORCE, len(c.Sent)+len(c.Unsent)); err != nil {
		return err
	}
	if err := fitBuffer(fd, unix.SO_RCVBUF, unix.SO_RCVBUFFORCE, len(c.Unread)); err != nil {
		return err
	}
	// In repair mode connect sends nothing: the socket is established.
	v6, err := inet4.IsIPv6(fd)
	if err != nil {
		return err
	}
	if err := unix.Connect(fd, inet4.Sockaddr(c.Remote, v6)); err != nil {
		return os.NewSyscallError("connect (repair)", err)
	}
	if err := setOptions(fd, c); err != nil {
		return err
	}
	if c.TS {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_TIMESTAMP, int(msClock(c.TSVal))); err != nil {
			return os.NewSyscallError("setsockopt TCP_TIMESTAMP", err)
		}
	}
	if err := fillQueue(fd, recvQueue, c.Unread); err != nil {
		return err
	}
	// Bytes written to the send queue in repair mode count as sent: the
	// kernel retransmits them if the peer does not acknowledge them.
	if err := fillQueue(fd, sendQueue, c.Sent); err != nil {
		return err
	}
	if err := setWindow(fd, c); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, noQueue); err != nil {
		return os.NewSyscallError("setsockopt TCP_REPAIR_QUEUE", err)
	}
	return nil
}

func setQueueSeq(fd, q int, seq uint32) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q); err != nil {
		return os.NewSyscallError("setsockopt TCP_REPAIR_QUEUE", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ, int(int32(seq))); err != nil {
		return os.NewSyscallError("setsockopt TCP_QUEUE_SEQ", err)
	}
	return nil
}

// fitBuffer raises a socket buffer (force: past the sysctl's ceiling)
// so that n bytes fit, with the kernel's overhead; a buffer that holds
// them already is left to tune itself.
func fitBuffer(fd, opt, force, n int) error {
	cur, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt)
	if err != nil {
		return os.NewSyscallError("getsockopt", err)
	}
	if n == 0 || cur >= 4*n {
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, 2*n); err != nil {
		return os.NewSyscallError("setsockopt buffer", err)
	}
	return nil
}

func setOptions(fd int, c *Conn) error {
	opts := make([]unix.TCPRepairOpt, 0, 4)
	opts = append(opts, unix.TCPRepairOpt{Code: optMSS, Val: uint32(c.MSS)})
	if c.WS {
		opts = append(opts, unix.TCPRepairOpt{Code: optWindow, Val: uint32(c.SndWS) | uint32(c.RcvWS)<<16})
	}
	if c.SACK {
		opts = append(opts, unix.TCPRepairOpt{Code: optSACKPerm})
	}
	if c.TS {
		opts = append(opts, unix.TCPRepairOpt{Code: optTimestamp})
	}
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_OPTIONS,
		uintptr(unsafe.Pointer(&opts[0])), uintptr(len(opts))*unsafe.Sizeof(opts[0]), 0)
	if errno != 0 {
		return os.NewSyscallError("setsockopt TCP_REPAIR_OPTIONS", errno)
	}
	return nil
}

// tcpRepairWindow is struct tcp_repair_window (linux/tcp.h).
type tcpRepairWindow struct {
	sndWl1, sndWnd, maxWindow uint32
	rcvWnd, rcvWup            uint32
}

func setWindow(fd int, c *Conn) error {
	w := tcpRepairWindow{sndWl1: c.SndWl1, sndWnd: c.SndWnd, maxWindow: c.SndWnd, rcvWnd: c.RcvWnd, rcvWup: c.rcvData()}
	if c.FinReceived && w.sndWl1 == c.RcvNxt {
		w.sndWl1-- // set by the FIN itself, which the socket has not had yet
	}
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW,
		uintptr(unsafe.Pointer(&w)), unsafe.Sizeof(w), 0)
	if errno != 0 {
		return os.NewSyscallError("setsockopt TCP_REPAIR_WINDOW", errno)
	}
	return nil
}

// fillQueue queues b on queue q of a socket in repair mode.
func fillQueue(fd, q int, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, q); err != nil {
		return os.NewSyscallError("setsockopt TCP_REPAIR_QUEUE", err)
	}
	for len(b) > 0 {
		n, err := unix.SendmsgN(fd, b, nil, nil, unix.MSG_DONTWAIT)
		if err != nil {
			return os.NewSyscallError("send (repair queue)", err)
		}
		if n == 0 {
			return fmt.Errorf("repair queue %d took no bytes, %d left", q, len(b))
		}
		b = b[n:]
	}
	return nil
}

// WriteAll writes b on the connection, waiting for room up to timeout,
// whatever fd's blocking mode.
func WriteAll(fd int, b []byte, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for len(b) > 0 {
		n, err := unix.SendmsgN(fd, b, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		if n > 0 {
			b = b[n:]
			continue
		}
		if err != nil && err != unix.EAGAIN && err != unix.EINTR {
			return os.NewSyscallError("send (unsent bytes)", err)
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("%d unsent bytes found no room in %v: %w", len(b), timeout, syscall.ETIMEDOUT)
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		if _, err := unix.Poll(pfd, int(min(left, 100*time.Millisecond)/time.Millisecond)+1); err != nil && err != unix.EINTR {
			return os.NewSyscallError("poll", err)
		}
	}
	return nil
}

// InProgress reports whether fd's socket is in repair mode: a handover
// is making it. The kernel answers TCP_REPAIR_WINDOW only then, to
// anyone. A process that finds its socket connected under it (a
// handover it did not make) waits for this to end before using it.
func InProgress(fd int) bool {
	var w tcpRepairWindow
	l := uint32(unsafe.Sizeof(w))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW,
		uintptr(unsafe.Pointer(&w)), uintptr(unsafe.Pointer(&l)), 0)
	return errno == 0
}

// WaitDone waits, up to timeout, for fd's socket to leave repair mode;
// false if it did not.
func WaitDone(fd int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for InProgress(fd) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Microsecond)
	}
	return true
}

// rcvData is the next byte of data expected: RcvNxt less the FIN's
// sequence number, if it came.
func (c *Conn) rcvData() uint32 {
	if c.FinReceived {
		return c.RcvNxt - 1
	}
	return c.RcvNxt
}

// InjectFIN gives the socket Restore made for c the peer's FIN, which
// came before the handover (c.FinReceived): a segment from the peer's
// address and port, made with a raw socket and delivered through the
// host's own routing (the destination is local), as CRIU does. The
// kernel takes it as the peer's, acknowledges it to the peer (who has
// had that acknowledgment already) and the socket reads the end of the
// stream after its data. It needs CAP_NET_RAW.
func InjectFIN(c *Conn) error {
	fd, err := PeerSocket()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	optLen := 0
	if c.TS {
		optLen = 12
	}
	pkt := make([]byte, 20+20+optLen)
	ip, tcp := pkt[:20], pkt[20:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(pkt)))
	ip[8], ip[9] = 64, unix.IPPROTO_TCP
	src, dst := c.Remote.Addr().As4(), c.Local.Addr().As4()
	copy(ip[12:16], src[:])
	copy(ip[16:20], dst[:])
	binary.BigEndian.PutUint16(ip[10:], ^checksum.Checksum(ip, 0))
	binary.BigEndian.PutUint16(tcp[0:], c.Remote.Port())
	binary.BigEndian.PutUint16(tcp[2:], c.Local.Port())
	binary.BigEndian.PutUint32(tcp[4:], c.RcvNxt-1)
	binary.BigEndian.PutUint32(tcp[8:], c.SndUna)
	tcp[12] = byte((20 + optLen) / 4 << 4)
	tcp[13] = 0x11 // FIN, ACK
	wnd := c.SndWnd
	if c.WS {
		wnd >>= c.SndWS
	}
	binary.BigEndian.PutUint16(tcp[14:], uint16(min(wnd, 0xffff)))
	if c.TS {
		o := tcp[20:]
		o[0], o[1], o[2], o[3] = 1, 1, 8, 10 // NOP, NOP, timestamps
		binary.BigEndian.PutUint32(o[4:], c.PeerTSVal)
		binary.BigEndian.PutUint32(o[8:], c.TSVal)
	}
	// The pseudo-header: addresses, protocol, TCP length.
	var ph [12]byte
	copy(ph[0:4], src[:])
	copy(ph[4:8], dst[:])
	ph[9] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(ph[10:], uint16(len(tcp)))
	binary.BigEndian.PutUint16(tcp[16:], ^checksum.Checksum(tcp, checksum.Checksum(ph[:], 0)))
	if err := unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: dst}); err != nil {
		return os.NewSyscallError("sendto (the peer's FIN)", err)
	}
	return nil
}

// PeerSocket makes the raw socket that sends segments as a peer's
// (InjectFIN, SendPeerPackets), in the calling thread's network
// namespace: the IP header is the caller's, its source another host's.
// It needs CAP_NET_RAW.
func PeerSocket() (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return -1, os.NewSyscallError("socket (raw)", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
		unix.Close(fd)
		return -1, os.NewSyscallError("setsockopt IP_TRANSPARENT", err)
	}
	return fd, nil
}

// SendPeerPackets gives the kernel, in order, on fd (PeerSocket), IPv4
// packets that came from a connection's peer after its handover had
// taken what the stack held (the segments as they came: the peer's
// checksums and timestamps), as InjectFIN gives a FIN: through the
// host's own routing to the local socket, which takes them as the
// peer's. It returns how many the kernel took; those it did not, the
// peer sends again.
// SocketInode is the inode of fd's file: two descriptors of one socket
// (a process's and its child's) have the same.
func SocketInode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, os.NewSyscallError("fstat", err)
	}
	return st.Ino, nil
}

// PeerPacket reports whether pkt is an IPv4 TCP segment of the
// connection local-remote as the peer sends it: from remote, to local.
// A process of onloadd's stack writes the image these segments are kept
// in; onloadd gives the kernel only those that pass.
func PeerPacket(pkt []byte, local, remote netip.AddrPort) bool {
	if len(pkt) < 20 || pkt[0]>>4 != 4 || pkt[9] != unix.IPPROTO_TCP {
		return false
	}
	ihl := int(pkt[0]&0xf) * 4
	if ihl < 20 || len(pkt) < ihl+20 {
		return false
	}
	src, dst := netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20]))
	sport, dport := uint16(pkt[ihl])<<8|uint16(pkt[ihl+1]), uint16(pkt[ihl+2])<<8|uint16(pkt[ihl+3])
	unmap := func(ap netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) }
	return netip.AddrPortFrom(src, sport) == unmap(remote) && netip.AddrPortFrom(dst, dport) == unmap(local)
}

func SendPeerPackets(fd int, pkts [][]byte) int {
	n := 0
	for _, pkt := range pkts {
		if len(pkt) < 20 || pkt[0]>>4 != 4 {
			continue
		}
		var dst [4]byte
		copy(dst[:], pkt[16:20])
		if unix.Sendto(fd, pkt, unix.MSG_DONTWAIT, &unix.SockaddrInet4{Addr: dst}) == nil {
			n++
		}
	}
	return n
}
