/*
 * The interface between the shim's C interposer (the .c files here,
 * shim.h their overview) and its Go core (core/, built with
 * -buildmode=c-shared and loaded by the interposer at the first socket
 * operation that needs a stack).
 *
 * Every core call is non-blocking. Calls return a value >= 0 or a
 * negated errno. A handle (h) names one accelerated socket; 0 is none.
 */
#ifndef ONLOAD_SHIM_H
#define ONLOAD_SHIM_H

#include <stdint.h>

/* Readiness bits, as package stack's Events. */
#define ONL_READABLE 1
#define ONL_WRITABLE 2
#define ONL_ERROR 4
#define ONL_HANGUP 8
#define ONL_RDHUP 16
/* In a want (onl_arm): wake at the socket's next change, whatever its
 * readiness now (stack.Edge); ready only if its edge count moved. */
#define ONL_EDGE 0x40000000

/* How a caller of onl_arm blocks if nothing is ready (and how it wakes,
 * in onl_disarm): not at all; on its eventfd only, relying on the
 * stack's Sleeper to poll (Park); or on the stack's interrupt fd too
 * (onl_irq_fd), polling the stack itself when it fires (ParkDirect,
 * with ONL_UNPARK_POLL at the wake if it fired). */
#define ONL_PARK_NONE 0
#define ONL_PARK 1
#define ONL_PARK_DIRECT 2
#define ONL_UNPARK_POLL 3

/* What onl_ready does before it looks (flags). */
#define ONL_READY_KICK 1      /* give the NIC the frames sends left for a kick */
#define ONL_READY_POLL 2      /* poll the stack: the caller spins */
#define ONL_READY_TRY_POLL 4  /* poll the stack unless another thread is in it */

/* Options, as package stack's Option. */
#define ONL_OPT_NODELAY 1
#define ONL_OPT_KEEPALIVE 2
#define ONL_OPT_KEEPIDLE 3
#define ONL_OPT_KEEPINTVL 4
#define ONL_OPT_KEEPCNT 5
#define ONL_OPT_LINGER 6
#define ONL_OPT_RCVBUF 7
#define ONL_OPT_SNDBUF 8
#define ONL_OPT_REUSEADDR 9
#define ONL_OPT_CONGESTION 10 /* 0 cubic, 1 reno */
#define ONL_OPT_USER_TIMEOUT 11
#define ONL_OPT_CORK 12
#define ONL_OPT_DEFER_ACCEPT 13
#define ONL_OPT_TOS 14
#define ONL_OPT_TTL 15
#define ONL_OPT_QUICKACK 16 /* read back from the stack: its ping-pong mode */
#define ONL_OPT_RCVLOWAT 17
#define ONL_OPT_NOTSENT_LOWAT 18

/* What TCP_INFO reports, from the engine. */
struct onl_tcpinfo {
	uint32_t state; /* Linux's TCP_ESTABLISHED and the rest */
	uint32_t rto_us, rtt_us, rttvar_us;
	uint32_t snd_mss, rcv_mss;
	uint32_t snd_cwnd, snd_ssthresh; /* segments */
	uint32_t unacked, lost, retrans, sacked; /* segments */
	uint32_t backoff;
	uint32_t snd_wnd, rcv_wnd, notsent;
	uint32_t queued; /* bytes written and not acknowledged (SIOCOUTQ) */
	uint32_t options, snd_wscale, rcv_wscale;
};

#endif
