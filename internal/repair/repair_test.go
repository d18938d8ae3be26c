package repair

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dump reads a kernel connection's state the way CRIU does, in repair
// mode, and leaves fd in repair mode (its close then sends nothing). It
// is the reference Restore is checked against: what the kernel dumps,
// Restore must re-create.
func dump(t *testing.T, fd int) *Conn {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1))
	c := &Conn{}
	la, err := unix.Getsockname(fd)
	must(err)
	ra, err := unix.Getpeername(fd)
	must(err)
	c.Local = sockAddr(la)
	c.Remote = sockAddr(ra)

	inq, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	must(err)
	outq, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
	must(err)
	unsent, err := unix.IoctlGetInt(fd, unix.SIOCOUTQNSD)
	must(err)

	must(unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, recvQueue))
	seq, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	must(err)
	c.RcvNxt = uint32(seq)
	c.Unread = peek(t, fd, inq)

	must(unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR_QUEUE, sendQueue))
	seq, err = unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_QUEUE_SEQ)
	must(err)
	c.SndUna = uint32(seq) - uint32(outq)
	q := peek(t, fd, outq)
	c.Sent, c.Unsent = q[:outq-unsent], q[outq-unsent:]

	var info [256]byte
	l := uint32(len(info))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0); e != 0 {
		t.Fatal(e)
	}
	opts := info[5]
	c.TS, c.SACK, c.WS = opts&1 != 0, opts&2 != 0, opts&4 != 0
	c.SndWS, c.RcvWS = info[6]&0xf, info[6]>>4
	mss, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG)
	must(err)
	c.MSS = uint16(mss)
	ts, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_TIMESTAMP)
	must(err)
	c.TSVal = uint32(ts)

	var w tcpRepairWindow
	wl := uint32(unsafe.Sizeof(w))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR_WINDOW,
		uintptr(unsafe.Pointer(&w)), uintptr(unsafe.Pointer(&wl)), 0); e != 0 {
		t.Fatal(e)
	}
	c.SndWnd, c.SndWl1 = w.sndWnd, w.sndWl1
	c.RcvWnd = w.rcvWup + w.rcvWnd - c.RcvNxt
	return c
}

func peek(t *testing.T, fd, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if n == 0 {
		return b
	}
	got, _, err := unix.Recvfrom(fd, b, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	if err != nil || got != n {
		t.Fatalf("peek at a repair queue: %d of %d bytes, %v", got, n, err)
	}
	return b
}

func sockAddr(sa unix.Sockaddr) netip.AddrPort {
	in := sa.(*unix.SockaddrInet4)
	return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port))
}

func repairable(t *testing.T) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1); err != nil {
		t.Skipf("TCP_REPAIR is not allowed here (%v): it needs CAP_NET_ADMIN", err)
	}
}

