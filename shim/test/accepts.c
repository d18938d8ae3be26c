/*
 * accepts: the shim's conformance program for a listener's calls. The
 * server (under the shim, or on the kernel for the reference) takes the
 * client's connections one step at a time; the client (the kernel's, in
 * the other test host) drives each step and waits for the server's "ok"
 * on its connection before the next. Both print one line per result,
 * nothing that depends on timing or on port numbers, so that the
 * server's output under the shim must be the same as without it.
 *
 *	accepts serve PORT
 *	accepts connect ADDR PORT
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "conform.h"

/* readable waits up to 5 s for fd: 1, or 0. */
static int readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	return poll(&p, 1, 5000) == 1;
}

/* take reads what the peer sent on c (after waiting for it) and prints
 * it under what. */
static void take(int c, const char *what)
{
	char buf[64];
	if (!readable(c)) {
		say("%s: nothing in 5 s", what);
		return;
	}
	ssize_t r = recv(c, buf, sizeof buf, 0);
	if (r < 0)
		say("%s: -1 %s", what, strerror(errno));
	else
		say("%s: %zd %.*s", what, r, (int)r, buf);
}

static void ok(int c)
{
	if (send(c, "ok", 2, MSG_NOSIGNAL) != 2)
		say("send ok: %s", strerror(errno));
}

static int ls;

/* accept_blocked is a thread blocked in accept when the listener is shut
 * down: its result, for the main thread to print after the join (two
 * threads' lines would come in either order). */
static int blocked_r, blocked_errno;

static void *accept_blocked(void *arg)
{
	(void)arg;
	blocked_r = accept(ls, NULL, NULL);
	blocked_errno = errno;
	return NULL;
}

static int serve(int port)
{
	ls = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(ls, (struct sockaddr *)&sin, sizeof sin) < 0)
		die("bind");
	check("accept before listen", accept(ls, NULL, NULL));
	check("listen", listen(ls, 16));
	check("listen again", listen(ls, 64));
	getint(ls, SOL_SOCKET, SO_ACCEPTCONN, "SO_ACCEPTCONN");
	int v = 5;
	check("set TCP_DEFER_ACCEPT", setsockopt(ls, IPPROTO_TCP, TCP_DEFER_ACCEPT, &v, sizeof v));
	getint(ls, IPPROTO_TCP, TCP_DEFER_ACCEPT, "TCP_DEFER_ACCEPT");
	v = 0;
	setsockopt(ls, IPPROTO_TCP, TCP_DEFER_ACCEPT, &v, sizeof v);
	fcntl(ls, F_SETFL, O_NONBLOCK);
	check("accept, non-blocking, none there", accept(ls, NULL, NULL));
	fcntl(ls, F_SETFL, 0);
	check("recv on the listener", recv(ls, &v, 1, MSG_DONTWAIT));
	/* Options an accepted socket inherits from its listener (Linux
	 * copies the listener's socket into the child). */
	static const struct {
		int level, opt;
		const char *name;
		int v;
	} inherit[] = {
		{SOL_SOCKET, SO_KEEPALIVE, "SO_KEEPALIVE", 1},
		{IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY", 1},
		{IPPROTO_TCP, TCP_KEEPIDLE, "TCP_KEEPIDLE", 77},
		{IPPROTO_TCP, TCP_KEEPINTVL, "TCP_KEEPINTVL", 9},
		{IPPROTO_TCP, TCP_KEEPCNT, "TCP_KEEPCNT", 4},
		{SOL_SOCKET, SO_RCVBUF, "SO_RCVBUF", 65536},
		{SOL_SOCKET, SO_SNDBUF, "SO_SNDBUF", 65536},
	};
	for (size_t k = 0; k < sizeof inherit / sizeof inherit[0]; k++)
		setsockopt(ls, inherit[k].level, inherit[k].opt, &inherit[k].v, sizeof inherit[k].v);
	struct linger lg = {1, 3};
	setsockopt(ls, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	say("listening");

	/* 1: accept4's flags, and the peer's address. */
	struct sockaddr_in a;
	socklen_t al = sizeof a;
	int c = accept4(ls, (struct sockaddr *)&a, &al, SOCK_NONBLOCK | SOCK_CLOEXEC);
	char ip[INET_ADDRSTRLEN] = "?";
	inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
	say("accept4: %s, length %u, family %d, from %s", c >= 0 ? "a socket" : strerror(errno), (unsigned)al,
	    a.sin_family, ip);
	say("its O_NONBLOCK %d, FD_CLOEXEC %d", !!(fcntl(c, F_GETFL) & O_NONBLOCK), fcntl(c, F_GETFD));
	check("its recv before the data", recv(c, &v, 1, 0));
	take(c, "1");
	for (size_t k = 0; k < sizeof inherit / sizeof inherit[0]; k++)
		getint(c, inherit[k].level, inherit[k].opt, inherit[k].name);
	struct linger lg2 = {0, 0};
	socklen_t ll = sizeof lg2;
	getsockopt(c, SOL_SOCKET, SO_LINGER, &lg2, &ll);
	say("its SO_LINGER: %d %d", lg2.l_onoff, lg2.l_linger);
	/* A connection's TIME-WAIT lets a new listener bind the port only
	 * if both have SO_REUSEADDR, its from the listener: a server that
	 * restarts binds again at once. */
	getint(c, SOL_SOCKET, SO_REUSEADDR, "its SO_REUSEADDR");
	getint(c, SOL_SOCKET, SO_ACCEPTCONN, "its SO_ACCEPTCONN");
	getint(c, SOL_SOCKET, SO_ERROR, "its SO_ERROR");
	struct sockaddr_in me;
	socklen_t ml = sizeof me;
	getsockname(c, (struct sockaddr *)&me, &ml);
	say("its port is the listener's: %d", ntohs(me.sin_port) == port);
	ok(c);
	close(c);

	/* 2: an address buffer too short: the kernel fills what fits and
	 * says how long the address is. */
	memset(&a, 0xff, sizeof a);
	al = 4;
	c = accept(ls, (struct sockaddr *)&a, &al);
	say("accept, 4 bytes for the address: %s, length %u, family %d, byte 4 untouched %d",
	    c >= 0 ? "a socket" : strerror(errno), (unsigned)al, a.sin_family, ((unsigned char *)&a)[4] == 0xff);
	take(c, "2");
	ok(c);
	close(c);

	/* 3: data and a FIN before the accept. */
	usleep(200000);
	c = accept(ls, NULL, NULL);
	say("accept, no address: %s", c >= 0 ? "a socket" : strerror(errno));
	take(c, "3");
	char buf[8];
	check("3, then", recv(c, buf, sizeof buf, 0));
	ok(c);
	close(c);

	/* 4: a reset before the accept (the client's SO_LINGER 0 close), then
	 * 5, a connection that says so. Linux keeps the reset connection in
	 * the accept queue (its first recv fails with ECONNRESET), and so
	 * does the stack; BSD's TCP drops it, and so did the stack until
	 * 2026-12-05. */
	usleep(300000);
	c = accept(ls, NULL, NULL);
	if (c >= 0 && readable(c)) {
		ssize_t r = recv(c, buf, sizeof buf, 0);
		if (r == 4 && memcmp(buf, "five", 4) == 0) {
			say("4: the reset connection: not accepted");
		} else {
			say("4: the reset connection: accepted, its recv %zd%s%s", r, r < 0 ? " " : "",
			    r < 0 ? strerror(errno) : "");
			close(c);
			c = accept(ls, NULL, NULL);
			if (!readable(c) || recv(c, buf, sizeof buf, 0) != 4 || memcmp(buf, "five", 4) != 0)
				say("5: not five");
		}
	}
	say("5: five");
	/* 6: an option set on the listener now, after its first accepts,
	 * reaches the connections that come to it from now on (the client
	 * connects after the ok): SO_LINGER 0, whose close resets (the
	 * client sees it). Linux's child takes the listener's options as it
	 * is made, at the handshake, not at the accept. */
	struct linger lg0 = {1, 0};
	check("set SO_LINGER 0 on the listener", setsockopt(ls, SOL_SOCKET, SO_LINGER, &lg0, sizeof lg0));
	ok(c);
	close(c);
	c = accept(ls, NULL, NULL);
	say("accept: %s", c >= 0 ? "a socket" : strerror(errno));
	take(c, "6");
	close(c);

	/* 7: shutdown wakes a thread blocked in accept. */
	pthread_t t;
	pthread_create(&t, NULL, accept_blocked, NULL);
	usleep(200000);
	int sr = shutdown(ls, SHUT_RDWR);
	pthread_join(t, NULL);
	say("shutdown of the listener: %d", sr);
	say("accept, blocked when the listener shut down: %d%s%s", blocked_r < 0 ? -1 : 0, blocked_r < 0 ? " " : "",
	    blocked_r < 0 ? strerror(blocked_errno) : "");
	check("accept after it", accept(ls, NULL, NULL));
	close(ls);
	say("done");
	return 0;
}

static int dial_to(struct sockaddr_in *to)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	for (int i = 0; i < 50; i++) {
		if (connect(s, (struct sockaddr *)to, sizeof *to) == 0)
			return s;
		close(s);
		usleep(100000);
		s = socket(AF_INET, SOCK_STREAM, 0);
	}
	die("connect");
	return -1;
}

