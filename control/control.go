// Package control is the protocol between onloadd and the processes it
// serves: a request and its reply, one JSON object each, in one datagram
// of a SOCK_SEQPACKET Unix socket, with file descriptors passed beside
// them (SCM_RIGHTS). Both sides import it: sockets (the client) and the
// daemon.
//
// A connection begins with a hello that names the protocol version; every
// request carries a sequence number its reply echoes. Every message is
// checked before use: its size (MaxMessage), its fields (unknown fields
// are refused), the number of descriptors that came with it. A message
// that fails a check gets an error reply and changes nothing.
package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
)

// Version is the protocol version this build speaks. A daemon refuses a
// client of another version with a sentence that names both.
const Version = 1

// MaxMessage is the largest message either side sends or accepts, in
// bytes; MaxFDs the most descriptors one message carries.
const (
	MaxMessage = 64 << 10
	MaxFDs     = 4
)

// DefaultSocket is where onloadd listens unless told otherwise
// (ONLOAD_DAEMON_SOCKET, onloadd serve -socket).
const DefaultSocket = "/run/onload/onloadd.sock"

// Op is what a request asks for.
type Op string

const (
	// OpHello opens a connection: the client's version and name. It must
	// be the first request, and comes once.
	OpHello Op = "hello"
	// OpStack asks for a stack on an interface (a new one, or the named
	// one to share). The reply carries the stack's descriptors: the UMEM
	// memfd, the AF_XDP socket and the image memfd, in that order.
	OpStack Op = "stack"
	// OpFilter steers a port to one of the client's stacks. The request
	// carries one descriptor: a kernel socket bound to that address and
	// port, the proof that the client owns it. onloadd keeps it for as
	// long as the filter lives.
	OpFilter Op = "filter"
	// OpUnfilter removes a filter the client added.
	OpUnfilter Op = "unfilter"
	// OpDump asks for the daemon's state: its stacks, their processes,
	// queues and filters.
	OpDump Op = "dump"
	// OpResolve asks onloadd to have the kernel resolve a neighbour of
	// one of the client's stacks (an ARP request: the kernel lets only
	// privileged processes ask for one).
	OpResolve Op = "resolve"
	// OpKill ends an orphan stack (its processes are gone): its
	// connections are reset and it is released at once. Root, or the
	// stack's user, may ask.
	OpKill Op = "kill"
	// OpHandover hands a connection of one of the client's stacks over
	// to the kernel, live (TCP_REPAIR, which only onloadd may do). The
	// request carries one descriptor: the kernel socket the connection
	// becomes (its own, so that every holder of it holds the kernel's
	// connection after). Root, or the stack's user, may ask: a child
	// forked after the stack loaded, which cannot run the stack, asks
	// on its first use of an inherited connection. Of a listener, sent
	// with the listener's own kernel socket (the port's proof), the
	// port goes to that socket (the listener is retired), which the
	// child shares with its parent.
	OpHandover Op = "handover"
	// OpDrain hands every connection of a stack over to the kernel, on
	// the kernel socket that names it in its process (as onloadd does
	// for all its stacks when it stops): stackdump handover. Root, or
	// the stack's user, may ask.
	OpDrain Op = "drain"
)

// Request is one message from a client. Exactly the field its Op names is
// set.
type Request struct {
	V        int              `json:"v"`
	Seq      uint32           `json:"seq"`
	Op       Op               `json:"op"`
	Hello    *Hello           `json:"hello,omitempty"`
	Stack    *StackRequest    `json:"stack,omitempty"`
	Filter   *FilterRequest   `json:"filter,omitempty"`
	Dump     *DumpRequest     `json:"dump,omitempty"`
	Resolve  *ResolveRequest  `json:"resolve,omitempty"`
	Kill     *KillRequest     `json:"kill,omitempty"`
	Handover *HandoverRequest `json:"handover,omitempty"`
	Drain    *DrainRequest    `json:"drain,omitempty"`
}

// DrainRequest names the stack whose connections to hand over.
type DrainRequest struct {
	Stack uint32 `json:"stack"`
}

// DrainReply says how many of the stack's connections went to the
// kernel, of how many established ones.
type DrainReply struct {
	Moved int `json:"moved"`
	Of    int `json:"of"`
}

// HandoverRequest names the connection to hand over: its stack and its
// socket (stack.SockID).
type HandoverRequest struct {
	Stack uint32 `json:"stack"`
	Sock  uint32 `json:"sock"`
}

