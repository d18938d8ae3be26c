// Package sockets is the public API of the accelerated stack, in the shape
// of the standard net package: Dial, DialTimeout, Dialer, Listen,
// ListenConfig and ListenPacket return net.Conn, net.Listener and
// net.PacketConn (*TCPConn, *TCPListener, *UDPConn) backed by the
// user-space TCP/IP engine (package stack) over AF_XDP. Change net.Dial to
// sockets.Dial and net.Listen to sockets.Listen; everything else stays.
//
// Whatever is not accelerated goes to the standard library with the same
// arguments: loopback and the host's other addresses, Unix sockets, IPv6,
// a Control function, or no usable interface (ONLOAD_LOG=debug says why).
//
// The process's default stack is made on first use from the ONLOAD_*
// variables (Options, docs/config.md) and closed after its last socket.
// Blocking calls spin for a while (one goroutine per stack), then park on
// a channel; one goroutine per stack (interrupts.Sleeper) polls when
// nobody else does and sleeps on the AF_XDP socket's readiness.
package sockets
