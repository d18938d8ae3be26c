/*
 * mixed: the shim's conformance program. It talks to a TCP echo server
 * (the kernel's, in the other test host) and mixes its sockets with
 * pipes, eventfds and files in poll, select and epoll; forks before and
 * after its first socket; dup2s over a socket; and takes signals during
 * blocking calls. It prints one line per result, nothing that depends on
 * timing or on port numbers, so that its output under the shim must be
 * the same as without it (the reference).
 *
 *	mixed ADDR PORT       the conformance run
 *	mixed bench           ns per read() of an empty pipe (interposition's cost)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dlfcn.h>
#include "conform.h"

static double now_ns(void);

/* wait_readable waits (poll, up to 5 s) for fd to have data. */
static void wait_readable(int fd)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	if (poll(&p, 1, 5000) != 1)
		die("wait_readable");
}

static void drain(int fd)
{
	char buf[4096];
	while (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0)
		;
}

static void test_fork_before(void)
{
	pid_t p = fork();
	if (p == 0) {
		int s = dial();
		echo(s, "child forked before the first socket", "from-child");
		close(s);
		_exit(0);
	}
	int st;
	waitpid(p, &st, 0);
	say("child exit %d", WEXITSTATUS(st));
}

/* test_fd_numbers: a new fd is the lowest free, as the kernel gives it,
 * with the stack made and threads that have waited on it: the
 * interposer's and the core's own fds are out of the program's range. */
static void test_fd_numbers(const char *when)
{
	int p[2];
	if (pipe(p) < 0)
		die("pipe");
	int s = socket(AF_INET, SOCK_STREAM, 0);
	say("%s: new fds %d %d %d", when, p[0], p[1], s);
	close(p[0]);
	close(p[1]);
	close(s);
}

static void test_poll(int s, int pr, int pw, int ev, int file)
{
	struct pollfd p[4] = {
		{.fd = s, .events = POLLIN | POLLOUT}, {.fd = pr, .events = POLLIN},
		{.fd = ev, .events = POLLIN}, {.fd = file, .events = POLLIN},
	};
	int n = poll(p, 4, 0);
	say("poll idle: %d: sock %#x pipe %#x eventfd %#x file %#x", n, p[0].revents, p[1].revents, p[2].revents, p[3].revents);
	write(pw, "x", 1);
	uint64_t one = 1;
	write(ev, &one, 8);
	send(s, "p", 1, 0);
	wait_readable(s);
	for (int i = 0; i < 4; i++)
		p[i].events = POLLIN;
	n = poll(p, 4, 1000);
	say("poll ready: %d: sock %#x pipe %#x eventfd %#x file %#x", n, p[0].revents, p[1].revents, p[2].revents, p[3].revents);
	char c;
	read(pr, &c, 1);
	read(ev, &one, 8);
	drain(s);
	/* Only the pipe, after a wait. */
	p[0].events = POLLIN;
	pid_t w = fork();
	if (w == 0) {
		usleep(100000);
		write(pw, "y", 1);
		_exit(0);
	}
	n = poll(p, 3, 5000);
	say("poll wakes on the pipe: %d: sock %#x pipe %#x eventfd %#x", n, p[0].revents, p[1].revents, p[2].revents);
	read(pr, &c, 1);
	waitpid(w, NULL, 0);
	/* Only the socket, after a wait: the thread must wake on it. */
	send(s, "q", 1, 0);
	n = poll(p, 3, 5000);
	say("poll wakes on the socket: %d: sock %#x pipe %#x eventfd %#x", n, p[0].revents, p[1].revents, p[2].revents);
	drain(s);
	n = poll(p, 3, 50);
	say("poll times out: %d", n);
}

static void test_select(int s, int pr, int pw, int ev)
{
	fd_set r, w;
	int max = s > pr ? s : pr;
	max = max > ev ? max : ev;
	FD_ZERO(&r); FD_ZERO(&w);
	FD_SET(s, &r); FD_SET(pr, &r); FD_SET(ev, &r); FD_SET(s, &w);
	struct timeval tv = {0, 0};
	int n = select(max + 1, &r, &w, NULL, &tv);
	say("select idle: %d: sock r%d w%d pipe %d eventfd %d", n, FD_ISSET(s, &r), FD_ISSET(s, &w), FD_ISSET(pr, &r), FD_ISSET(ev, &r));
	send(s, "s", 1, 0);
	wait_readable(s);
	write(pw, "x", 1);
	FD_ZERO(&r); FD_ZERO(&w);
	FD_SET(s, &r); FD_SET(pr, &r); FD_SET(ev, &r);
	tv = (struct timeval){1, 0};
	n = select(max + 1, &r, NULL, NULL, &tv);
	say("select ready: %d: sock %d pipe %d eventfd %d", n, FD_ISSET(s, &r), FD_ISSET(pr, &r), FD_ISSET(ev, &r));
	char c;
	read(pr, &c, 1);
	drain(s);
	FD_ZERO(&r);
	FD_SET(s, &r); FD_SET(pr, &r);
	tv = (struct timeval){0, 50000};
	n = select(max + 1, &r, NULL, NULL, &tv);
	say("select times out: %d", n);
}

