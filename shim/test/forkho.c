/*
 * forkho: a program that forks after its first connection and has the
 * child use it, then the parent (issue 15's first case). It talks to a
 * TCP echo server: the parent sends a line, forks; the child moves
 * CHILD_BYTES both ways through the echo in 64 KiB rounds, checking
 * every byte, and reports how long its first round took (under the shim
 * the connection is handed over to the kernel there); then the parent
 * does one more round. It prints "ok" lines and exits 0, or says what
 * went wrong and exits 1.
 *
 *	forkho ADDR PORT [fork-exec|exec PROGRAM]
 *
 * With FORKHO_IPV6 set in its environment, its socket is IPv6, connected
 * to the IPv4-mapped address.
 *
 * With fork-exec, the child does not use the connection itself: it execs
 * PROGRAM with the connection on fd 3 and the argument "child-exec", and
 * that program (forkho again, run without the shim) does the rounds.
 * With exec, the process itself does so after its first line, without
 * forking. With pause, it does not fork: after its first line it prints
 * "ready" and waits for a line on its standard input (the test stops
 * onloadd meanwhile, which hands the connection over to the kernel),
 * then does the rounds itself.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "noshim.h"

#define ROUND (64 << 10)
#define CHILD_BYTES (8 << 20)

static void die(const char *what)
{
	printf("FATAL %s: %s\n", what, errno ? strerror(errno) : "short");
	fflush(stdout);
	exit(1);
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void fill(unsigned char *b, size_t n, size_t off)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)((off + i) * 2654435761u >> 13);
}

/* round_trip sends n bytes of the pattern from off and reads them back. */
static void round_trip(int s, size_t n, size_t off)
{
	static unsigned char out[ROUND], in[ROUND];
	fill(out, n, off);
	size_t sent = 0, got = 0;
	while (got < n) {
		if (sent < n) {
			ssize_t w = send(s, out + sent, n - sent, MSG_DONTWAIT);
			if (w > 0)
				sent += w;
			else if (w < 0 && errno != EAGAIN)
				die("send");
		}
		ssize_t r = recv(s, in + got, n - got, sent < n ? MSG_DONTWAIT : 0);
		if (r == 0)
			die("recv: end of stream");
		if (r < 0 && errno != EAGAIN)
			die("recv");
		if (r > 0)
			got += r;
	}
	if (memcmp(in, out, n) != 0)
		die("echo differs");
}

static void line(int s, const char *msg)
{
	errno = 0;
	size_t n = strlen(msg);
	char buf[256];
	if (send(s, msg, n, 0) != (ssize_t)n)
		die("send line");
	size_t got = 0;
	while (got < n) {
		ssize_t r = recv(s, buf + got, sizeof buf - got, 0);
		if (r <= 0)
			die("recv line");
		got += r;
	}
	if (got != n || memcmp(buf, msg, n) != 0)
		die("line echo differs");
}

/* finish ends the connection as a careful program does: our FIN, then
 * the peer's end of stream, then the close. The close is explicit, so
 * the FIN leaves as soon as the last echo is read: left to the exit, it
 * would wait for the kernel to tear down the process's AF_XDP socket and
 * XDP program (tens of milliseconds), and could leave just as the
 * kernel's delayed acknowledgment of that echo (40 ms) does, from
 * another CPU; veth can then deliver that acknowledgment after the
 * close has completed, and the peer answers it with a reset, which the
 * tests would count against the handover. */
static void finish(int s)
{
	char c;
	if (shutdown(s, SHUT_WR) < 0)
		die("shutdown");
	ssize_t r = recv(s, &c, 1, 0);
	if (r != 0)
		die(r < 0 ? "recv after shutdown" : "recv after shutdown: data");
	if (close(s) < 0)
		die("close");
}

static int child_rounds(int s, const char *who)
{
	double t0 = now_ms();
	round_trip(s, ROUND, 0);
	double first = now_ms() - t0;
	for (size_t off = ROUND; off < CHILD_BYTES; off += ROUND)
		round_trip(s, ROUND, off);
	printf("%s ok: %d bytes each way, first round %.1f ms\n", who, CHILD_BYTES, first);
	fflush(stdout);
	return 0;
}

/* exec_child execs prog without the shim (the environment less
 * LD_PRELOAD) with connection s on fd 3. */
static void exec_child(int s, const char *prog)
{
	if (s != 3 && dup2(s, 3) < 0)
		die("dup2");
	char *env[256];
	execle(prog, prog, "child-exec", (char *)NULL, env_without_shim(env, 256));
	die("exec");
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "child-exec") == 0)
		return child_rounds(3, "exec'd child");
	if (argc != 3 && argc != 4 && argc != 5) {
		fprintf(stderr, "usage: forkho ADDR PORT [fork-exec|exec PROGRAM | pause]\n");
		return 2;
	}
	struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1) {
		fprintf(stderr, "forkho: bad address %s\n", argv[1]);
		return 2;
	}
	int s;
	if (getenv("FORKHO_IPV6")) {
		/* An IPv6 socket to the IPv4-mapped address. */
		struct sockaddr_in6 p6 = {.sin6_family = AF_INET6, .sin6_port = peer.sin_port};
		p6.sin6_addr.s6_addr[10] = p6.sin6_addr.s6_addr[11] = 0xff;
		memcpy(&p6.sin6_addr.s6_addr[12], &peer.sin_addr, 4);
		s = socket(AF_INET6, SOCK_STREAM, 0);
		if (s < 0 || connect(s, (struct sockaddr *)&p6, sizeof p6) < 0)
			die("connect");
	} else {
		s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0 || connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
			die("connect");
	}
	int one = 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	line(s, "parent before the fork\n");
	if (argc == 4 && strcmp(argv[3], "pause") == 0) {
		printf("ready\n");
		fflush(stdout);
		char c;
		if (read(0, &c, 1) != 1)
			die("stdin");
		child_rounds(s, "after the pause");
		line(s, "parent after the pause\n");
		finish(s);
		printf("parent ok\n");
		return 0;
	}
	if (argc == 5 && strcmp(argv[3], "exec") == 0)
		exec_child(s, argv[4]);
	pid_t p = fork();
	if (p < 0)
		die("fork");
	if (p == 0) {
		if (argc == 5)
			exec_child(s, argv[4]);
		_exit(child_rounds(s, "child"));
	}
	int st;
	if (waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		printf("FATAL the child failed\n");
		return 1;
	}
	line(s, "parent after the child\n");
	finish(s);
	printf("parent ok\n");
	return 0;
}
