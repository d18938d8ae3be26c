package xdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// AttachMode is where in the receive path an XDP program runs.
type AttachMode int

const (
	// AttachAuto tries native mode and falls back to generic mode.
	AttachAuto AttachMode = iota
	// AttachNative runs the program in the driver, before any socket
	// buffer is allocated. veth and most NIC drivers support it.
	AttachNative
	// AttachGeneric runs the program after the kernel has built a socket
	// buffer: it works on every device, at a cost per frame.
	AttachGeneric
)

func (m AttachMode) String() string {
	switch m {
	case AttachAuto:
		return "auto"
	case AttachNative:
		return "native"
	case AttachGeneric:
		return "generic"
	}
	return fmt.Sprintf("AttachMode(%d)", int(m))
}

// Attachment is an XDP program attached to an interface through a BPF link.
// The kernel detaches it when the link is closed or when the last process
// holding the link's fd exits, so a crash never leaves a stale program
// behind.
type Attachment struct {
	Interface Interface
	// Mode is the mode in use: AttachNative or AttachGeneric.
	Mode AttachMode
	// NativeErr says why native mode was refused when AttachAuto fell back
	// to generic mode; nil otherwise.
	NativeErr error
	link      link.Link
}

// Attach attaches prog to the named interface (in the calling thread's
// network namespace).
func Attach(prog *ebpf.Program, ifname string, mode AttachMode) (*Attachment, error) {
	iface, err := LookupInterface(ifname)
	if err != nil {
		return nil, err
	}
	a := &Attachment{Interface: iface}
	try := func(m AttachMode) error {
		flags := link.XDPDriverMode
		if m == AttachGeneric {
			flags = link.XDPGenericMode
		}
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: iface.Index, Flags: flags})
		if err != nil {
			return err
		}
		a.link, a.Mode = l, m
		return nil
	}
	switch mode {
	case AttachNative, AttachGeneric:
		err = try(mode)
	case AttachAuto:
		if err = try(AttachNative); err != nil && !busy(err) && !permission(err) {
			a.NativeErr = err
			err = try(AttachGeneric)
		}
	default:
		return nil, fmt.Errorf("attach xdp program: unknown mode %d", int(mode))
	}
	if err != nil {
		return nil, attachError(iface.Name, mode, err)
	}
	return a, nil
}

func busy(err error) bool { return errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) }

func permission(err error) bool { return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) }

func attachError(name string, mode AttachMode, err error) error {
	switch {
	case busy(err):
		return &Error{
			Msg: fmt.Sprintf("interface %s already has an XDP program attached (another accelerated process's stack, or a program of someone else's): run onloadd to share the interface, or detach it (ip link set dev %s xdp off) if nothing uses it",
				name, name),
			Kind: ErrProgramAttached, Err: err,
		}
	case permission(err):
		return &Error{Msg: fmt.Sprintf("attaching an XDP program to %s needs CAP_NET_ADMIN and CAP_BPF: run as root, or let onloadd make the stack (start onloadd; ONLOAD_DAEMON=auto)", name),
			Kind: ErrPermission, Err: err}
	case mode == AttachNative && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)):
		return &Error{Msg: fmt.Sprintf("the driver of interface %s has no native XDP; use generic mode (AttachAuto or AttachGeneric)", name),
			Kind: ErrNotSupported, Err: err}
	}
	return fmt.Errorf("attach xdp program to %s in %s mode: %w", name, mode, err)
}

// Close detaches the program.
func (a *Attachment) Close() error {
	if a == nil || a.link == nil {
		return nil
	}
	err := a.link.Close()
	a.link = nil
	if err != nil {
		return fmt.Errorf("detach xdp program from %s: %w", a.Interface.Name, err)
	}
	return nil
}
