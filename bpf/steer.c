//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// steer: the XDP program that decides, for every frame arriving on an
// interface, whether it belongs to one of our stacks (redirect it into that
// stack's AF_XDP socket) or to the kernel (XDP_PASS).
//
// Lookup order, first match wins:
//   1. flows:     (protocol, local addr, remote addr, local port, remote port)
//   2. listeners: (protocol, local addr, local port)
//   3. listeners: (protocol, 0.0.0.0,    local port)   -- wildcard bind
// The value is a stack id. The frame goes to the XSK in slot
//   stack * MAX_QUEUES + rx_queue_index
// because an AF_XDP socket only receives frames from the (device, queue) it
// is bound to.
//
// Clusters: a listener entry may name a cluster instead (CLUSTER_BIT set,
// the cluster's id below it): stacks that each listen on the port, one a
// queue (Onload's clusters, for SO_REUSEPORT). The cluster_members array
// names the stack for (cluster, rx_queue_index); the frame goes to it.
// A frame arriving on a queue with no member goes to the kernel, whose
// listening socket (the listeners' kernel halves) takes the connection.
// A connection's frames must keep to one queue: the NIC's RSS hash does
// that; on veth, the sender's transmit queue.
//
// Frames we do not handle are passed to the kernel untouched and counted:
// anything not IPv4 (ARP, IPv6), VLAN-tagged frames, broadcast/multicast,
// protocols other than TCP and UDP (ICMP), IP fragments (the stack does not
// reassemble; the kernel does, and delivers to the port's reserving socket),
// and malformed or truncated headers (the kernel counts and drops them).
// IPv4 options are accepted: the ports are found after them.
//
// A frame that matches an entry but whose stack has no socket on the queue it
// arrived on is dropped and counted, not passed: the kernel does not know the
// connection and would answer it with a reset.
//
// Lanes: a stack may have more receive rings on a queue (AF_XDP sockets
// sharing its UMEM and fill ring), one per thread that serves connections,
// so that a frame wakes the thread that waits for it. The lanes array maps
// a bucket of the flow's hash (lane_hash) to a lane and the queue it is
// bound to; a frame whose bucket names a lane with a socket in lane_xsks,
// on the queue it arrived on, goes there, and any other to the stack's own
// socket. Two flows in one bucket share its lane: a hint, never a rule,
// since every lane's frames are the stack's, whoever polls them.
//
// Lazy interrupts: a stack about to sleep sets its armed flag in the
// mmapable control array (a plain store, no system call). Redirecting to an
// armed stack clears the flag and posts one wake event on the events ring
// buffer, which onloadd reads. The flag is tested and cleared without an
// atomic exchange (which would need Linux 5.12): two CPUs racing may both
// post, and a duplicate wake-up is harmless; a lost one cannot happen because
// both see the flag set.

#include "include/bpf_defs.h"

#define MAX_STACKS 256
#define MAX_QUEUES 64
#define CLUSTER_BIT 0x80000000u // a listener entry naming a cluster
#define KERNEL_BIT 0x40000000u  // a listener entry whose port the kernel may have connections on
#define MAX_LANES 16	 // per stack; lane 0 is the stack's own socket
#define LANE_BUCKETS 1024 // per stack, a power of two
#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_8021Q 0x8100
#define ETH_P_8021AD 0x88A8
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define IP_MF 0x2000
#define TCP_SYN 0x02
#define TCP_ACK 0x10
#define IP_OFFSET 0x1FFF

char __license[] SEC("license") = "Dual MIT/GPL";

// Counter indices; bpf/counters.go mirrors them in the same order.
enum counter {
	CTR_RX = 0,            // frames seen
	CTR_REDIRECT_FLOW,     // redirected by a flow entry
	CTR_REDIRECT_LISTENER, // redirected by a listener entry
	CTR_PASS_NOT_IPV4,     // ARP, IPv6, other ethertypes
	CTR_PASS_VLAN,         // 802.1Q / 802.1ad tagged
	CTR_PASS_NOT_UNICAST,  // broadcast or multicast destination MAC
	CTR_PASS_OTHER_PROTO,  // ICMP and every protocol but TCP and UDP
	CTR_PASS_FRAGMENT,     // IPv4 fragments
	CTR_PASS_MALFORMED,    // truncated or inconsistent headers
	CTR_PASS_NO_MATCH,     // TCP/UDP with no flow or listener entry
	CTR_PASS_BAD_ENTRY,    // an entry names a stack id out of range
	CTR_DROP_NO_XSK,       // matched, but no socket for that stack and queue
	CTR_WAKEUP,            // wake events posted
	CTR_WAKEUP_LOST,       // wake events lost: ring buffer full
	CTR_PASS_KERNEL_FLOW,  // a listener's port, but a connection of the kernel's
	CTR_REDIRECT_LANE,     // redirected (by a flow or listener entry) to a lane
	CTR_PASS_FULL,         // a SYN for a listener of a stack whose socket table is full
	CTR_PASS_NO_MEMBER,    // a cluster's port, on a queue no member stack has
	CTR_DROP_HELD,         // a SYN for a cluster's port, on a queue held for its member
	CTR_MAX,
};