static void test_epoll(int s, int pr, int pw, int file)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event e = {.events = EPOLLIN | EPOLLET, .data.u64 = 1};
	check("epoll add sock ET", epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
	check("epoll add sock again", epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
	e = (struct epoll_event){.events = EPOLLIN, .data.u64 = 2};
	check("epoll add pipe", epoll_ctl(ep, EPOLL_CTL_ADD, pr, &e));
	check("epoll add file", epoll_ctl(ep, EPOLL_CTL_ADD, file, &e));
	struct epoll_event out[8];
	check("epoll idle", epoll_wait(ep, out, 8, 0));
	send(s, "e", 1, 0);
	wait_readable(s);
	int n = epoll_wait(ep, out, 8, 1000);
	say("epoll sock ready: %d: data %lu events %#x", n, n > 0 ? (unsigned long)out[0].data.u64 : 0UL, n > 0 ? out[0].events : 0);
	check("epoll ET, not read: no new edge", epoll_wait(ep, out, 8, 50));
	drain(s);
	send(s, "f", 1, 0);
	n = epoll_wait(ep, out, 8, 5000);
	say("epoll ET, new data: %d: data %lu", n, n > 0 ? (unsigned long)out[0].data.u64 : 0UL);
	drain(s);
	write(pw, "x", 1);
	n = epoll_wait(ep, out, 8, 1000);
	say("epoll pipe ready: %d: data %lu events %#x", n, n > 0 ? (unsigned long)out[0].data.u64 : 0UL, n > 0 ? out[0].events : 0);
	char c;
	read(pr, &c, 1);
	/* One-shot: reported once, then not until re-armed. */
	e = (struct epoll_event){.events = EPOLLOUT | EPOLLONESHOT, .data.u64 = 3};
	check("epoll mod sock oneshot", epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
	n = epoll_wait(ep, out, 8, 1000);
	say("epoll oneshot first: %d: data %lu", n, n > 0 ? (unsigned long)out[0].data.u64 : 0UL);
	check("epoll oneshot again", epoll_wait(ep, out, 8, 50));
	check("epoll rearm", epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
	check("epoll oneshot rearmed", epoll_wait(ep, out, 8, 1000));
	check("epoll del sock", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
	check("epoll del sock again", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
	check("epoll mod absent", epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
	close(ep);
}

/* test_epoll_before_connect registers a socket in an epoll set before it
 * connects, as nginx does its upstream connections (EPOLLIN|EPOLLOUT|
 * EPOLLRDHUP|EPOLLET, then a non-blocking connect): the registration
 * follows the socket when it is accelerated. A second socket, added and
 * removed before it connects, is not reported. */
static void test_epoll_before_connect(void)
{
	int ep = epoll_create1(EPOLL_CLOEXEC);
	int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int t = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (ep < 0 || s < 0 || t < 0)
		die("before connect: socket");
	struct epoll_event e = {.events = EPOLLIN, .data.u64 = 10};
	check("before connect: add", epoll_ctl(ep, EPOLL_CTL_ADD, s, &e));
	e = (struct epoll_event){.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET, .data.u64 = 11};
	check("before connect: mod", epoll_ctl(ep, EPOLL_CTL_MOD, s, &e));
	e.data.u64 = 12;
	check("before connect: add another", epoll_ctl(ep, EPOLL_CTL_ADD, t, &e));
	check("before connect: del it", epoll_ctl(ep, EPOLL_CTL_DEL, t, NULL));
	int r = connect(s, (struct sockaddr *)&peer, sizeof peer);
	say("before connect: connect %d %s", r, r < 0 ? strerror(errno) : "");
	r = connect(t, (struct sockaddr *)&peer, sizeof peer);
	say("before connect: connect another %d %s", r, r < 0 ? strerror(errno) : "");
	struct epoll_event out[4];
	int n = epoll_wait(ep, out, 4, 5000);
	say("before connect: connected: %d: data %lu events %#x", n, n > 0 ? (unsigned long)out[0].data.u64 : 0UL,
	    n > 0 ? out[0].events & (EPOLLIN | EPOLLOUT | EPOLLERR | EPOLLHUP | EPOLLRDHUP) : 0);
	check("before connect: no new edge", epoll_wait(ep, out, 4, 50));
	const char msg[] = "before-connect";
	check("before connect: send", send(s, msg, sizeof msg - 1, 0));
	n = epoll_wait(ep, out, 4, 5000);
	say("before connect: echo ready: %d: data %lu in %d", n, n > 0 ? (unsigned long)out[0].data.u64 : 0UL,
	    n > 0 && (out[0].events & EPOLLIN));
	fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK);
	char buf[sizeof msg];
	check("before connect: echo read", read_full(s, buf, sizeof msg - 1));
	close(s);
	close(t);
	close(ep);
}

/* epoll_report prints what an epoll_wait reported, its data sorted. */
static int epoll_report(const char *what, int ep, int max, int timeout)
{
	struct epoll_event out[64];
	int n = epoll_wait(ep, out, max, timeout);
	for (int i = 1; i < n; i++)
		for (int j = i; j > 0 && out[j - 1].data.u64 > out[j].data.u64; j--) {
			struct epoll_event t = out[j];
			out[j] = out[j - 1];
			out[j - 1] = t;
		}
	char buf[512];
	int o = snprintf(buf, sizeof buf, "%s: %d:", what, n);
	for (int i = 0; i < n && o < (int)sizeof buf - 8; i++)
		o += snprintf(buf + o, sizeof buf - o, " %lu/%#x", (unsigned long)out[i].data.u64,
			      out[i].events & ~(EPOLLRDNORM | EPOLLWRNORM));
	say("%s", buf);
	return n;
}

#define NMANY 130

static int many[NMANY];

static void *send_later(void *arg)
{
	usleep(100000);
	send(many[(long)arg], "w", 1, 0);
	return NULL;
}

/* test_epoll_many: one instance over many sockets (more than the shim's
 * EP_LOG_WAIT, so that it blocks on its stack's ready log rather than on
 * each socket), where the shim checks only those its stack says may have
 * changed: each ready one reported,
 * again while unread (level-triggered), all of them through a small
 * maxevents, a socket that turns ready while the caller blocks, a
 * write-space interest added later, and one socket in twice (dup). */
static void test_epoll_many(int pr, int pw)
{
	int ep = epoll_create1(0);
	for (int i = 0; i < NMANY; i++) {
		many[i] = dial();
		struct epoll_event e = {.events = EPOLLIN, .data.u64 = i};
		if (epoll_ctl(ep, EPOLL_CTL_ADD, many[i], &e) < 0)
			die("epoll_ctl many");
	}
	epoll_report("many idle", ep, 64, 0);
	int some[] = {5, 17, 33};
	for (int i = 0; i < 3; i++)
		send(many[some[i]], "m", 1, 0);
	for (int i = 0; i < 3; i++)
		wait_readable(many[some[i]]);
	/* Without waiting: what is ready now is reported now. */
	epoll_report("many: three ready", ep, 64, 0);
	epoll_report("many: still ready, unread", ep, 64, 0);
	/* Two at a time: the third comes in the second call. */
	struct epoll_event out[2];
	int seen[NMANY] = {0}, n1 = epoll_wait(ep, out, 2, 0);
	for (int i = 0; i < n1; i++)
		seen[out[i].data.u64] = 1;
	int n2 = epoll_wait(ep, out, 2, 0);
	for (int i = 0; i < n2; i++)
		seen[out[i].data.u64] = 1;
	int nseen = 0;
	for (int i = 0; i < NMANY; i++)
		nseen += seen[i];
	say("many: two calls of maxevents 2: %d and %d, %d distinct", n1, n2, nseen);
	drain(many[17]);
	epoll_report("many: one read", ep, 64, 0);
	drain(many[5]);
	drain(many[33]);
	epoll_report("many: all read", ep, 64, 0);
	/* Data that comes while the caller blocks. */
	pthread_t th;
	pthread_create(&th, NULL, send_later, (void *)29L);
	epoll_report("many: woken by a socket", ep, 64, 5000);
	pthread_join(th, NULL);
	wait_readable(many[29]);
	drain(many[29]);
	epoll_report("many: read again", ep, 64, 0);
	/* Write space, asked for later. */
	struct epoll_event e = {.events = EPOLLIN | EPOLLOUT, .data.u64 = 11};
	check("many: mod for write", epoll_ctl(ep, EPOLL_CTL_MOD, many[11], &e));
	epoll_report("many: writable", ep, 64, 1000);
	e.events = EPOLLIN;
	epoll_ctl(ep, EPOLL_CTL_MOD, many[11], &e);
	/* The same socket through two fds. */
	int d = dup(many[3]);
	e = (struct epoll_event){.events = EPOLLIN, .data.u64 = 100};
	check("many: add a dup", epoll_ctl(ep, EPOLL_CTL_ADD, d, &e));
	send(many[3], "d", 1, 0);
	wait_readable(many[3]);
	epoll_report("many: both fds of one socket", ep, 64, 0);
	drain(many[3]);
	close(d);
	epoll_report("many: dup closed, read", ep, 64, 0);
	/* A pipe turns ready while a socket stays ready, unread: the pipe is
	 * reported too, soon (the shim looks at the kernel's fds less often
	 * while its own are ready, but it looks). */
	e = (struct epoll_event){.events = EPOLLIN, .data.u64 = 200};
	epoll_ctl(ep, EPOLL_CTL_ADD, pr, &e);
	send(many[7], "k", 1, 0);
	wait_readable(many[7]);
	write(pw, "k", 1);
	int pipe_seen = 0;
	double until = now_ns() + 1e9;
	while (!pipe_seen && now_ns() < until) {
		struct epoll_event got[64];
		int n = epoll_wait(ep, got, 64, 0);
		for (int i = 0; i < n; i++)
			pipe_seen |= got[i].data.u64 == 200;
	}
	say("many: a pipe beside a socket that stays ready: reported %d", pipe_seen);
	char c;
	read(pr, &c, 1);
	drain(many[7]);
	close(ep);
	for (int i = 0; i < NMANY; i++)
		close(many[i]);
}

static void test_nonblocking(int s)
{
	int fl = fcntl(s, F_GETFL);
	say("F_GETFL nonblock: %d", !!(fl & O_NONBLOCK));
	fcntl(s, F_SETFL, fl | O_NONBLOCK);
	say("F_GETFL after set: %d", !!(fcntl(s, F_GETFL) & O_NONBLOCK));
	char buf[64];
	check("recv nonblocking, empty", recv(s, buf, sizeof buf, 0));
	send(s, "nonblock", 8, 0);
	wait_readable(s);
	int avail = 0;
	for (int i = 0; i < 100 && avail < 8; i++) {
		ioctl(s, FIONREAD, &avail);
		if (avail < 8)
			usleep(10000);
	}
	say("FIONREAD: %d", avail);
	ssize_t n = recv(s, buf, sizeof buf, MSG_PEEK);
	say("peek: %.*s", (int)n, buf);
	n = recv(s, buf, 3, 0);
	say("read 3: %.*s", (int)n, buf);
	n = recv(s, buf, sizeof buf, 0);
	say("read rest: %.*s", (int)n, buf);
	fcntl(s, F_SETFL, fl);
	int one = 0;
	check("FIONBIO on", ioctl(s, FIONBIO, &(int){1}));
	check("recv after FIONBIO", recv(s, buf, sizeof buf, 0));
	check("FIONBIO off", ioctl(s, FIONBIO, &one));
	check("recv MSG_DONTWAIT", recv(s, buf, sizeof buf, MSG_DONTWAIT));
}

/* test_cork: TCP_CORK holds a partial segment, even with TCP_NODELAY
 * set, until the cork comes out (nginx's tcp_nopush). */
static void test_cork(int s)
{
	int one = 1, zero = 0, v = 0;
	socklen_t l = sizeof v;
	check("TCP_CORK on", setsockopt(s, IPPROTO_TCP, TCP_CORK, &one, sizeof one));
	getsockopt(s, IPPROTO_TCP, TCP_CORK, &v, &l);
	say("TCP_CORK reads: %d", v);
	send(s, "co", 2, 0);
	send(s, "rk", 2, 0);
	struct pollfd p = {.fd = s, .events = POLLIN};
	check("echo of corked data within 100 ms", poll(&p, 1, 100));
	double t0 = now_ns();
	check("TCP_CORK off", setsockopt(s, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero));
	char buf[16];
	size_t got = 0;
	while (got < 4) {
		wait_readable(s);
		ssize_t n = recv(s, buf + got, sizeof buf - got, 0);
		if (n <= 0)
			die("recv");
		got += n;
	}
	say("after uncorking: %.*s, within 100 ms: %d", (int)got, buf, now_ns() - t0 < 100e6);
}

/* An option set before connect through a dup of the unconnected socket
 * is the connection's: data corked so waits for the uncork. */
static void test_option_on_dup(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0), one = 1, zero = 0;
	if (s < 0)
		die("socket");
	int d = dup(s);
	check("TCP_CORK on a dup before connect", setsockopt(d, IPPROTO_TCP, TCP_CORK, &one, sizeof one));
	close(d);
	if (connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	send(s, "du", 2, 0);
	send(s, "pc", 2, 0);
	struct pollfd p = {.fd = s, .events = POLLIN};
	check("echo of data corked through the dup within 100 ms", poll(&p, 1, 100));
	setsockopt(s, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
	char buf[4];
	if (read_full(s, buf, sizeof buf) != sizeof buf)
		die("recv");
	say("after uncorking: %.*s", (int)sizeof buf, buf);
	close(s);
}

static void test_dup(int s, int pr, int pw)
{
	int d = dup(s);
	send(d, "via-dup", 7, 0);
	char buf[64];
	wait_readable(s);
	ssize_t n = 0;
	while (n < 7) {
		ssize_t r = recv(s, buf + n, sizeof buf - n, 0);
		if (r <= 0)
			die("recv dup");
		n += r;
	}
	say("sent on the dup, read on the original: %.*s", (int)n, buf);
	close(d);
	echo(s, "original after closing the dup", "still");
	/* dup2 a pipe over a second socket: the socket closes, the number
	 * is the pipe's. */
	int s2 = dial();
	echo(s2, "second socket", "two");
	check("dup2 pipe over the socket", dup2(pr, s2) == s2);
	write(pw, "z", 1);
	char c = 0;
	check("read the pipe through its number", read(s2, &c, 1));
	say("got %c", c);
	close(s2);
	int s3 = dial();
	int fd = fcntl(s3, F_DUPFD_CLOEXEC, 100);
	check("F_DUPFD_CLOEXEC >= 100", fd >= 100);
	close(s3);
	echo(fd, "socket through its F_DUPFD copy", "three");
	close(fd);
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void *late_send(void *arg)
{
	usleep(300000);
	send(*(int *)arg, "late", 4, 0);
	return NULL;
}

static void test_signals(int s)
{
	char buf[64];
	struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	pthread_t t;
	pthread_create(&t, NULL, late_send, &s);
	struct itimerval it = {.it_value = {0, 100000}};
	setitimer(ITIMER_REAL, &it, NULL);
	ssize_t n = read_full(s, buf, 4); /* late_send's */
	pthread_join(t, NULL);
	say("recv across an SA_RESTART signal: %zd %.*s (alarms %d)", n, n > 0 ? (int)n : 0, buf, (int)alarms);
	/* poll is never restarted. */
	setitimer(ITIMER_REAL, &it, NULL);
	struct pollfd p = {.fd = s, .events = POLLIN};
	check("poll across a signal", poll(&p, 1, 5000));
	/* Without SA_RESTART the blocking call fails with EINTR. */
	sa.sa_flags = 0;
	sigaction(SIGALRM, &sa, NULL);
	setitimer(ITIMER_REAL, &it, NULL);
	check("recv across a signal without SA_RESTART", recv(s, buf, sizeof buf, 0));
	say("alarms %d", (int)alarms);
	signal(SIGALRM, SIG_DFL);
}

/* slept says whether the time since start (ns) is at least want_ms. */
static const char *slept(double start, int want_ms)
{
	return now_ns() - start >= want_ms * 1e6 ? "its time" : "less than its time";
}

/* test_timeouts: SO_RCVTIMEO and SO_SNDTIMEO end a blocking call that
 * waited for them, with what it did or EAGAIN; through a dup made
 * before the option was set too (the option is the socket's), and on
 * accept. A handler ends such a call with EINTR, SA_RESTART or not
 * (signal(7)). */
static void test_timeouts(void)
{
	int c = dial();
	int d = dup(c);
	struct timeval tv = {0, 200000};
	check("SO_RCVTIMEO", setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	char buf[64];
	double t0 = now_ns();
	check("recv past SO_RCVTIMEO", recv(c, buf, sizeof buf, 0));
	say("recv waited %s", slept(t0, 200));
	t0 = now_ns();
	check("read past SO_RCVTIMEO, through a dup made before", read(d, buf, sizeof buf));
	say("read waited %s", slept(t0, 200));
	/* The wait's end is the call's, not each wait's. */
	struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART}, prev;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, &prev);
	struct itimerval it = {.it_value = {0, 50000}};
	setitimer(ITIMER_REAL, &it, NULL);
	check("recv with SO_RCVTIMEO across an SA_RESTART handler", recv(c, buf, sizeof buf, 0));
	sigaction(SIGALRM, &prev, NULL);
	/* Sends until the echo server, whose answers this program does not
	 * read, stops reading. */
	check("SO_SNDTIMEO", setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
	size_t big = 64 << 20;
	char *data = calloc(1, big);
	if (!data)
		die("calloc");
	ssize_t n = send(c, data, big, 0);
	say("send past SO_SNDTIMEO: %s", n > 0 && (size_t)n < big ? "what it sent" : n < 0 && errno == EAGAIN ? "EAGAIN" : "something else");
	free(data);
	close(d);
	close(c);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {.sin_family = AF_INET};
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0)
		die("listener");
	check("SO_RCVTIMEO on a listener", setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	t0 = now_ns();
	check("accept past SO_RCVTIMEO", accept(l, NULL, NULL));
	say("accept waited %s", slept(t0, 200));
	close(l);
}

/* test_trunc: MSG_TRUNC on TCP discards what it takes and leaves the
 * buffer as it was (tcp(7)); beyond one read's worth too. */
static void test_trunc(int s)
{
	char buf[16], big[10000];
	memset(buf, '-', sizeof buf);
	if (send(s, "abcdef", 6, 0) != 6)
		die("send");
	wait_readable(s);
	usleep(20000); /* all six */
	long r = recv(s, buf, 2, MSG_TRUNC);
	say("recv MSG_TRUNC: %ld, the buffer %.2s", r, buf);
	check("the rest", read_full(s, buf, 4));
	say("it is %.4s", buf);
	memset(big, 'x', sizeof big);
	if (send(s, big, sizeof big, 0) != (ssize_t)sizeof big)
		die("send");
	memset(big, '-', sizeof big);
	r = recv(s, big, sizeof big, MSG_TRUNC | MSG_WAITALL);
	int untouched = 1;
	for (size_t i = 0; i < sizeof big; i++)
		untouched &= big[i] == '-';
	say("recv MSG_TRUNC|MSG_WAITALL of %zu: %ld, the buffer untouched: %d", sizeof big, r, untouched);
}

/* test_close_in_call: another thread closes a socket a recv waits on,
 * and the number comes back at once for a new socket with data: one of
 * a socket pair, then a new connection (accelerated under the shim). The
 * kernel's recv goes on with the socket it began on (here until its
 * SO_RCVTIMEO), and so does the shim's (it failed with EBADF before
 * 2026-12-04). Neither may read the new socket's data. */
static int closing = -1;
static char close_buf[8];
static long close_r;

static void *recv_closing(void *arg)
{
	(void)arg;
	close_r = recv(closing, close_buf, sizeof close_buf, 0);
	return NULL;
}

static void test_close_in_call(void)
{
	for (int conn = 0; conn < 2; conn++) {
		closing = dial();
		struct timeval tv = {0, 500000};
		setsockopt(closing, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		pthread_t t;
		pthread_create(&t, NULL, recv_closing, NULL);
		usleep(100000);
		int was = closing, sp[2] = {-1, -1};
		close(closing);
		if (conn) {
			sp[0] = dial(); /* its echo is the data */
			send(sp[0], "conn", 4, 0);
		} else {
			if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0)
				die("socketpair");
			write(sp[0] == was ? sp[1] : sp[0], "pair", 4);
		}
		pthread_join(t, NULL);
		say("a recv on a socket closed meanwhile, its number reused by a %s (%s): it read the new socket's data: %s",
		    conn ? "connection" : "socket pair", sp[0] == was || sp[1] == was ? "yes" : "no",
		    close_r > 0 ? "yes" : "no");
		close(sp[0]);
		if (sp[1] >= 0)
			close(sp[1]);
	}
}

/* test_connect_again: connect on a socket that connected, or tried to.
 * A non-blocking connect's end is told once by the next connect (0 or
 * the error; ECONNABORTED when SO_ERROR took the error), EISCONN after a
 * success; after a failure the socket connects anew (a program that
 * retries until its server is up). Port 1 of the peer refuses. */
static int connect_nb(struct sockaddr_in *to)
{
	int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (c < 0)
		die("socket");
	check("non-blocking connect", connect(c, (struct sockaddr *)to, sizeof *to));
	struct pollfd p = {.fd = c, .events = POLLOUT};
	poll(&p, 1, 5000);
	return c;
}

static void test_connect_again(void)
{
	struct sockaddr_in refused = peer;
	refused.sin_port = htons(1);
	int c = connect_nb(&peer);
	check("connect again, once it is connected", connect(c, (struct sockaddr *)&peer, sizeof peer));
	check("and again", connect(c, (struct sockaddr *)&peer, sizeof peer));
	fcntl(c, F_SETFL, 0);
	echo(c, "connected so", "again");
	close(c);
	c = connect_nb(&peer);
	int err = -1;
	socklen_t l = sizeof err;
	getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &l);
	say("SO_ERROR %d", err);
	check("connect again after SO_ERROR", connect(c, (struct sockaddr *)&peer, sizeof peer));
	close(c);
	c = connect_nb(&refused);
	check("connect again, once it is refused", connect(c, (struct sockaddr *)&refused, sizeof refused));
	check("and again: anew", connect(c, (struct sockaddr *)&refused, sizeof refused));
	close(c);
	c = connect_nb(&refused);
	getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &l);
	say("SO_ERROR %s", strerror(err));
	check("connect again after SO_ERROR", connect(c, (struct sockaddr *)&refused, sizeof refused));
	close(c);
	c = socket(AF_INET, SOCK_STREAM, 0);
	check("blocking connect, refused", connect(c, (struct sockaddr *)&refused, sizeof refused));
	check("again: anew, refused again", connect(c, (struct sockaddr *)&refused, sizeof refused));
	check("and to a server that listens", connect(c, (struct sockaddr *)&peer, sizeof peer));
	echo(c, "connected at the third connect", "third");
	close(c);
}

/* test_foreign_signal: a signal the program has no handler for comes
 * again and again while the thread blocks in epoll_wait, poll and recv:
 * SIGURG, which the kernel ignores by default, and which under the shim
 * is the Go runtime's preemption signal, handled by the core. Neither
 * kind of handler is the program's, so none of the calls fails with
 * EINTR: each returns when the echo comes, as on the kernel. */
static pthread_t main_thread;
static volatile int urg_stop;

static void *urg_sender(void *arg)
{
	(void)arg;
	for (int i = 0; i < 2000 && !urg_stop; i++) {
		pthread_kill(main_thread, SIGURG);
		usleep(5000);
	}
	return NULL;
}

static void *late_write(void *arg)
{
	usleep(300000);
	write(*(int *)arg, "w", 1);
	return NULL;
}

static volatile sig_atomic_t usr2_handled;
static void on_usr2_handled(int sig)
{
	(void)sig;
	usr2_handled++;
}

static void *usr2_later(void *arg)
{
	(void)arg;
	usleep(300000);
	pthread_kill(main_thread, SIGUSR2);
	return NULL;
}

/* test_foreign_signal_sleeps: the sleeps, and the waits for a signal,
 * across SIGURG (test_foreign_signal's sender): none ends early, as on
 * the kernel, which never restarts them after a handler (signal(7)). */
static void test_foreign_signal_sleeps(void)
{
	double t0 = now_ns();
	struct timespec d = {0, 200000000}, rem = {0, 0};
	check("nanosleep across a signal the program does not handle", nanosleep(&d, &rem));
	say("nanosleep slept %s", slept(t0, 200));
	t0 = now_ns();
	say("clock_nanosleep across a signal the program does not handle: %d", clock_nanosleep(CLOCK_MONOTONIC, 0, &d, &rem));
	say("clock_nanosleep slept %s", slept(t0, 200));
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	t0 = now_ns();
	until.tv_nsec += 200000000;
	if (until.tv_nsec >= 1000000000) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000;
	}
	say("clock_nanosleep to a time across a signal the program does not handle: %d",
	    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL));
	say("clock_nanosleep to a time slept %s", slept(t0, 200));
	t0 = now_ns();
	check("usleep across a signal the program does not handle", usleep(200000));
	say("usleep slept %s", slept(t0, 200));
	t0 = now_ns();
	check("sleep across a signal the program does not handle", sleep(1));
	say("sleep slept %s", slept(t0, 1000));
	/* SIGUSR2 blocked: sigtimedwait times out, across SIGURG. */
	sigset_t usr2, old;
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	pthread_sigmask(SIG_BLOCK, &usr2, &old);
	t0 = now_ns();
	struct timespec w = {0, 200000000};
	check("sigtimedwait across a signal the program does not handle", sigtimedwait(&usr2, NULL, &w));
	say("sigtimedwait waited %s", slept(t0, 200));
	pthread_t t;
	pthread_create(&t, NULL, usr2_later, NULL);
	check("sigwaitinfo across a signal the program does not handle", sigwaitinfo(&usr2, NULL));
	pthread_join(t, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	/* pause and sigsuspend end when the program's own handler has run,
	 * 300 ms on, and not before. */
	struct sigaction sa = {.sa_handler = on_usr2_handled}, prev;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, &prev);
	t0 = now_ns();
	pthread_create(&t, NULL, usr2_later, NULL);
	check("pause across a signal the program does not handle", pause());
	say("pause waited %s, for the handler: %d", slept(t0, 250), (int)usr2_handled);
	pthread_join(t, NULL);
	sigset_t none;
	sigemptyset(&none);
	t0 = now_ns();
	pthread_create(&t, NULL, usr2_later, NULL);
	check("sigsuspend across a signal the program does not handle", sigsuspend(&none));
	say("sigsuspend waited %s, for the handler: %d", slept(t0, 250), (int)usr2_handled);
	pthread_join(t, NULL);
	/* The program's own handler still ends a sleep. */
	t0 = now_ns();
	pthread_create(&t, NULL, usr2_later, NULL);
	struct timespec two = {2, 0};
	check("nanosleep across the program's own handler", nanosleep(&two, &rem));
	say("it ended for the handler, with time left: %s", now_ns() - t0 < 1.5e9 && rem.tv_sec >= 1 ? "yes" : "no");
	pthread_join(t, NULL);
	sigaction(SIGUSR2, &prev, NULL);
}

static void test_foreign_signal(int s)
{
	char buf[8];
	main_thread = pthread_self();
	urg_stop = 0;
	pthread_t u, t;
	pthread_create(&u, NULL, urg_sender, NULL);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event e = {.events = EPOLLIN, .data.u64 = 7}, out[4];
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &e);
	pthread_create(&t, NULL, late_send, &s);
	check("epoll_wait across a signal the program does not handle", epoll_wait(ep, out, 4, 5000));
	pthread_join(t, NULL);
	check("its echo", read_full(s, buf, 4));
	pthread_create(&t, NULL, late_send, &s);
	struct pollfd p = {.fd = s, .events = POLLIN};
	check("poll across a signal the program does not handle", poll(&p, 1, 5000));
	pthread_join(t, NULL);
	check("its echo", read_full(s, buf, 4));
	pthread_create(&t, NULL, late_send, &s);
	check("recv across a signal the program does not handle", read_full(s, buf, 4));
	pthread_join(t, NULL);
	/* The same with a pipe alone: the waits go straight to the kernel. */
	int pp[2];
	if (pipe(pp) < 0)
		die("pipe");
	char c;
	pthread_create(&t, NULL, late_write, &pp[1]);
	struct pollfd q = {.fd = pp[0], .events = POLLIN};
	check("poll on a pipe across a signal the program does not handle", poll(&q, 1, 5000));
	pthread_join(t, NULL);
	check("its byte", read(pp[0], &c, 1));
	int ep2 = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event pe = {.events = EPOLLIN, .data.u64 = 8};
	epoll_ctl(ep2, EPOLL_CTL_ADD, pp[0], &pe);
	pthread_create(&t, NULL, late_write, &pp[1]);
	check("epoll_wait on a pipe across a signal the program does not handle", epoll_wait(ep2, out, 4, 5000));
	pthread_join(t, NULL);
	check("its byte", read(pp[0], &c, 1));
	pthread_create(&t, NULL, late_write, &pp[1]);
	fd_set rs;
	FD_ZERO(&rs);
	FD_SET(pp[0], &rs);
	struct timeval tv = {5, 0};
	check("select on a pipe across a signal the program does not handle", select(pp[0] + 1, &rs, NULL, NULL, &tv));
	pthread_join(t, NULL);
	check("its byte", read(pp[0], &c, 1));
	close(ep2);
	close(pp[0]);
	close(pp[1]);
	test_foreign_signal_sleeps();
	urg_stop = 1;
	pthread_join(u, NULL);
	close(ep);
}

/* The handler of test_handler_calls: a socket call of its own, on an
 * idle connection (nothing to read: EAGAIN, as the kernel answers). */
static int idle_sock = -1;
static volatile sig_atomic_t handler_calls, handler_odd;
/* peek_idle peeks at idle_sock, which has nothing to read: EAGAIN, as
 * the kernel answers; anything else counts as odd. */
static void peek_idle(void)
{
	char c;
	if (!(recv(idle_sock, &c, 1, MSG_DONTWAIT | MSG_PEEK) < 0 && errno == EAGAIN))
		handler_odd++;
}

static void on_alarm_call(int sig)
{
	(void)sig;
	int saved = errno;
	peek_idle();
	handler_calls++;
	errno = saved;
}

/* test_handler_calls: signals every millisecond, whose handler makes a socket
 * call, while the thread exchanges bytes on another socket: under the
 * shim the handler often comes while the thread is in the stack, and its
 * call must be answered as the kernel answers it (Onload defers such a
 * handler to the stack's exit). */
static void test_handler_calls(int s)
{
	idle_sock = dial();
	struct sigaction sa = {.sa_handler = on_alarm_call, .sa_flags = SA_RESTART};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, NULL);
	struct itimerval it = {.it_interval = {0, 1000}, .it_value = {0, 1000}};
	setitimer(ITIMER_REAL, &it, NULL);
	double end = now_ns() + 300e6;
	int rounds = 0, odd = 0;
	for (; rounds < 100000 && now_ns() < end; rounds++) {
		char c;
		if (send(s, "x", 1, 0) != 1 || recv(s, &c, 1, 0) != 1 || c != 'x')
			odd++;
	}
	struct itimerval off = {0};
	setitimer(ITIMER_REAL, &off, NULL);
	signal(SIGALRM, SIG_DFL);
	say("socket calls in a handler during the thread's own: %d answered otherwise than the kernel's, "
	    "%d of the thread's failed, handler ran: %s", (int)handler_odd, odd, handler_calls > 0 ? "yes" : "no");
	close(idle_sock);
}

/* test_nested_signal: a handler makes socket calls, one after another,
 * while another signal with a handler of its own comes every few tens of
 * microseconds. Under the shim both handlers run on the thread's signal
 * stack, and the first one's calls enter the Go core, which runs on a
 * stack of its own: a signal that came in there was given a frame at the
 * top of the signal stack again, over the first handler's own (the
 * process crashed as it returned; the Go runtime's preemption signal did
 * the same, now and then, in test_handler_calls). */
static volatile sig_atomic_t usr2s;
static volatile int usr2_stop;
static void on_usr2_count(int sig)
{
	(void)sig;
	usr2s++;
}

static void on_alarm_calls(int sig)
{
	(void)sig;
	int saved = errno;
	for (int i = 0; i < 100; i++)
		peek_idle();
	handler_calls++;
	errno = saved;
}

static void *usr2_sender(void *arg)
{
	for (int i = 0; i < 20000 && !usr2_stop; i++) {
		pthread_kill(*(pthread_t *)arg, SIGUSR2);
		usleep(20);
	}
	return NULL;
}

static void test_nested_signal(void)
{
	idle_sock = dial();
	handler_calls = handler_odd = usr2s = 0;
	struct sigaction sa = {.sa_handler = on_usr2_count, .sa_flags = SA_RESTART};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR2, &sa, NULL);
	sa.sa_handler = on_alarm_calls;
	sigaction(SIGALRM, &sa, NULL);
	pthread_t self = pthread_self(), t;
	usr2_stop = 0;
	pthread_create(&t, NULL, usr2_sender, &self);
	struct itimerval it = {.it_interval = {0, 2000}, .it_value = {0, 2000}};
	setitimer(ITIMER_REAL, &it, NULL);
	double end = now_ns() + 300e6;
	while (now_ns() < end && handler_calls < 1000)
		usleep(100);
	struct itimerval off = {0};
	setitimer(ITIMER_REAL, &off, NULL);
	usr2_stop = 1;
	pthread_join(t, NULL);
	signal(SIGALRM, SIG_DFL);
	signal(SIGUSR2, SIG_DFL);
	say("a handler's socket calls while another handler's signal comes: %d answered otherwise than the kernel's, "
	    "handlers ran: %s %s", (int)handler_odd, handler_calls > 0 ? "yes" : "no", usr2s > 0 ? "yes" : "no");
	close(idle_sock);
}

