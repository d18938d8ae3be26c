/*
 * waits: the shim's conformance program for the edges of its waits: the
 * errors of epoll_ctl and epoll_wait, a registration that outlives the
 * fd it was made by (a dup holds the socket), EPOLLONESHOT re-armed,
 * EPOLLET after a partial read, POLLRDHUP at the peer's FIN, shutdown
 * after the end, and poll and select on fds that are not open. It talks
 * to a TCP echo server (the kernel's, in the other test host) and prints
 * one line per result, nothing that depends on timing or on port
 * numbers, so that its output under the shim must be the same as
 * without it (the reference).
 *
 *	waits ADDR PORT
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <unistd.h>

#include "conform.h"

/* report waits up to ms on ep and prints what it got: the count, and
 * each event's data and whether it has EPOLLIN and EPOLLOUT. */
static void report(const char *what, int ep, int ms)
{
	struct epoll_event ev[4];
	int n = epoll_wait(ep, ev, 4, ms);
	if (n < 0) {
		say("%s: -1 %s", what, strerror(errno));
		return;
	}
	for (int i = 1; i < n; i++) /* by data: the kernel's order is its ready list's */
		for (int j = i; j > 0 && ev[j].data.u64 < ev[j - 1].data.u64; j--) {
			struct epoll_event t = ev[j];
			ev[j] = ev[j - 1];
			ev[j - 1] = t;
		}
	char line[256];
	int o = snprintf(line, sizeof line, "%s: %d", what, n);
	for (int i = 0; i < n && o < (int)sizeof line; i++)
		o += snprintf(line + o, sizeof line - o, " (%llu%s%s)", (unsigned long long)ev[i].data.u64,
			      ev[i].events & EPOLLIN ? " in" : "", ev[i].events & EPOLLOUT ? " out" : "");
	say("%s", line);
}

static void test_epoll_errors(int s)
{
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1};
	check("add", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
	check("add again", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
	int t = dial();
	check("mod of one not added", epoll_ctl(ep, EPOLL_CTL_MOD, t, &ev));
	check("del of one not added", epoll_ctl(ep, EPOLL_CTL_DEL, t, &ev));
	check("add itself", epoll_ctl(ep, EPOLL_CTL_ADD, ep, &ev));
	check("an unknown op", epoll_ctl(ep, 99, t, &ev));
	check("add with no event", epoll_ctl(ep, EPOLL_CTL_ADD, t, NULL));
	struct epoll_event x = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = 2};
	check("add EPOLLEXCLUSIVE", epoll_ctl(ep, EPOLL_CTL_ADD, t, &x));
	check("mod of an EPOLLEXCLUSIVE one", epoll_ctl(ep, EPOLL_CTL_MOD, t, &ev));
	check("del of it", epoll_ctl(ep, EPOLL_CTL_DEL, t, NULL));
	int pp[2];
	pipe(pp);
	check("epoll_ctl on a pipe as the set", epoll_ctl(pp[0], EPOLL_CTL_ADD, s, &ev));
	check("epoll_wait on a pipe", epoll_wait(pp[0], &ev, 1, 0));
	check("epoll_wait for 0 events", epoll_wait(ep, &ev, 0, 0));
	close(t);
	check("add of a closed fd", epoll_ctl(ep, EPOLL_CTL_ADD, t, &ev));
	close(pp[0]);
	close(pp[1]);
	close(ep);
}

/* A registration belongs to the socket, not the fd: closing the fd it
 * was made by leaves it while a dup holds the socket (epoll(7)). */
static void test_epoll_dup(void)
{
	int s = dial();
	int d = dup(s);
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 7};
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	close(s);
	send(d, "dup", 3, 0);
	await(d, 3);
	report("after its fd closed, a dup holding it", ep, 5000);
	check("del by the closed fd", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
	check("del by the dup", epoll_ctl(ep, EPOLL_CTL_DEL, d, NULL));
	struct epoll_event ev2 = {.events = EPOLLIN, .data.u64 = 8};
	check("add the dup beside it", epoll_ctl(ep, EPOLL_CTL_ADD, d, &ev2));
	report("both", ep, 5000);
	check("del by the dup, now", epoll_ctl(ep, EPOLL_CTL_DEL, d, NULL));
	report("the first left", ep, 5000);
	char buf[8];
	recv(d, buf, sizeof buf, 0);
	close(d);
	report("after the dup closed too", ep, 100);
	close(ep);
}

/* A registration whose socket's last fd is closed while another thread
 * is in a call on the socket goes when that call ends, as the kernel's
 * goes with the file: the socket made next (which may take the closed
 * one's handle under the shim) does not report through it. */
static int held_fd;

static void *recv_held(void *arg)
{
	char c;
	(void)arg;
	recv(held_fd, &c, 1, 0); /* SO_RCVTIMEO ends it */
	return NULL;
}

static void test_epoll_close_held(void)
{
	held_fd = dial();
	struct timeval tv = {0, 200000};
	setsockopt(held_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = 6};
	epoll_ctl(ep, EPOLL_CTL_ADD, held_fd, &ev);
	pthread_t t;
	pthread_create(&t, NULL, recv_held, NULL);
	usleep(50000); /* the thread is in its recv */
	close(held_fd);
	pthread_join(t, NULL);
	int s = dial();
	report("closed while a call held it, then a new socket", ep, 100);
	close(s);
	close(ep);
}

static void test_oneshot(int s)
{
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = 3};
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	send(s, "a", 1, 0);
	await(s, 1);
	report("oneshot, data", ep, 5000);
	report("oneshot, again", ep, 100);
	check("mod to re-arm", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
	report("oneshot, re-armed", ep, 5000);
	char c;
	recv(s, &c, 1, 0);
	close(ep);
}