// HandoverReply says what the handover moved.
type HandoverReply struct {
	Unread int   `json:"unread"` // bytes received and not read, then in the kernel's receive queue
	Sent   int   `json:"sent"`   // sent and not acknowledged
	Unsent int   `json:"unsent"`
	TookNs int64 `json:"took_ns"` // out of everyone's hands this long
}

// KillRequest names the orphan stack to end.
type KillRequest struct {
	Stack uint32 `json:"stack"`
}

// ResolveRequest names a neighbour of a stack to resolve.
type ResolveRequest struct {
	Stack uint32 `json:"stack"`
	Addr  string `json:"addr"` // an IPv4 address on the stack's subnet
}

// Hello is a client's first request.
type Hello struct {
	// Program names the client in logs and dumps (its command name).
	Program string `json:"program,omitempty"`
	// Secure says the client runs in the dynamic loader's secure mode (a
	// set-user-ID program under the shim): its environment, which chose
	// the stack's name, is a less privileged user's, so it shares and
	// adopts only stacks of its own (effective) user's, root or not.
	Secure bool `json:"secure,omitempty"`
}

// StackRequest asks for a stack.
type StackRequest struct {
	// Interface is the device to accelerate; "" lets the daemon choose
	// (the one it serves, or the default route's).
	Interface string `json:"interface,omitempty"`
	// Name, if set, names a stack that processes share: the first asks
	// for it to be made, the others join it (Onload's EF_NAME). Without
	// a name the client gets a stack of its own.
	Name string `json:"name,omitempty"`
	// Cluster, with Name, asks for a member of the named cluster
	// (Onload's EF_CLUSTER_NAME): a stack of the process's own, on a
	// queue of its own while the interface has one free (then it joins
	// the member with the fewest processes), the members sharing their
	// SO_REUSEPORT ports, each taking the connections that arrive on its
	// queue.
	Cluster bool `json:"cluster,omitempty"`
	// The NIC's sizes (0: the daemon's defaults). A joining client's are
	// ignored: the stack has its own.
	Frames    int `json:"frames,omitempty"`
	RingSize  int `json:"ring_size,omitempty"`
	FillDepth int `json:"fill_depth,omitempty"`
	// The image's sizes and TCP defaults (0: the engine's defaults).
	Image ImageConfig `json:"image"`
}

// ImageConfig is what the stack's image is made with: the parts of the
// engine's configuration that a client chooses.
type ImageConfig struct {
	Sockets       int    `json:"sockets,omitempty"`
	MinRTOMs      int    `json:"min_rto_ms,omitempty"`
	DelayedAckMs  int    `json:"delayed_ack_ms,omitempty"`
	TimeWaitMs    int    `json:"time_wait_ms,omitempty"`
	SendBuffer    int    `json:"send_buffer,omitempty"`
	RecvBuffer    int    `json:"recv_buffer,omitempty"`
	SendBufferMax int    `json:"send_buffer_max,omitempty"`
	RecvBufferMax int    `json:"recv_buffer_max,omitempty"`
	Congestion    string `json:"congestion,omitempty"`
}

// StackReply describes the stack whose descriptors come with it.
type StackReply struct {
	ID        uint32 `json:"id"`
	Name      string `json:"name,omitempty"`
	Joined    bool   `json:"joined,omitempty"` // an existing shared stack
	Interface string `json:"interface"`
	Queue     int    `json:"queue"`
	Addr      string `json:"addr"` // the stack's address and subnet, 198.18.0.2/24
	// The NIC's sizes, for mapping the UMEM and rings.
	FrameSize int `json:"frame_size"`
	Frames    int `json:"frames"`
	RingSize  int `json:"ring_size"`
	FillDepth int `json:"fill_depth"`
	// KernelConnects says why the connections the stack's processes open
	// go to the kernel; empty, they are the stack's. The steering program
	// hands a frame to the stack only on the stack's queue, and on an
	// interface whose frames arrive on the queue their sender picked (a
	// veth of several queues) nothing puts a peer's replies there.
	KernelConnects string `json:"kernel_connects,omitempty"`
}

// Filter kinds.
const (
	// Listen steers every frame to a local address and port (the
	// address may be 0.0.0.0: all of the interface's).
	Listen = "listen"
)

// FilterRequest steers the frames of a local port to a stack.
type FilterRequest struct {
	Stack uint32 `json:"stack"`
	Kind  string `json:"kind"`  // Listen
	Proto string `json:"proto"` // "tcp" or "udp"
	Local string `json:"local"` // address:port
	// Shared: other processes hold the proof's socket too and may
	// accept on it (a pre-fork server's workers, which inherited it).
	// In a cluster such a port is shared as an SO_REUSEPORT port is, by
	// the members that hold the same socket.
	Shared bool `json:"shared,omitempty"`
	// Retire (OpUnfilter): the stack's last listener on the port closed
	// while connections of it live on: onloadd steers each by a flow
	// entry and ends the filter, so that new connections to the port go
	// to the kernel (stack.ListenerRetirer).
	Retire bool `json:"retire,omitempty"`
}