// rawConn is a connected kernel socket's fd, taken out of a net.Conn.
func rawConn(t *testing.T, c net.Conn) int {
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	fd, err := unix.Dup(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	unix.SetNonblock(fd, false)
	return fd
}

// TestRestoreKernelConnection moves one end of a kernel connection to a
// fresh socket: the peer's bytes the old socket had not read, a byte
// "sent" that the peer never had (the restored socket must retransmit
// it), and bytes never sent, then both ways on the new socket. The peer
// must see every byte once, in order, and no reset.
func TestRestoreKernelConnection(t *testing.T) {
	repairable(t)
	cc, peer := loopbackPair(t)

	if _, err := cc.Write([]byte("before|")); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Write([]byte("unread by the old socket|")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(peer, buf); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the peer's bytes reach cc's queue

	old := rawConn(t, cc)
	c := dump(t, old)
	if string(c.Unread) != "unread by the old socket|" {
		t.Fatalf("dump: unread %q", c.Unread)
	}
	unix.Close(old) // in repair mode: no FIN, no reset
	// The last bytes come in while the connection moves (Receive).
	later := c.Unread[len(c.Unread)-len("socket|"):]
	c.Unread = c.Unread[:len(c.Unread)-len(later)]
	c.RcvNxt -= uint32(len(later))
	// A byte the old socket "sent" that never reached the peer, and some
	// never sent.
	c.Sent = append(c.Sent, "lost|"...)
	c.Unsent = append(c.Unsent, "unsent|"...)

	fd := restored(t, c)
	// Bytes that came in while the connection moved.
	if err := Receive(fd, later); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if err := Finish(fd, true); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if err := WriteAll(fd, c.Unsent, 5*time.Second); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	nc, err := net.FileConn(os.NewFile(uintptr(fd), "restored"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(20 * time.Second))

	got := make([]byte, len("unread by the old socket|"))
	if _, err := io.ReadFull(nc, got); err != nil || string(got) != "unread by the old socket|" {
		t.Fatalf("restored socket read %q, %v", got, err)
	}
	if _, err := nc.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	want := "lost|unsent|after"
	got = make([]byte, len(want))
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != want {
		t.Fatalf("peer read %q, %v; want %q", got, err, want)
	}
	if _, err := peer.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	got = make([]byte, 5)
	if _, err := io.ReadFull(nc, got); err != nil || string(got) != "reply" {
		t.Fatalf("restored socket read %q, %v", got, err)
	}
	// Both ends close cleanly: the restored socket's FIN reaches the peer.
	nc.(*net.TCPConn).CloseWrite()
	if n, err := peer.Read(got); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("peer after the restored socket's FIN: %d bytes, %v", n, err)
	}
}

// TestPrepareBoundElsewhere: a socket bound to another port is refused
// with a sentence, and left out of repair mode.
func TestPrepareBoundElsewhere(t *testing.T) {
	repairable(t)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	_, err = Prepare(fd, netip.MustParseAddrPort("127.0.0.1:1"))
	if err == nil {
		t.Fatal("Prepare took a socket bound to another port")
	}
	t.Log(err)
	if v, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR); err != nil || v != 0 {
		t.Fatalf("TCP_REPAIR left at %d (%v)", v, err)
	}
}

// TestInProgress: a socket reads as in repair mode while Restore's work
// is on it, and not before nor after.
func TestInProgress(t *testing.T) {
	repairable(t)
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if InProgress(fd) {
		t.Fatal("a new socket reads as in repair mode")
	}
	reuse, err := Prepare(fd, netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	if !InProgress(fd) {
		t.Fatal("a prepared socket does not read as in repair mode")
	}
	if err := Finish(fd, reuse); err != nil {
		t.Fatal(err)
	}
	if InProgress(fd) || !WaitDone(fd, time.Millisecond) {
		t.Fatal("a finished socket reads as in repair mode")
	}
}

// TestRestoreCloseWait moves a connection whose peer has closed its side
// (CLOSE-WAIT: the FIN came, the data before it not yet read): after
// Restore, Finish and InjectFIN, the new socket reads the data, then the
// end of the stream, and can still send.
func TestRestoreCloseWait(t *testing.T) {
	repairable(t)
	cc, peer := loopbackPair(t)
	if _, err := peer.Write([]byte("last words|")); err != nil {
		t.Fatal(err)
	}
	peer.(*net.TCPConn).CloseWrite()
	time.Sleep(20 * time.Millisecond) // the data and the FIN reach cc

	old := rawConn(t, cc)
	c := dump(t, old)
	if st := tcpState(old); st != 8 { // TCP_CLOSE_WAIT
		t.Fatalf("the old socket is in state %d, not CLOSE-WAIT", st)
	}
	unix.Close(old)
	c.FinReceived = true

	fd := restored(t, c)
	if err := Finish(fd, true); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if st := tcpState(fd); st != 1 {
		t.Errorf("before InjectFIN the socket is in state %d, not ESTABLISHED", st)
	}
	time.Sleep(50 * time.Millisecond)
	if st := tcpState(fd); st != 1 {
		t.Errorf("50 ms later, with no FIN, the socket is in state %d, not ESTABLISHED", st)
	}
	if err := InjectFIN(c); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if st := tcpState(fd); st != 8 {
		t.Errorf("after InjectFIN the socket is in state %d, not CLOSE-WAIT", st)
	}
	nc, err := net.FileConn(os.NewFile(uintptr(fd), "restored"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(nc)
	if err != nil || string(got) != "last words|" {
		t.Fatalf("the restored socket read %q, %v; want the data, then the end of the stream", got, err)
	}
	if _, err := nc.Write([]byte("reply")); err != nil {
		t.Fatal(err)
	}
	nc.(*net.TCPConn).CloseWrite()
	got, err = io.ReadAll(peer)
	if err != nil || string(got) != "reply" {
		t.Fatalf("the peer read %q, %v", got, err)
	}
}

// tcpState is the socket's state, as TCP_INFO gives it (Linux's numbers:
// 1 ESTABLISHED, 8 CLOSE-WAIT).
func tcpState(fd int) byte {
	var info [8]byte
	l := uint32(len(info))
	unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, unix.TCP_INFO, uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
	return info[0]
}

// loopbackPair is a kernel connection over loopback: cc dialled, peer
// accepted (closed, with its deadline, when the test ends).
func loopbackPair(t *testing.T) (cc, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if cc, err = net.Dial("tcp4", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if peer, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	peer.SetDeadline(time.Now().Add(20 * time.Second))
	return cc, peer
}

// TestTimeWaitLetsServerRebind: a connection restored from a socket
// with SO_REUSEADDR keeps it after Finish (the kernel clears a socket's
// reuse as it leaves repair mode), so that its TIME-WAIT, after it
// closes first, lets a new listener with SO_REUSEADDR bind its port at
// once, as a restarted server binds on the kernel. Without it the bind
// failed with EADDRINUSE for the TIME-WAIT's minute.
func TestTimeWaitLetsServerRebind(t *testing.T) {
	repairable(t)
	cc, peer := loopbackPair(t)
	old := rawConn(t, cc)
	c := dump(t, old)
	unix.Close(old)
	fd := restored(t, c)
	if err := Finish(fd, true); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR); err != nil || v != 1 {
		t.Errorf("after Finish SO_REUSEADDR reads %d (%v), not 1", v, err)
	}
	// Close first: the restored socket's side goes to TIME-WAIT once the
	// peer's FIN comes.
	unix.Shutdown(fd, unix.SHUT_WR)
	if _, err := io.ReadAll(peer); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	time.Sleep(20 * time.Millisecond)
	unix.Close(fd)
	ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ln)
	if err := unix.SetsockoptInt(ln, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		t.Fatal(err)
	}
	a := c.Local.Addr().As4()
	if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: a, Port: int(c.Local.Port())}); err != nil {
		t.Fatalf("a listener with SO_REUSEADDR could not bind %v beside the restored connection's TIME-WAIT: %v", c.Local, err)
	}
	if err := unix.Listen(ln, 1); err != nil {
		t.Fatal(err)
	}
}

// restored is a fresh socket with SO_REUSEADDR (as a server's accepted
// socket has it from its listener), prepared and restored as c, still in
// repair mode: Finish(fd, true) takes it out.
func restored(t *testing.T, c *Conn) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if reuse, err := Prepare(fd, c.Local); err != nil || !reuse {
		unix.Close(fd)
		t.Fatalf("Prepare: SO_REUSEADDR %v, %v", reuse, err)
	}
	if err := Restore(fd, c); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	return fd
}