static void test_edge(int s)
{
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLET, .data.u64 = 4};
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	report("edge, at the add", ep, 5000);
	report("edge, nothing new", ep, 100);
	send(s, "abcd", 4, 0);
	await(s, 4);
	report("edge, data", ep, 5000);
	char buf[2];
	recv(s, buf, 2, 0);
	report("edge, after a partial read", ep, 100);
	send(s, "e", 1, 0);
	await(s, 3);
	report("edge, more data", ep, 5000);
	char rest[8];
	recv(s, rest, sizeof rest, 0);
	close(ep);
}

static void test_level(int s)
{
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u64 = 5};
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	report("level, writable", ep, 5000);
	report("level, still writable", ep, 0);
	ev.events = EPOLLIN;
	epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev);
	report("level, in only, idle", ep, 50);
	send(s, "xy", 2, 0);
	await(s, 2);
	report("level, data", ep, 5000);
	report("level, data still there", ep, 0);
	char buf[2];
	recv(s, buf, 2, 0);
	report("level, read", ep, 50);
	close(ep);
}

/* The peer's FIN: POLLRDHUP and EPOLLRDHUP, beside POLLIN. */
static void test_rdhup(void)
{
	int s = dial();
	shutdown(s, SHUT_WR); /* the echo server closes its side in turn */
	struct pollfd p = {.fd = s, .events = POLLIN | POLLRDHUP};
	int n = poll(&p, 1, 5000);
	say("poll at the peer's FIN: %d, POLLIN %d, POLLRDHUP %d, POLLHUP %d", n, !!(p.revents & POLLIN),
	    !!(p.revents & POLLRDHUP), !!(p.revents & POLLHUP));
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u64 = 9}, got;
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	n = epoll_wait(ep, &got, 1, 5000);
	say("epoll at the peer's FIN: %d, EPOLLIN %d, EPOLLRDHUP %d, EPOLLHUP %d", n, n == 1 && (got.events & EPOLLIN),
	    n == 1 && (got.events & EPOLLRDHUP), n == 1 && (got.events & EPOLLHUP));
	close(ep);
	check("shutdown SHUT_WR again", shutdown(s, SHUT_WR));
	check("shutdown, a bad how", shutdown(s, 5));
	check("dup2 onto itself", dup2(s, s));
	close(s);
	check("close again", close(s));
}

static void test_poll_edges(int s)
{
	int pp[2];
	pipe(pp);
	close(pp[1]);
	int closed = pp[1];
	struct pollfd p[4] = {
		{.fd = s, .events = POLLIN | POLLOUT},
		{.fd = -1, .events = POLLIN},
		{.fd = closed, .events = POLLIN},
		{.fd = pp[0], .events = POLLIN},
	};
	int n = poll(p, 4, 1000);
	say("poll: %d, revents %#x %#x %#x %#x", n, p[0].revents, p[1].revents, p[2].revents, p[3].revents);
	check("poll of nothing, 20 ms", poll(NULL, 0, 20));
	fd_set r;
	FD_ZERO(&r);
	FD_SET(s, &r);
	FD_SET(closed, &r);
	struct timeval tv = {1, 0};
	check("select with a closed fd", select((s > closed ? s : closed) + 1, &r, NULL, NULL, &tv));
	FD_ZERO(&r);
	FD_SET(s, &r);
	tv.tv_sec = 0;
	tv.tv_usec = 20000;
	check("select, a negative count", select(-1, &r, NULL, NULL, &tv));
	check("select, idle, 20 ms", select(s + 1, &r, NULL, NULL, &tv));
	say("its timeout, left: %ld", (long)tv.tv_usec);
	close(pp[0]);
}

/* A thread blocked in epoll_wait on a set another thread then adds a
 * socket to wakes when the socket turns readable, as apache's listener
 * thread does for a kept-alive connection its worker hands back: a set
 * with nothing in it when the wait began, then one with an idle socket
 * in it. */
static int blocked_ep;

static void *wait_blocked(void *arg)
{
	(void)arg;
	report("blocked epoll_wait, a socket added meanwhile", blocked_ep, 5000);
	return NULL;
}

static void test_added_while_blocked(void)
{
	for (int i = 0; i < 2; i++) {
		int s = dial();
		echo(s, i ? "with an idle socket in the set" : "the added socket", "add");
		blocked_ep = epoll_create1(0);
		int idle = -1;
		if (i) {
			idle = dial();
			struct epoll_event iev = {.events = EPOLLIN, .data.u64 = 8};
			epoll_ctl(blocked_ep, EPOLL_CTL_ADD, idle, &iev);
		}
		pthread_t t;
		pthread_create(&t, NULL, wait_blocked, NULL);
		usleep(100000); /* the thread blocks (spin included) */
		struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT, .data.u64 = 9};
		check("epoll_ctl ADD from another thread", epoll_ctl(blocked_ep, EPOLL_CTL_ADD, s, &ev));
		usleep(20000);
		send(s, "x", 1, 0); /* its echo makes it readable */
		pthread_join(t, NULL);
		char c;
		check("then its recv", recv(s, &c, 1, 0));
		close(blocked_ep);
		close(s);
		if (idle >= 0)
			close(idle);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: waits ADDR PORT\n");
		return 2;
	}
	if (set_peer("waits", argv[1], argv[2]))
		return 2;
	alarm(60); /* a hang fails the run rather than the test's timeout */
	int s = dial();
	echo(s, "first socket", "hello");
	test_epoll_errors(s);
	test_epoll_dup();
	test_epoll_close_held();
	test_oneshot(s);
	test_edge(s);
	test_level(s);
	test_rdhup();
	test_poll_edges(s);
	test_added_while_blocked();
	echo(s, "at the end", "bye");
	say("done");
	return 0;
}
