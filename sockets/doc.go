// Package sockets will be the public API: Dial, Listen and ListenPacket in
// the shape of the standard net package, returning net.Conn, net.Listener
// and net.PacketConn backed by the stack, and falling back to the
// standard library for whatever is not accelerated.
//
// Not implemented yet: a placeholder that fixes the layout.
package sockets
