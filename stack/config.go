package stack

import (
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Config sizes a stack and sets its protocol parameters. The zero value of
// each field means its default. Sizes are fixed for the stack's life: the
// image is laid out once.
type Config struct {
	// Sockets is the size of the socket table (default 1024, at most
	// 1<<20). Opening more fails with ErrNoSockets.
	Sockets int
	// TimerSlots is the number of slots of the timer wheel, a power of two
	// (default 4096).
	TimerSlots int
	// Tick is the timer resolution (default 1ms, from 10µs to 100ms).
	Tick time.Duration

	// Addr is the stack's IPv4 address and subnet on its interface.
	Addr netip.Prefix
	// Gateway is the next hop for destinations outside Addr's subnet
	// (none by default: such destinations are unreachable).
	Gateway netip.Addr
	// MAC is the interface's Ethernet address.
	MAC net.HardwareAddr
	// MTU is the interface's MTU (default 1500).
	MTU int

	// RecvBuffer and SendBuffer are the default socket buffer sizes in bytes
	// (default 256 KiB each, from 2 KiB to 64 MiB).
	RecvBuffer, SendBuffer int
	// RecvBufferMax and SendBufferMax bound how far a connection's buffers
	// grow by themselves (default 4 MiB, and never below the defaults): the
	// receive buffer doubles when the peer fills the window while the
	// application keeps up, the send buffer follows twice the congestion
	// window, as Linux's tcp_rmem and tcp_wmem maxima. A buffer the user
	// sets (RecvBuffer, SendBuffer options) stays as set.
	RecvBufferMax, SendBufferMax int

	// Congestion is the congestion control of new connections: "cubic"
	// (RFC 9438, the default) or "reno" (NewReno, RFC 6582). The
	// Congestion option changes it per connection.
	Congestion string

	// MinRTO is the least retransmission timeout (default 200ms, as Linux;
	// from 1ms to 10s). RFC 6298 asks for 1s; LANs do better with less.
	MinRTO time.Duration
	// DelayedAck is how long an ACK may wait for data to ride on (default
	// 40ms, from 1ms to 500ms: RFC 1122 4.2.3.2).
	DelayedAck time.Duration
	// TimeWait is how long a closed connection stays in TIME-WAIT (default
	// 60s: 2MSL; from 1ms to 240s).
	TimeWait time.Duration
	// NotSentLowat is the TCP_NOTSENT_LOWAT of the connections that do not
	// set their own (or set 0), in bytes: the namespace's
	// net.ipv4.tcp_notsent_lowat, as KernelConfig reads it when the stack
	// is made. 0, the default, is no limit (the sysctl's default, the
	// most it holds).
	NotSentLowat uint32
}

// Bounds and defaults.
const (
	defaultSockets    = 1024
	maxSockets        = 1 << 20
	defaultTimerSlots = 4096
	defaultTick       = time.Millisecond
	defaultBuffer     = 256 << 10
	defaultBufferMax  = 4 << 20
	minBuffer         = 2 << 10
	maxBuffer         = 64 << 20
)

func (c *Config) setDefaults() error {
	if c.Sockets == 0 {
		c.Sockets = defaultSockets
	}
	if c.TimerSlots == 0 {
		c.TimerSlots = defaultTimerSlots
	}
	if c.Tick == 0 {
		c.Tick = defaultTick
	}
	if c.MTU == 0 {
		c.MTU = 1500
	}
	if c.RecvBuffer == 0 {
		c.RecvBuffer = defaultBuffer
	}
	if c.SendBuffer == 0 {
		c.SendBuffer = defaultBuffer
	}
	if c.RecvBufferMax == 0 {
		c.RecvBufferMax = max(defaultBufferMax, c.RecvBuffer)
	}
	if c.SendBufferMax == 0 {
		c.SendBufferMax = max(defaultBufferMax, c.SendBuffer)
	}
	if c.Congestion == "" {
		c.Congestion = "cubic"
	}
	if c.MinRTO == 0 {
		c.MinRTO = defaultMinRTO
	}
	if c.DelayedAck == 0 {
		c.DelayedAck = defaultDelAck
	}
	if c.TimeWait == 0 {
		c.TimeWait = defaultTimeWait
	}
	switch {
	case c.MinRTO < time.Millisecond || c.MinRTO > 10*time.Second:
		return fmt.Errorf("stack config: MinRTO %v: must be from 1ms to 10s", c.MinRTO)
	case c.DelayedAck < time.Millisecond || c.DelayedAck > 500*time.Millisecond:
		return fmt.Errorf("stack config: DelayedAck %v: must be from 1ms to 500ms", c.DelayedAck)
	case c.TimeWait < time.Millisecond || c.TimeWait > 240*time.Second:
		return fmt.Errorf("stack config: TimeWait %v: must be from 1ms to 240s", c.TimeWait)
	case c.Sockets < 1 || c.Sockets > maxSockets:
		return fmt.Errorf("stack config: Sockets %d: must be from 1 to %d", c.Sockets, maxSockets)
	case c.Tick < 10*time.Microsecond || c.Tick > 100*time.Millisecond:
		return fmt.Errorf("stack config: Tick %v: must be from 10µs to 100ms", c.Tick)
	case !c.Addr.IsValid() || !c.Addr.Addr().Is4() || c.Addr.Addr().IsUnspecified():
		return fmt.Errorf("stack config: Addr %v: an IPv4 address with its prefix length is needed, e.g. 198.18.0.1/24", c.Addr)
	case c.Gateway.IsValid() && (!c.Gateway.Is4() || !c.Addr.Contains(c.Gateway)):
		return fmt.Errorf("stack config: Gateway %v: must be an IPv4 address inside %v", c.Gateway, c.Addr.Masked())
	case len(c.MAC) != 6:
		return fmt.Errorf("stack config: MAC %v: an Ethernet address is needed", c.MAC)
	case c.MTU < 576 || c.MTU > 9000:
		return fmt.Errorf("stack config: MTU %d: must be from 576 to 9000", c.MTU)
	case c.RecvBuffer < minBuffer || c.RecvBuffer > maxBuffer:
		return fmt.Errorf("stack config: RecvBuffer %d: must be from %d to %d bytes", c.RecvBuffer, minBuffer, maxBuffer)
	case c.SendBuffer < minBuffer || c.SendBuffer > maxBuffer:
		return fmt.Errorf("stack config: SendBuffer %d: must be from %d to %d bytes", c.SendBuffer, minBuffer, maxBuffer)
	case c.RecvBufferMax < c.RecvBuffer || c.RecvBufferMax > maxBuffer:
		return fmt.Errorf("stack config: RecvBufferMax %d: must be from RecvBuffer (%d) to %d bytes", c.RecvBufferMax, c.RecvBuffer, maxBuffer)
	case c.SendBufferMax < c.SendBuffer || c.SendBufferMax > maxBuffer:
		return fmt.Errorf("stack config: SendBufferMax %d: must be from SendBuffer (%d) to %d bytes", c.SendBufferMax, c.SendBuffer, maxBuffer)
	case congestionAlgo(c.Congestion) < 0:
		return fmt.Errorf("stack config: Congestion %q: must be \"cubic\" or \"reno\"", c.Congestion)
	}
	return nil
}