// TestRestoreTimestampClock restores a connection whose timestamp clock
// reads an odd value, as our stack's millisecond clock does half the
// time. Since Linux 6.7 the low bit of TCP_TIMESTAMP switches the socket
// to microsecond timestamps: the peer would see our clock run a thousand
// times faster, its PAWS check would drop any two segments reordered by
// a microsecond, and after about 36 idle minutes every segment (the
// clock's 2^31 wraps). The restored socket's clock must stay in
// milliseconds and not step back from the value given.
func TestRestoreTimestampClock(t *testing.T) {
	repairable(t)
	cc, peer := loopbackPair(t)
	old := rawConn(t, cc)
	c := dump(t, old)
	unix.Close(old)
	if !c.TS {
		t.Skip("the loopback connection did not negotiate timestamps (net.ipv4.tcp_timestamps is off)")
	}
	c.TSVal |= 1
	fd := restored(t, c)
	f := os.NewFile(uintptr(fd), "restored")
	defer f.Close()
	if err := Finish(fd, true); err != nil {
		t.Fatal(err)
	}
	first, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_TIMESTAMP)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	later, err := unix.GetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_TIMESTAMP)
	if err != nil {
		t.Fatal(err)
	}
	if int32(uint32(first)-c.TSVal) < 0 {
		t.Errorf("the restored clock reads %d, behind the %d it was given", uint32(first), c.TSVal)
	}
	if d := int32(uint32(later) - uint32(first)); first&1 != 0 || d < 40 || d > 1000 {
		t.Errorf("the restored clock moved %d in 50 ms (it reads %d: the low bit is the kernel's microsecond flag); want milliseconds", d, uint32(later))
	}
	// The connection still works.
	nc, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != "ping" {
		t.Fatalf("the peer read %q, %v", got, err)
	}
}