/* test_early_handler: the same, with signals sent by another thread to
 * this one, and a handler the program set before its first socket (the
 * core loads at that socket, and the Go runtime, starting, reads and
 * sets the program's handlers). */
static volatile int usr1_stop;
static void *usr1_sender(void *arg)
{
	for (int i = 0; i < 1000 && !usr1_stop; i++) {
		pthread_kill(*(pthread_t *)arg, SIGUSR1);
		usleep(500);
	}
	return NULL;
}

static void test_early_handler(int s)
{
	idle_sock = dial();
	handler_calls = handler_odd = 0;
	pthread_t self = pthread_self(), t;
	usr1_stop = 0;
	pthread_create(&t, NULL, usr1_sender, &self);
	double end = now_ns() + 300e6;
	int odd = 0;
	for (int rounds = 0; rounds < 100000 && now_ns() < end; rounds++) {
		char c;
		if (send(s, "x", 1, 0) != 1 || recv(s, &c, 1, 0) != 1 || c != 'x')
			odd++;
	}
	usr1_stop = 1;
	pthread_join(t, NULL);
	struct sigaction a;
	sigaction(SIGUSR1, NULL, &a);
	say("a handler set before the first socket: %d of its socket calls answered otherwise than the kernel's, "
	    "%d of the thread's failed, handler ran: %s, reads back as set: %d", (int)handler_odd, odd,
	    handler_calls > 0 ? "yes" : "no", a.sa_handler == on_alarm_call);
	signal(SIGUSR1, SIG_DFL);
	close(idle_sock);
}

