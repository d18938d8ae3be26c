package stack

import "syscall"

// Errno is an error that also matches a system error number with
// errors.Is, so that the sockets layer can report exactly what the kernel
// would.
type Errno struct {
	Msg   string
	Errno syscall.Errno
}

func (e *Errno) Error() string { return e.Msg }

// Is matches the error number, bare or in another Errno: ErrFramesBusy
// is an ErrWouldBlock.
func (e *Errno) Is(target error) bool {
	if t, ok := target.(*Errno); ok {
		return t.Errno == e.Errno
	}
	return target == e.Errno
}

func (e *Errno) Unwrap() error { return e.Errno }

// Errors the engine returns. They are values: returning one allocates
// nothing.
var (
	// ErrWouldBlock: the operation cannot complete now (EAGAIN).
	ErrWouldBlock = &Errno{"operation would block", syscall.EAGAIN}
	// ErrFramesBusy: a TCP send would block because the stack's frames are
	// in use (EAGAIN, and errors.Is(err, ErrWouldBlock)). Frames coming
	// back do not make the socket writable: retry after a short while.
	ErrFramesBusy = &Errno{"operation would block: the stack's frames are all in use; retry shortly", syscall.EAGAIN}
	// ErrBadSocket: the SockID was closed or never valid (EBADF).
	ErrBadSocket = &Errno{"bad socket: closed or never opened", syscall.EBADF}
	// ErrNoSockets: the socket table is full (EMFILE).
	ErrNoSockets = &Errno{"stack socket table is full: raise Config.Sockets", syscall.EMFILE}
	// ErrNoBuffers: no free frame to send with (ENOBUFS).
	ErrNoBuffers = &Errno{"no free frames: the stack holds too much unsent or unread data", syscall.ENOBUFS}
	// ErrAddrInUse: the address and port are taken (EADDRINUSE).
	ErrAddrInUse = &Errno{"address already in use", syscall.EADDRINUSE}
	// ErrAddrNotAvail: not one of the stack's addresses (EADDRNOTAVAIL).
	ErrAddrNotAvail = &Errno{"address not available: not this stack's address", syscall.EADDRNOTAVAIL}
	// ErrTupleInUse: a connection from the socket's port to that peer
	// exists already (EADDRNOTAVAIL, as Linux's connect).
	ErrTupleInUse = &Errno{"address not available: a connection from this port to that peer exists already", syscall.EADDRNOTAVAIL}
	// ErrNoPorts: every ephemeral port is taken (EADDRNOTAVAIL).
	ErrNoPorts = &Errno{"no free ephemeral port", syscall.EADDRNOTAVAIL}
	// ErrInvalid: an argument is wrong for this socket (EINVAL).
	ErrInvalid = &Errno{"invalid argument", syscall.EINVAL}
	// ErrDestAddrRequired: a send without a destination on an unconnected
	// socket (EDESTADDRREQ).
	ErrDestAddrRequired = &Errno{"destination address required", syscall.EDESTADDRREQ}
	// ErrMsgSize: the datagram does not fit one frame (EMSGSIZE).
	ErrMsgSize = &Errno{"message too long for one datagram (no fragmentation)", syscall.EMSGSIZE}
	// ErrHostUnreachable: no route to the destination (EHOSTUNREACH).
	ErrHostUnreachable = &Errno{"no route to host: outside the stack's subnet and no gateway", syscall.EHOSTUNREACH}
	// ErrNoNeighbour: the next hop's Ethernet address is not known
	// (EHOSTUNREACH).
	ErrNoNeighbour = &Errno{"next hop's Ethernet address is unknown (no neighbour entry)", syscall.EHOSTUNREACH}
	// ErrInProgress: a connection is being made; the socket turns writable
	// when it is up (EINPROGRESS).
	ErrInProgress = &Errno{"connection in progress", syscall.EINPROGRESS}
	// ErrAlready: a connection is already being made (EALREADY).
	ErrAlready = &Errno{"connection already in progress", syscall.EALREADY}
	// ErrIsConn: the socket is already connected (EISCONN).
	ErrIsConn = &Errno{"socket is already connected", syscall.EISCONN}
	// ErrNotConn: the socket is not connected (ENOTCONN).
	ErrNotConn = &Errno{"socket is not connected", syscall.ENOTCONN}
	// ErrPipe: the socket can no longer send (EPIPE).
	ErrPipe = &Errno{"broken pipe: the connection can no longer send", syscall.EPIPE}
	// ErrConnRefused: the peer refused the connection (ECONNREFUSED).
	ErrConnRefused = &Errno{"connection refused", syscall.ECONNREFUSED}
	// ErrConnReset: the peer reset the connection (ECONNRESET).
	ErrConnReset = &Errno{"connection reset by peer", syscall.ECONNRESET}
	// ErrTimedOut: the peer stopped answering (ETIMEDOUT).
	ErrTimedOut = &Errno{"connection timed out", syscall.ETIMEDOUT}
	// ErrNotSupported: not implemented for this kind of socket
	// (EOPNOTSUPP).
	ErrNotSupported = &Errno{"operation not supported on this socket", syscall.EOPNOTSUPP}
)

// errnoError is the error value of a pending error number.
func errnoError(e uint32) error {
	switch syscall.Errno(e) {
	case syscall.ECONNREFUSED:
		return ErrConnRefused
	case syscall.ECONNRESET:
		return ErrConnReset
	case syscall.ETIMEDOUT:
		return ErrTimedOut
	}
	return &Errno{Msg: syscall.Errno(e).Error(), Errno: syscall.Errno(e)}
}
