// Package stack is the TCP/IP engine: IPv4, ARP (resolved through the
// kernel's neighbour table), UDP and TCP per RFC 9293, run to completion
// in the application's own goroutine, with every byte of its state in a
// memfd-backed image that onloadd can map and drive when the application
// stalls.
//
// Built so far: the stack lock (Lock), a word in shared memory with
// TryLock, Lock, LockOrDefer and an Unlock that does the deferred work.
// The image, the poll loop and the protocols are the engine issue's
// remaining work; see docs/ARCHITECTURE.md.
package stack