static void test_fork_after(int s)
{
	pid_t p = fork();
	if (p == 0) {
		/* Closing the inherited socket closes only our fd. */
		close(s);
		_exit(0);
	}
	int st;
	waitpid(p, &st, 0);
	say("child forked after: exit %d", WEXITSTATUS(st));
	echo(s, "parent after the child closed its copy", "alive");
	/* A child that uses the inherited connection, then the parent. */
	p = fork();
	if (p == 0) {
		echo(s, "child using the inherited connection", "from-child-after");
		_exit(0);
	}
	waitpid(p, &st, 0);
	say("child that used the connection: exit %d", WEXITSTATUS(st));
	echo(s, "parent after the child used the connection", "parent-again");
}

static const char *disposition(int sig)
{
	struct sigaction a;
	if (sigaction(sig, NULL, &a) < 0)
		return strerror(errno);
	return a.sa_handler == SIG_DFL ? "default" : a.sa_handler == SIG_IGN ? "ignored" : "handled";
}

static void on_usr2(int sig) { (void)sig; }

/* The dispositions the program set (or left) read back as it set them,
 * whatever the shim and the Go runtime installed; and signals at their
 * default end children as on the kernel. */
static void test_dispositions(void)
{
	int sigs[] = {SIGPIPE, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGURG, SIGCHLD,
		      SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
	for (unsigned i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		say("signal %d: %s", sigs[i], disposition(sigs[i]));
	signal(SIGUSR2, on_usr2);
	say("SIGUSR2 after a handler: %s", disposition(SIGUSR2));
	signal(SIGUSR2, SIG_DFL);
	say("SIGUSR2 back at the default: %s", disposition(SIGUSR2));
	say("signal(SIGTERM, SIG_IGN) returned the default: %d", signal(SIGTERM, SIG_IGN) == SIG_DFL);
	say("signal(SIGTERM, SIG_DFL) returned ignore: %d", signal(SIGTERM, SIG_DFL) == SIG_IGN);
	signal(SIGSEGV, on_usr2);
	say("SIGSEGV after a handler: %s", disposition(SIGSEGV));
	say("signal(SIGSEGV, SIG_DFL) returned the handler: %d", signal(SIGSEGV, SIG_DFL) == on_usr2);
	say("SIGSEGV back at the default: %s", disposition(SIGSEGV));
	/* Children that end by a signal at its default: a write to a pipe
	 * with no reader (SIGPIPE), SIGTERM, SIGUSR2, which had a handler in
	 * between, a fault (SIGSEGV) and abort() (SIGABRT). */
	for (int k = 0; k < 5; k++) {
		pid_t p = fork();
		if (p == 0) {
			struct rlimit none = {0, 0};
			setrlimit(RLIMIT_CORE, &none); /* no core file */
			if (k == 0) {
				int pp[2];
				signal(SIGPIPE, SIG_DFL);
				if (pipe(pp) == 0 && close(pp[0]) == 0)
					write(pp[1], "x", 1);
			} else if (k == 3) {
				*(volatile int *)(uintptr_t)(k - 3) = 1; /* null, unseen by the compiler */
			} else if (k == 4) {
				abort();
			} else {
				raise(k == 1 ? SIGTERM : SIGUSR2);
			}
			_exit(0);
		}
		int st;
		waitpid(p, &st, 0);
		say("child %d: %s %d", k, WIFSIGNALED(st) ? "killed by" : "exit", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
	}
}

static void test_names(int s)
{
	struct sockaddr_in a;
	socklen_t l = sizeof a;
	check("getpeername", getpeername(s, (struct sockaddr *)&a, &l));
	say("peer %s:%d len %d", inet_ntoa(a.sin_addr), ntohs(a.sin_port), (int)l);
	l = sizeof a;
	check("getsockname", getsockname(s, (struct sockaddr *)&a, &l));
	say("local family %d nonzero port %d", a.sin_family, a.sin_port != 0);
	int v = 0;
	l = sizeof v;
	check("SO_ERROR", getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &l));
	say("SO_ERROR value %d", v);
	l = sizeof v;
	check("SO_TYPE", getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &l));
	say("SO_TYPE value %d", v);
	l = sizeof v;
	getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &l);
	say("TCP_NODELAY %d", v != 0);
	struct tcp_info ti;
	l = sizeof ti;
	check("TCP_INFO", getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &l));
	say("TCP_INFO state %d", ti.tcpi_state);
}