struct listener_key {
	__be32 addr; // local address, 0 for a wildcard bind
	__be16 port; // local port
	__u8 proto;  // IPPROTO_TCP or IPPROTO_UDP
	__u8 pad;
};

struct flow_key {
	__be32 local_addr;
	__be32 remote_addr;
	__be16 local_port;
	__be16 remote_port;
	__u8 proto;
	__u8 pad[3];
};

// One cache line per stack so that stacks do not share lines.
struct stack_ctl {
	__u32 armed;   // 1: the stack sleeps and wants a wake event
	__u32 wakeups; // wake events posted for this stack
	__u32 full;    // 1: its socket table is (nearly) full: new connections go to the kernel
	__u32 pad[13];
};

struct wake_event {
	__u32 stack;
	__u32 queue;
};

// kernel_flows[0] is 1 once the kernel may have connections on a port a
// listener entry steers, whatever that entry's KERNEL_BIT says: the
// program sets it when it passes a SYN the stack could have had (a full
// stack, a cluster's queue without a member), user space at a handover.
// Nothing clears it.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} kernel_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct listener_key);
	__type(value, __u32);
} listeners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct flow_key);
	__type(value, __u32);
} flows SEC(".maps");

/* An XSKMAP's key and value by their sizes, not BTF types: the kernel
 * takes no BTF for this map type, and a loader that offers it (cilium/ebpf
 * does, then retries without) has the map made and freed first, and the
 * free waits out an RCU grace period: some 18 ms of every stack's start,
 * for each of the two maps. */
#define XSKMAP_SIZES __uint(key_size, sizeof(__u32)); __uint(value_size, sizeof(__u32))

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_STACKS * MAX_QUEUES);
	XSKMAP_SIZES;
} xsks SEC(".maps");

// stack * LANE_BUCKETS + bucket: 0 for none, or lane | queue << 8.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_STACKS * LANE_BUCKETS);
	__type(key, __u32);
	__type(value, __u32);
} lanes SEC(".maps");

// stack * MAX_LANES + lane.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_STACKS * MAX_LANES);
	XSKMAP_SIZES;
} lane_xsks SEC(".maps");

// cluster * MAX_QUEUES + queue: 0 for none, the member stack + 1, or
// MEMBER_HELD: the queue's member stack is made but does not listen on the
// port yet (onloadd holds the queue for it, a second at most): a SYN is
// dropped (its client sends it again, by then to the member), the rest
// go to the kernel, as with no member.
#define MEMBER_HELD 0xffffffffu
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_STACKS * MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} cluster_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_STACKS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct stack_ctl);
} control SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 * 1024);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CTR_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

// Force BTF for types only user space uses, so bpf2go can generate them.
const struct wake_event *unused_wake_event __attribute__((unused));

static __always_inline void count(__u32 idx)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &idx);
	if (c)
		*c += 1; // per-CPU: no atomic needed
}

static __always_inline int pass(__u32 idx)
{
	count(idx);
	return XDP_PASS;
}

// kernel_flows_set records that the kernel now has, or may have, a
// connection on a listener entry's port (kernel_flows).
static __always_inline void kernel_flows_set(void)
{
	__u32 zero = 0;
	__u32 *k = bpf_map_lookup_elem(&kernel_flows, &zero);
	if (k && !*k)
		*k = 1;
}

// kernel_flows_any reports kernel_flows[0].
static __always_inline int kernel_flows_any(void)
{
	__u32 zero = 0;
	__u32 *k = bpf_map_lookup_elem(&kernel_flows, &zero);
	return k && *(volatile __u32 *)k;
}

static __always_inline void wake(__u32 stack, __u32 queue)
{
	struct stack_ctl *ctl = bpf_map_lookup_elem(&control, &stack);
	if (!ctl)
		return;
	volatile __u32 *armed = &ctl->armed;
	if (!*armed)
		return;
	*armed = 0;
	__sync_fetch_and_add(&ctl->wakeups, 1);

	struct wake_event ev = {.stack = stack, .queue = queue};
	if (bpf_ringbuf_output(&events, &ev, sizeof(ev), 0) < 0)
		count(CTR_WAKEUP_LOST);
	else
		count(CTR_WAKEUP);
}

