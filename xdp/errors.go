package xdp

import "errors"

// Kinds of failure a caller may want to tell apart with errors.Is. The
// errors this package returns also wrap the underlying errno.
var (
	// ErrQueueBusy: another AF_XDP socket (another UMEM) holds the device
	// queue.
	ErrQueueBusy = errors.New("queue busy")
	// ErrNoQueue: the device has no such queue.
	ErrNoQueue = errors.New("no such queue")
	// ErrNoInterface: no interface of that name in this network namespace.
	ErrNoInterface = errors.New("no such interface")
	// ErrPermission: the caller lacks a capability.
	ErrPermission = errors.New("permission denied")
	// ErrNotSupported: the kernel or driver lacks a feature.
	ErrNotSupported = errors.New("not supported")
	// ErrProgramAttached: the interface already runs an XDP program.
	ErrProgramAttached = errors.New("xdp program already attached")
)

// Error is an error a user sees: Msg is a whole sentence that names the
// cause and the fix. It matches its Kind and the underlying Err with
// errors.Is.
type Error struct {
	Msg  string
	Kind error
	Err  error
}

func (e *Error) Error() string { return e.Msg }

func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}
