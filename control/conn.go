package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Conn is one end of a control connection: whole messages with their
// descriptors. Its methods are not safe for concurrent use; Client
// serialises its calls.
type Conn struct {
	c   *net.UnixConn
	buf []byte
	oob []byte
}

// NewConn wraps an accepted or dialled SOCK_SEQPACKET connection.
func NewConn(c *net.UnixConn) *Conn {
	return &Conn{c: c, buf: make([]byte, MaxMessage+1), oob: make([]byte, unix.CmsgSpace(4*MaxFDs)+64)}
}

// Send writes v as one message with fds beside it.
func (c *Conn) Send(v any, fds ...int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode message: %w", err)
	}
	if len(b) > MaxMessage {
		return fmt.Errorf("message of %d bytes: the limit is %d", len(b), MaxMessage)
	}
	if len(fds) > MaxFDs {
		return fmt.Errorf("%d descriptors: a message carries at most %d", len(fds), MaxFDs)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	return nil
}

// SendRaw writes b as one message with control data oob, unchecked: for
// tests that play a broken or hostile client.
func (c *Conn) SendRaw(b, oob []byte) error {
	_, _, err := c.c.WriteMsgUnix(b, oob, nil)
	return err
}

// awaitReply blocks the calling thread in poll(2) until a message is
// there (or the connection ended), for up to replyWait; Recv then takes
// it without parking. onloadd answers in tens of microseconds, and the Go
// runtime's poller, where Recv would park, hands the message over through
// a wake-up of another thread first: an active open under onloadd (a
// filter for its port, a round trip) took 0.53-0.63 ms without it and
// 0.62-0.72 with it (4 alternating pairs, the median of 200 each).
// Past replyWait (onloadd slow, or a Close from another goroutine, which
// waits for the poll to end) Recv waits in the poller, to the deadline.
func (c *Conn) awaitReply() {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for end := time.Now().Add(replyWait); ; {
			left := time.Until(end)
			if left <= 0 {
				return
			}
			if _, err := unix.Poll(p, int((left+time.Millisecond-1)/time.Millisecond)); err != unix.EINTR {
				return
			}
		}
	})
}

// replyWait: see awaitReply.
const replyWait = 5 * time.Millisecond

// Recv reads one message and the descriptors that came with it (close
// them when done). A message too long, with too many descriptors or with
// cut-off control data is an error, and its descriptors are closed.
func (c *Conn) Recv() ([]byte, []int, error) {
	n, oobn, flags, _, err := c.c.ReadMsgUnix(c.buf, c.oob)
	var fds []int
	if oobn > 0 {
		fds = parseRights(c.oob[:oobn])
	}
	bad := func(format string, a ...any) ([]byte, []int, error) {
		CloseFDs(fds)
		return nil, nil, fmt.Errorf(format, a...)
	}
	switch {
	case errors.Is(err, io.EOF) || err == nil && n == 0:
		// A zero-length read is how SOCK_SEQPACKET reports the peer's
		// close (an empty message from the peer reads the same, and
		// is taken as its goodbye).
		CloseFDs(fds)
		return nil, nil, errClosed
	case err != nil:
		CloseFDs(fds)
		return nil, nil, err
	case flags&unix.MSG_TRUNC != 0 || n > MaxMessage:
		return bad("message longer than %d bytes", MaxMessage)
	case flags&unix.MSG_CTRUNC != 0:
		return bad("message with more descriptors than fit (at most %d)", MaxFDs)
	case len(fds) > MaxFDs:
		return bad("message with %d descriptors: at most %d", len(fds), MaxFDs)
	}
	return c.buf[:n], fds, nil
}

var errClosed = errors.New("connection closed by the other end")

// IsClosed reports whether err is the other end closing the connection.
func IsClosed(err error) bool { return errors.Is(err, errClosed) }

func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if rights, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, rights...)
		}
	}
	return fds
}

// CloseFDs closes every descriptor in fds.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// SetDeadline bounds the next Send or Recv.
func (c *Conn) SetDeadline(t time.Time) error { return c.c.SetDeadline(t) }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// Peer is the other end's process credentials (SO_PEERCRED), as they were
// when it connected.
func (c *Conn) Peer() (*unix.Ucred, error) {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, os.NewSyscallError("getsockopt SO_PEERCRED", serr)
	}
	return cred, nil
}

// Client is a process's connection to onloadd: requests go one at a time,
// each waiting for its reply.
type Client struct {
	mu     sync.Mutex
	conn   *Conn
	seq    uint32
	Hello  HelloReply // what the daemon said when the client connected
	broken error      // set once the connection is unusable
}

// callTimeout bounds one request's round trip: onloadd answers in
// microseconds unless it is stuck.
const callTimeout = 10 * time.Second

// Dial connects to onloadd at path and says hello as program.
func Dial(path, program string) (*Client, error) { return DialHello(path, Hello{Program: program}) }

// DialHello connects to onloadd at path and says hello.
func DialHello(path string, hello Hello) (*Client, error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	c := &Client{conn: NewConn(uc)}
	rep, fds, err := c.Call(Request{Op: OpHello, Hello: &hello})
	CloseFDs(fds)
	if err != nil {
		uc.Close()
		return nil, err
	}
	if rep.Hello == nil {
		uc.Close()
		return nil, errors.New("onloadd's reply to hello has no hello")
	}
	c.Hello = *rep.Hello
	return c, nil
}

// Call sends req (its V and Seq filled in) with fds and waits for the
// reply. An error reply is returned as an *Error, with the reply.
func (c *Client) Call(req Request, fds ...int) (*Reply, []int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, nil, c.broken
	}
	c.seq++
	req.V, req.Seq = Version, c.seq
	fail := func(err error) (*Reply, []int, error) {
		c.broken = fmt.Errorf("connection to onloadd: %w", err)
		return nil, nil, c.broken
	}
	c.conn.SetDeadline(time.Now().Add(callTimeout))
	defer c.conn.SetDeadline(time.Time{})
	if err := c.conn.Send(req, fds...); err != nil {
		return fail(err)
	}
	c.conn.awaitReply()
	b, rfds, err := c.conn.Recv()
	if err != nil {
		return fail(err)
	}
	rep, err := ParseReply(b)
	if err != nil {
		CloseFDs(rfds)
		return fail(err)
	}
	if rep.Seq != req.Seq {
		CloseFDs(rfds)
		return fail(fmt.Errorf("reply %d to request %d", rep.Seq, req.Seq))
	}
	if err := rep.Err(); err != nil {
		CloseFDs(rfds)
		return rep, nil, err
	}
	return rep, rfds, nil
}

// Peer is onloadd's process credentials (SO_PEERCRED).
func (c *Client) Peer() (*unix.Ucred, error) { return c.conn.Peer() }

// Close ends the connection; onloadd then releases what the client held.
func (c *Client) Close() error { return c.conn.Close() }