// lane_hash is the flow's bucket; bpf.LaneBucket computes the same from
// the addresses and ports in network order.
static __always_inline __u32 lane_hash(const struct flow_key *fk)
{
	__u32 h = fk->remote_addr * 0x9E3779B1u;
	h ^= fk->local_addr * 0x85EBCA77u;
	h ^= (((__u32)fk->remote_port << 16) | fk->local_port) * 0xC2B2AE3Du;
	return (h ^ (h >> 15)) & (LANE_BUCKETS - 1);
}

SEC("xdp")
int steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;

	count(CTR_RX);

	// Ethernet: 14 bytes.
	if (data + 14 > data_end)
		return pass(CTR_PASS_MALFORMED);
	__u8 *eth = data;
	if (eth[0] & 1) // group bit: broadcast or multicast
		return pass(CTR_PASS_NOT_UNICAST);
	__be16 proto = *(__be16 *)(eth + 12);
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD))
		return pass(CTR_PASS_VLAN);
	if (proto != bpf_htons(ETH_P_IP))
		return pass(CTR_PASS_NOT_IPV4);

	// IPv4: at least 20 bytes, version 4, 5 <= IHL, the header and the
	// total length within the frame (trailing Ethernet padding is allowed).
	__u8 *ip = data + 14;
	if ((void *)(ip + 20) > data_end)
		return pass(CTR_PASS_MALFORMED);
	if ((ip[0] >> 4) != 4)
		return pass(CTR_PASS_MALFORMED);
	__u32 ihl = (ip[0] & 0x0F) * 4;
	if (ihl < 20)
		return pass(CTR_PASS_MALFORMED);
	__u32 tot_len = ((__u32)ip[2] << 8) | ip[3];
	if (tot_len < ihl || (void *)ip + tot_len > data_end)
		return pass(CTR_PASS_MALFORMED);
	__u16 frag = ((__u16)ip[6] << 8) | ip[7];
	if (frag & (IP_MF | IP_OFFSET))
		return pass(CTR_PASS_FRAGMENT);
	__u8 l4proto = ip[9];
	if (l4proto != IPPROTO_TCP && l4proto != IPPROTO_UDP)
		return pass(CTR_PASS_OTHER_PROTO);

	// Transport: the ports are the first four bytes of both headers, but
	// the whole fixed header must be present and self-consistent.
	__u8 *l4 = ip + ihl;
	__u32 l4len = tot_len - ihl;
	if (l4proto == IPPROTO_TCP) {
		if ((void *)(l4 + 20) > data_end || l4len < 20)
			return pass(CTR_PASS_MALFORMED);
		__u32 doff = (l4[12] >> 4) * 4;
		if (doff < 20 || doff > l4len)
			return pass(CTR_PASS_MALFORMED);
	} else {
		if ((void *)(l4 + 8) > data_end || l4len < 8)
			return pass(CTR_PASS_MALFORMED);
		__u32 ulen = ((__u32)l4[4] << 8) | l4[5];
		if (ulen < 8 || ulen > l4len)
			return pass(CTR_PASS_MALFORMED);
	}

	struct flow_key fk = {
		.local_addr = *(__be32 *)(ip + 16),
		.remote_addr = *(__be32 *)(ip + 12),
		.local_port = *(__be16 *)(l4 + 2),
		.remote_port = *(__be16 *)(l4 + 0),
		.proto = l4proto,
	};
	__u32 redirect_ctr = CTR_REDIRECT_FLOW;
	__u32 *stack = bpf_map_lookup_elem(&flows, &fk);
	if (!stack) {
		struct listener_key lk = {
			.addr = fk.local_addr,
			.port = fk.local_port,
			.proto = l4proto,
		};
		redirect_ctr = CTR_REDIRECT_LISTENER;
		stack = bpf_map_lookup_elem(&listeners, &lk);
		if (!stack) {
			lk.addr = 0;
			stack = bpf_map_lookup_elem(&listeners, &lk);
		}
	}
	if (!stack)
		return pass(CTR_PASS_NO_MATCH);
	// A listener's port also carries the connections its kernel half
	// accepted (the LD_PRELOAD shim accelerates a listening socket only
	// when the program first waits on it): a segment other than a SYN
	// whose connection the kernel has goes to the kernel. One the kernel
	// has only in TIME-WAIT does not: that connection has ended, and the
	// four-tuple may be the stack's new one's, whose SYN came to the
	// stack (a client reusing its port after a kernel server's close:
	// every connection of a server restarted under the stack failed while
	// its kernel predecessor's TIME-WAIT lasted, the handshake's ACK
	// going to the kernel). The kernel's TIME-WAIT then misses a
	// retransmitted FIN, which the stack answers with a reset.
	//
	// The look-up is the dearest step of a frame's way here (on veth, a
	// few per cent of the sending client's CPU), so it is made only where
	// the kernel may have such a connection: for an entry whose KERNEL_BIT
	// is set (every entry starts with it; user space clears it once it has
	// found no connection of the kernel's on the port,
	// Steering.CheckKernelFlows), and for every entry once kernel_flows
	// says the kernel has taken one since.
	__u32 id = *stack;
	if (redirect_ctr == CTR_REDIRECT_LISTENER && l4proto == IPPROTO_TCP && (l4[13] & (TCP_SYN | TCP_ACK)) != TCP_SYN &&
	    ((id & KERNEL_BIT) || kernel_flows_any())) {
		struct bpf_sock_tuple_ipv4 t = {
			.saddr = fk.remote_addr,
			.daddr = fk.local_addr,
			.sport = fk.remote_port,
			.dport = fk.local_port,
		};
		struct bpf_sock *sk = bpf_skc_lookup_tcp(ctx, &t, sizeof t, BPF_F_CURRENT_NETNS, 0);
		if (sk) {
			__u32 state = sk->state;
			bpf_sk_release(sk);
			if (state != BPF_TCP_LISTEN && state != BPF_TCP_TIME_WAIT)
				return pass(CTR_PASS_KERNEL_FLOW);
		}
	}

	if (redirect_ctr == CTR_REDIRECT_LISTENER)
		id &= ~KERNEL_BIT;
	__u32 queue = ctx->rx_queue_index;
	if (id & CLUSTER_BIT) {
		if (redirect_ctr != CTR_REDIRECT_LISTENER || (id & ~CLUSTER_BIT) >= MAX_STACKS)
			return pass(CTR_PASS_BAD_ENTRY);
		__u32 mk = (id & ~CLUSTER_BIT) * MAX_QUEUES + queue;
		__u32 *member = queue < MAX_QUEUES ? bpf_map_lookup_elem(&cluster_members, &mk) : 0;
		if (member && *member == MEMBER_HELD && l4proto == IPPROTO_TCP && (l4[13] & (TCP_SYN | TCP_ACK)) == TCP_SYN) {
			count(CTR_DROP_HELD);
			return XDP_DROP;
		}
		if (!member || !*member || *member == MEMBER_HELD) {
			if (l4proto == IPPROTO_TCP)
				kernel_flows_set();
			return pass(CTR_PASS_NO_MEMBER);
		}
		id = *member - 1;
	}
	if (id >= MAX_STACKS)
		return pass(CTR_PASS_BAD_ENTRY);
	if (queue >= MAX_QUEUES) {
		count(CTR_DROP_NO_XSK);
		return XDP_DROP;
	}
	__u32 slot = id * MAX_QUEUES + queue;
	if (!bpf_map_lookup_elem(&xsks, &slot)) {
		count(CTR_DROP_NO_XSK);
		return XDP_DROP;
	}

	// A stack that has no socket left for a new connection lets the
	// kernel take it: the listener listens there too, and the steering
	// passes the connection's later segments to the kernel, which has
	// it (CTR_PASS_KERNEL_FLOW above).
	if (redirect_ctr == CTR_REDIRECT_LISTENER && l4proto == IPPROTO_TCP && (l4[13] & (TCP_SYN | TCP_ACK)) == TCP_SYN) {
		struct stack_ctl *ctl = bpf_map_lookup_elem(&control, &id);
		if (ctl && *(volatile __u32 *)&ctl->full) {
			kernel_flows_set();
			return pass(CTR_PASS_FULL);
		}
	}

	wake(id, queue);
	count(redirect_ctr);
	__u32 bucket = id * LANE_BUCKETS + lane_hash(&fk);
	__u32 *lv = bpf_map_lookup_elem(&lanes, &bucket);
	if (lv && *lv) {
		__u32 lane = *lv & 0xff;
		__u32 lslot = id * MAX_LANES + lane;
		if (lane < MAX_LANES && (*lv >> 8) == queue && bpf_map_lookup_elem(&lane_xsks, &lslot)) {
			count(CTR_REDIRECT_LANE);
			return bpf_redirect_map(&lane_xsks, lslot, XDP_DROP);
		}
	}
	// The socket was there a moment ago; if it has just gone, drop.
	return bpf_redirect_map(&xsks, slot, XDP_DROP);
}

// forward is the program of the test hosts' fault injector (test.Path),
// not of a stack: every frame goes to stack 0's socket for the queue it
// came in on, whatever it is, so that a user-space forwarder sees all the
// traffic of the link. With no socket there, the kernel has the frame.
SEC("xdp")
int forward(struct xdp_md *ctx)
{
	__u32 slot = ctx->rx_queue_index;

	count(CTR_RX);
	if (slot >= MAX_QUEUES)
		return XDP_PASS;
	return bpf_redirect_map(&xsks, slot, XDP_PASS);
}