// LocalAddrPort parses Local.
func (f *FilterRequest) LocalAddrPort() (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(f.Local)
	if err != nil {
		return ap, fmt.Errorf("filter local address %q: %w", f.Local, err)
	}
	if !ap.Addr().Is4() {
		return ap, fmt.Errorf("filter local address %s: only IPv4 is steered", ap)
	}
	if ap.Port() == 0 {
		return ap, fmt.Errorf("filter local address %s: a port is needed", ap)
	}
	return ap, nil
}

// DumpRequest asks for the daemon's state.
type DumpRequest struct {
	// Engine asks for each stack's engine dump too (text: counters,
	// neighbours, every socket's TCP state), which takes the stack's
	// lock a second time.
	Engine bool `json:"engine,omitempty"`
}

// Reply is the daemon's answer to the request with the same Seq. Error,
// if set, is a sentence for the user, and Code says what kind of refusal
// it is; otherwise the field the request's Op names is set.
type Reply struct {
	V        int            `json:"v"`
	Seq      uint32         `json:"seq"`
	Error    string         `json:"error,omitempty"`
	Code     Code           `json:"code,omitempty"`
	Hello    *HelloReply    `json:"hello,omitempty"`
	Stack    *StackReply    `json:"stack,omitempty"`
	Dump     *Dump          `json:"dump,omitempty"`
	Kill     *KillReply     `json:"kill,omitempty"`
	Handover *HandoverReply `json:"handover,omitempty"`
	Drain    *DrainReply    `json:"drain,omitempty"`
}

// KillReply says what ending an orphan stack did.
type KillReply struct {
	Reset int `json:"reset"` // sockets reset (connections, listeners, UDP)
}

// HelloReply is the daemon's side of the hello.
type HelloReply struct {
	Daemon string `json:"daemon"` // onloadd's version
	PID    int    `json:"pid"`
}

// Code classifies an error reply.
type Code string

const (
	CodeInvalid     Code = "invalid"     // the request is malformed or out of order
	CodeDenied      Code = "denied"      // the client may not do this
	CodeInUse       Code = "in-use"      // the port or queue belongs to someone else
	CodeExhausted   Code = "exhausted"   // no queue, stack id or memory left
	CodeUnavailable Code = "unavailable" // the interface cannot be served
	CodeInternal    Code = "internal"    // the daemon failed; its log says why
	CodeNamespace   Code = "namespace"   // the client is in another network namespace
)

// Error is an error reply, as the client sees it.
type Error struct {
	Code Code
	Msg  string
}

func (e *Error) Error() string { return "onloadd: " + e.Msg }

// Err returns the reply's error, or nil.
func (r *Reply) Err() error {
	if r.Error == "" {
		return nil
	}
	return &Error{Code: r.Code, Msg: r.Error}
}

// Dump is the daemon's state.
type Dump struct {
	Daemon     string          `json:"daemon"`
	PID        int             `json:"pid"`
	Stacks     []StackDump     `json:"stacks"`
	Interfaces []InterfaceDump `json:"interfaces"`
}

// InterfaceDump is an interface onloadd serves: how it is steered, and
// the entries in its steering program's maps (read from the kernel).
type InterfaceDump struct {
	Name      string `json:"name"`
	Queues    int    `json:"queues"`
	Steering  string `json:"steering"`
	Listeners int    `json:"listeners"` // port entries
	Flows     int    `json:"flows"`     // connection entries
	// Clusters: each port of a cluster, with the member stack of each
	// queue as the steering program's map has them, "web tcp
	// 0.0.0.0:8080: queue 0 stack 1, queue 1 stack 2".
	Clusters []string `json:"clusters,omitempty"`
	Error    string   `json:"error,omitempty"`
}