static void test_shutdown(int s)
{
	send(s, "bye", 3, 0);
	check("shutdown SHUT_WR", shutdown(s, SHUT_WR));
	char buf[64];
	ssize_t n = 0, r;
	while ((r = recv(s, buf + n, sizeof buf - n, 0)) > 0)
		n += r;
	say("after shutdown: %.*s then %zd", (int)n, buf, r);
	check("send after SHUT_WR", send(s, "x", 1, MSG_NOSIGNAL));
	close(s);
}

/* ticks is a fine clock for timing single calls: the time-stamp counter
 * where there is one (CLOCK_MONOTONIC moves in 10 ns steps on some
 * virtual machines), else CLOCK_MONOTONIC in ns. */
static inline uint64_t ticks(void)
{
#if defined(__x86_64__)
	unsigned lo, hi;
	__asm__ __volatile__("lfence; rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
#else
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + t.tv_nsec;
#endif
}

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* sys_read is read(2) made through the C library's own syscall(2),
 * found in the C library itself: the shim interposes syscall(2) too (for
 * io_uring), and the baseline is the C library's call, never an
 * interposer's. */
static long sys_read(int fd, void *buf, size_t n)
{
	static long (*libc_syscall)(long, ...);
	if (!libc_syscall) {
		void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
		if (libc)
			*(void **)&libc_syscall = dlsym(libc, "syscall");
		if (!libc_syscall)
			libc_syscall = syscall;
	}
	return libc_syscall(SYS_read, fd, buf, n);
}

/* bench times read() of an empty pipe through libc's read (interposed,
 * under the shim) and through the C library's syscall(2) (sys_read:
 * never interposed), one call of
 * each in turn, each call timed on its own, and prints the medians and
 * their difference: what interposition costs a call on a kernel fd. A
 * system call costs a microsecond or more on a virtual machine, and its
 * time moves by more than the interposer's cost from one block of calls
 * to the next. The middle half of the single calls' times (the mean
 * between their quartiles: the clock moves in 10 ns steps on some
 * virtual machines, and the calls' own jitter averages the steps out)
 * does not. */
static void bench(void)
{
	int p[2];
	if (pipe2(p, O_NONBLOCK) < 0)
		die("pipe");
	enum { n = 200000 };
	static double viaread[n], direct[n];
	char c;
	for (int i = 0; i < 1000; i++)
		read(p[0], &c, 1);
	double t0 = now_ns();
	uint64_t k0 = ticks();
	for (int i = 0; i < n; i++) {
		/* In turn which goes first. */
		uint64_t a = ticks();
		if (i & 1)
			sys_read(p[0], &c, 1);
		else
			read(p[0], &c, 1);
		uint64_t b = ticks();
		if (i & 1)
			read(p[0], &c, 1);
		else
			sys_read(p[0], &c, 1);
		uint64_t d = ticks();
		viaread[i] = i & 1 ? d - b : b - a;
		direct[i] = i & 1 ? b - a : d - b;
	}
	double per = (now_ns() - t0) / (double)(ticks() - k0); /* ns per tick */
	qsort(viaread, n, sizeof(double), cmp_double);
	qsort(direct, n, sizeof(double), cmp_double);
	double r = 0, d = 0;
	for (int i = n / 4; i < 3 * n / 4; i++) {
		r += viaread[i];
		d += direct[i];
	}
	r *= per / (n / 2);
	d *= per / (n / 2);
	printf("read %.1f ns/op, syscall %.1f ns/op, difference %.1f ns/op\n", r, d, r - d);
}

int main(int argc, char **argv)
{
	if (argc == 2 && strcmp(argv[1], "bench") == 0) {
		bench();
		return 0;
	}
	if (argc != 3) {
		fprintf(stderr, "usage: mixed ADDR PORT | mixed bench\n");
		return 2;
	}
	if (set_peer("mixed", argv[1], argv[2]))
		return 2;
	signal(SIGPIPE, SIG_IGN);
	struct sigaction usr1 = {.sa_handler = on_alarm_call, .sa_flags = SA_RESTART};
	sigemptyset(&usr1.sa_mask);
	sigaction(SIGUSR1, &usr1, NULL); /* for test_early_handler */
	test_fork_before();
	int pp[2];
	if (pipe(pp) < 0)
		die("pipe");
	int ev = eventfd(0, EFD_NONBLOCK);
	char tmpl[] = "/tmp/mixed.XXXXXX";
	int file = mkstemp(tmpl);
	unlink(tmpl);
	write(file, "file", 4);
	lseek(file, 0, SEEK_SET);
	int s = dial();
	echo(s, "first socket", "hello");
	test_fd_numbers("with the first socket");
	test_poll(s, pp[0], pp[1], ev, file);
	test_select(s, pp[0], pp[1], ev);
	test_epoll(s, pp[0], pp[1], file);
	test_epoll_before_connect();
	test_epoll_many(pp[0], pp[1]);
	test_nonblocking(s);
	test_cork(s);
	test_option_on_dup();
	test_dup(s, pp[0], pp[1]);
	test_names(s);
	test_signals(s);
	test_foreign_signal(s);
	test_timeouts();
	test_trunc(s);
	test_close_in_call();
	test_connect_again();
	test_handler_calls(s);
	test_nested_signal();
	test_early_handler(s);
	test_fork_after(s);
	test_dispositions();
	test_shutdown(s);
	test_fd_numbers("at the end");
	say("done");
	return 0;
}
