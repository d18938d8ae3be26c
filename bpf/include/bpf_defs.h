/* SPDX-License-Identifier: (MIT OR GPL-2.0) */
/*
 * The few definitions steer.c needs from <linux/bpf.h> and libbpf's
 * bpf_helpers.h, written out so that the object depends only on clang and
 * is byte-for-byte reproducible whatever kernel headers a machine has.
 * Values are the kernel's UAPI and never change.
 */
#ifndef ONLOAD_BPF_DEFS_H
#define ONLOAD_BPF_DEFS_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef __u16 __be16;
typedef __u32 __be32;

#define SEC(name) __attribute__((section(name), used))
#define __always_inline inline __attribute__((always_inline))
#define __uint(name, val) int(*name)[val]
#define __type(name, val) typeof(val) *name

/* enum bpf_map_type */
#define BPF_MAP_TYPE_HASH 1
#define BPF_MAP_TYPE_ARRAY 2
#define BPF_MAP_TYPE_PERCPU_ARRAY 6
#define BPF_MAP_TYPE_XSKMAP 17
#define BPF_MAP_TYPE_RINGBUF 27

/* map_flags */
#define BPF_F_NO_PREALLOC (1U << 0)
#define BPF_F_MMAPABLE (1U << 10)

/* enum xdp_action */
#define XDP_ABORTED 0
#define XDP_DROP 1
#define XDP_PASS 2
#define XDP_TX 3
#define XDP_REDIRECT 4

struct xdp_md {
	__u32 data;
	__u32 data_end;
	__u32 data_meta;
	__u32 ingress_ifindex;
	__u32 rx_queue_index;
	__u32 egress_ifindex;
};

/* Helper functions, by their stable ids in enum bpf_func_id. */
static void *(*bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*bpf_redirect_map)(void *map, __u64 key, __u64 flags) = (void *)51;
static long (*bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size, __u64 flags) = (void *)130;

/* Kernel socket lookup: struct bpf_sock_tuple's IPv4 half, and the
 * struct bpf_sock fields up to state. */
struct bpf_sock_tuple_ipv4 {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};
struct bpf_sock {
	__u32 bound_dev_if;
	__u32 family;
	__u32 type;
	__u32 protocol;
	__u32 mark;
	__u32 priority;
	__u32 src_ip4;
	__u32 src_ip6[4];
	__u32 src_port;
	__be16 dst_port;
	__u16 : 16;
	__u32 dst_ip4;
	__u32 dst_ip6[4];
	__u32 state;
};
#define BPF_F_CURRENT_NETNS (-1)
#define BPF_TCP_TIME_WAIT 6
#define BPF_TCP_LISTEN 10
static long (*bpf_sk_release)(void *sk) = (void *)86;
static struct bpf_sock *(*bpf_skc_lookup_tcp)(void *ctx, struct bpf_sock_tuple_ipv4 *tuple, __u32 tuple_size,
					      __u64 netns, __u64 flags) = (void *)99;

#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define bpf_htons(x) __builtin_bswap16(x)
#define bpf_htonl(x) __builtin_bswap32(x)
#else
#define bpf_htons(x) (x)
#define bpf_htonl(x) (x)
#endif

#endif