// StackDump is one stack in a Dump.
type StackDump struct {
	ID        uint32       `json:"id"`
	Name      string       `json:"name,omitempty"`
	Cluster   bool         `json:"cluster,omitempty"` // a member of cluster Name
	Interface string       `json:"interface"`
	Queue     int          `json:"queue"`
	Addr      string       `json:"addr"`
	Clients   []ClientDump `json:"clients"`
	Filters   []string     `json:"filters"`
	Sockets   []SocketDump `json:"sockets"`
	// SocketsCut counts the sockets left out of Sockets, FiltersCut the
	// filters left out of Filters, and EngineCut the bytes left out of
	// Engine, to keep the dump within MaxMessage.
	SocketsCut int `json:"sockets_cut,omitempty"`
	FiltersCut int `json:"filters_cut,omitempty"`
	EngineCut  int `json:"engine_cut,omitempty"`
	// Takeovers is how many times onloadd polled the stack because its
	// processes did not; StalledMs, how long the current stall has
	// lasted (0: none); Watch, why onloadd no longer watches it, if so.
	Takeovers uint64 `json:"takeovers"`
	// Handovers counts the connections handed over to the kernel
	// (the engine's TCPHandovers).
	Handovers uint64 `json:"handovers,omitempty"`
	StalledMs int64  `json:"stalled_ms,omitempty"`
	Watch     string `json:"watch,omitempty"`
	// Orphan: the stack's processes are gone and onloadd finishes its
	// connections; InUse sockets are left (closing, or in TIME-WAIT).
	Orphan bool `json:"orphan,omitempty"`
	InUse  int  `json:"in_use"`
	// Quarantined says why onloadd cut the stack off (its image was
	// found corrupt), if it did.
	Quarantined string `json:"quarantined,omitempty"`
	// LockBreaks counts the stack locks onloadd broke, of processes that
	// died holding them; LockHolder is the process id (as it sees itself)
	// that holds the lock now, 0 if it is free.
	LockBreaks uint64 `json:"lock_breaks,omitempty"`
	LockHolder int    `json:"lock_holder,omitempty"`
	// Engine is the engine's own dump: counters and sockets, from the
	// image (read by the daemon, which checks it like any image data).
	Engine string `json:"engine,omitempty"`
}

// SocketDump is one socket of a stack, in netstat's terms.
type SocketDump struct {
	Proto    string `json:"proto"`
	State    string `json:"state,omitempty"`
	Local    string `json:"local"`
	Remote   string `json:"remote"`
	SendQ    uint32 `json:"send_q"`
	RecvQ    uint32 `json:"recv_q"`
	Cwnd     uint32 `json:"cwnd,omitempty"`
	RTTus    int64  `json:"rtt_us,omitempty"`
	RetransB uint32 `json:"retrans_bytes,omitempty"`
	OwnerPID int    `json:"owner_pid,omitempty"`
}

// ClientDump is one process attached to a stack.
type ClientDump struct {
	PID     int    `json:"pid"`
	UID     int    `json:"uid"`
	Program string `json:"program,omitempty"`
}

// ParseRequest decodes and checks one request: the version, that the
// field its Op names is the one set, and no unknown fields.
func ParseRequest(b []byte) (*Request, error) {
	var r Request
	if err := decodeStrict(b, &r); err != nil {
		return nil, fmt.Errorf("malformed request: %w", err)
	}
	if r.V != Version {
		return &r, fmt.Errorf("protocol version %d: this onloadd speaks version %d (the client and onloadd come from different builds)", r.V, Version)
	}
	set := 0
	for _, p := range []bool{r.Hello != nil, r.Stack != nil, r.Filter != nil, r.Dump != nil, r.Resolve != nil, r.Kill != nil, r.Handover != nil, r.Drain != nil} {
		if p {
			set++
		}
	}
	var want bool
	switch r.Op {
	case OpHello:
		want = r.Hello != nil
	case OpStack:
		want = r.Stack != nil
	case OpFilter, OpUnfilter:
		want = r.Filter != nil
	case OpDump:
		want = r.Dump != nil
	case OpResolve:
		want = r.Resolve != nil
	case OpKill:
		want = r.Kill != nil
	case OpHandover:
		want = r.Handover != nil
	case OpDrain:
		want = r.Drain != nil
	default:
		return &r, fmt.Errorf("unknown request %q", r.Op)
	}
	if !want || set != 1 {
		return &r, fmt.Errorf("request %q must carry its own body and no other", r.Op)
	}
	return &r, nil
}

// ParseReply decodes one reply.
func ParseReply(b []byte) (*Reply, error) {
	var r Reply
	if err := decodeStrict(b, &r); err != nil {
		return nil, fmt.Errorf("malformed reply from onloadd: %w", err)
	}
	if r.V != Version {
		return nil, fmt.Errorf("onloadd speaks protocol version %d, this program version %d: they come from different builds", r.V, Version)
	}
	return &r, nil
}

func decodeStrict(b []byte, v any) error {
	if len(b) > MaxMessage {
		return fmt.Errorf("%d bytes: the limit is %d", len(b), MaxMessage)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("more than one object")
	}
	return nil
}