/* await_ok waits for the server's "ok" on s. */
static void await_ok(int s, const char *step)
{
	char buf[2];
	ssize_t r = readable(s) ? recv(s, buf, 2, MSG_WAITALL) : -1;
	say("%s: %s", step, r == 2 && memcmp(buf, "ok", 2) == 0 ? "ok" : "no ok");
}

/* step connects, waits delay µs, sends data (and a FIN if fin), waits
 * for the server's ok to the step and closes. */
static void step(const char *data, int fin, useconds_t delay, const char *name)
{
	int s = dial_to(&peer);
	usleep(delay);
	send(s, data, strlen(data), 0);
	if (fin)
		shutdown(s, SHUT_WR);
	await_ok(s, name);
	close(s);
}

static int client(const char *addr, const char *port)
{
	if (set_peer("accepts", addr, port))
		return 2;
	step("one", 0, 100000, "1"); /* its recv before the data finds none */
	step("two", 0, 0, "2");
	step("three", 1, 0, "3");
	int s = dial_to(&peer);
	struct linger lg = {1, 0};
	setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(s); /* a reset */
	step("five", 0, 0, "5");
	s = dial_to(&peer);
	send(s, "six", 3, 0);
	char c;
	ssize_t r = readable(s) ? recv(s, &c, 1, 0) : -2;
	say("6: the server's close: %zd%s%s", r, r == -1 ? " " : "", r == -1 ? strerror(errno) : "");
	close(s);
	say("done");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "serve") == 0)
		return serve(atoi(argv[2]));
	if (argc == 4 && strcmp(argv[1], "connect") == 0)
		return client(argv[2], argv[3]);
	fprintf(stderr, "usage: accepts serve PORT | accepts connect ADDR PORT\n");
	return 2;
}
