// Package stack will be the TCP/IP engine: IPv4, ARP (resolved through the
// kernel's neighbour table), UDP and TCP per RFC 9293, run to completion
// in the application's own goroutine, with every byte of its state in a
// memfd-backed image that onloadd can map and drive when the application
// stalls.
//
// Not implemented yet: this package is a placeholder so that the layout
// and the import rule (sockets → stack → vnic → xdp) are fixed from the
// start. See docs/ARCHITECTURE.md and the engine issue.
package stack
