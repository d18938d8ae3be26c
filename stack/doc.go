// Package stack is the TCP/IP engine: IPv4, neighbours (resolved through
// the kernel's table), UDP and TCP per RFC 9293, run to completion in the
// caller's goroutine, with every byte of its state in a memfd-backed image
// (Image) that a second process can map and drive when the owner stalls.
//
// A Stack is one process's handle on an image and a vnic.NIC. Its socket
// operations (Open, Bind, Listen, Accept, Connect, Send, Recv, SendTo,
// RecvFrom, Shutdown, Close, SetOption, Events) never block: an operation
// that would wait returns ErrWouldBlock (or ErrInProgress for a TCP
// connect). Poll moves frames in and out and runs timers; Recv polls when
// its socket has nothing queued. Every method takes the stack lock (Lock),
// a word in the image; functions that need it held end in Locked.
//
// Errors are *Errno values that match the system error numbers with
// errors.Is, so that the sockets layer reports exactly what the kernel
// would. See docs/ARCHITECTURE.md for the design.
package stack
