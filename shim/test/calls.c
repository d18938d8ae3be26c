/*
 * calls: the shim's conformance program for the calls mixed.c does not
 * make. It talks to a TCP echo server (the kernel's, in the other test
 * host) with writev/readv, sendmmsg/recvmmsg, sendfile and splice; waits in
 * ppoll, pselect, epoll_pwait and epoll_pwait2 with signal masks and
 * timeouts; makes an epoll instance with epoll_create; dup3s a socket;
 * sets and reads the socket options servers use, and what the low-water
 * marks do (SO_RCVLOWAT, TCP_NOTSENT_LOWAT); runs a helper by vfork
 * and exec; hands a connection across exec to a program of its own (as
 * inetd does, and by posix_spawn and system()) and over a Unix socket
 * (SCM_RIGHTS); asks for SIGIO (O_ASYNC); sends with MSG_ZEROCOPY and
 * reads its completions; and makes a connection after daemon(). It prints one line
 * per result, nothing that depends on timing or on port numbers, so that
 * its output under the shim must be the same as without it (the
 * reference).
 *
 *	calls ADDR PORT       the conformance run
 *	calls child FD [WHO]  (run by the exec and spawn tests) echo on FD
 *	                      and exit, WHO naming the test in its lines
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/errqueue.h>
#include <linux/sockios.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conform.h"

static void test_vectors(int s)
{
	struct iovec out[3] = {{"ab", 2}, {"cde", 3}, {"fgh", 3}};
	check("writev", writev(s, out, 3));
	await(s, 8);
	char a[4], b[4];
	struct iovec in[2] = {{a, 4}, {b, 4}};
	ssize_t r = readv(s, in, 2);
	say("readv: %zd %.4s %.4s", r, a, b);
	check("writev, no vectors", writev(s, out, 0));
	struct iovec bad = {NULL, 4};
	check("writev, a bad buffer", writev(s, &bad, 1));
}

/* mmsgs makes m[0..n) the messages of the n buffers iov. */
static void mmsgs(struct mmsghdr *m, struct iovec *iov, int n)
{
	memset(m, 0, n * sizeof *m);
	for (int k = 0; k < n; k++) {
		m[k].msg_hdr.msg_iov = &iov[k];
		m[k].msg_hdr.msg_iovlen = 1;
	}
}

static void test_mmsg(int s)
{
	struct iovec o[2] = {{"one", 3}, {"two!", 4}};
	struct mmsghdr m[2];
	mmsgs(m, o, 2);
	int r = sendmmsg(s, m, 2, 0);
	say("sendmmsg: %d (%u %u)", r, m[0].msg_len, m[1].msg_len);
	await(s, 7);
	char a[3], b[4];
	struct iovec i[2] = {{a, 3}, {b, 4}};
	mmsgs(m, i, 2);
	r = recvmmsg(s, m, 2, MSG_WAITFORONE, NULL);
	say("recvmmsg: %d (%u %.3s) (%u %.4s)", r, m[0].msg_len, a, m[1].msg_len, b);
	check("recvmmsg, nothing there", recvmmsg(s, m, 2, MSG_DONTWAIT, NULL));
	/* MSG_WAITFORONE: the first waits, the rest take what is there. */
	send(s, "xyz", 3, 0);
	await(s, 3);
	mmsgs(m, i, 2);
	check("recvmmsg, one there", recvmmsg(s, m, 2, MSG_WAITFORONE, NULL));
}

/* At the end of the stream every recvmsg returns 0 at once: recvmmsg
 * fills all its messages with nothing. */
static void test_mmsg_eof(void)
{
	int s = dial();
	check("shutdown for the end", shutdown(s, SHUT_WR));
	char a[4], b[4];
	struct iovec i[2] = {{a, 4}, {b, 4}};
	struct mmsghdr m[2];
	mmsgs(m, i, 2);
	m[1].msg_len = 99;
	int r = recvmmsg(s, m, 2, 0, NULL);
	say("recvmmsg at the end: %d (%u %u)", r, m[0].msg_len, m[1].msg_len);
	close(s);
}

static void *send_later(void *arg)
{
	usleep(50000);
	send(*(int *)arg, "def", 3, 0);
	return NULL;
}

static void test_flags(int s)
{
	char buf[8];
	check("recv of 0 bytes", recv(s, buf, 0, MSG_DONTWAIT));
	check("send with MSG_MORE", send(s, "ab", 2, MSG_MORE));
	check("send after it", send(s, "c", 1, 0));
	/* MSG_WAITALL: the call waits for all 6, half of them sent later. */
	pthread_t t;
	pthread_create(&t, NULL, send_later, &s);
	ssize_t r = recv(s, buf, 6, MSG_WAITALL);
	pthread_join(t, NULL);
	say("recv MSG_WAITALL: %zd %.6s", r, r == 6 ? buf : "");
	/* The error queue and urgent data are not the stream: with data
	 * waiting, neither takes it. */
	send(s, "q", 1, 0);
	await(s, 1);
	check("recv MSG_ERRQUEUE", recv(s, buf, sizeof buf, MSG_ERRQUEUE | MSG_DONTWAIT));
	check("recv MSG_OOB, none", recv(s, buf, sizeof buf, MSG_OOB | MSG_DONTWAIT));
	char ctl[64];
	struct msghdr m = {.msg_control = ctl, .msg_controllen = sizeof ctl};
	check("recvmsg MSG_ERRQUEUE, no buffer", recvmsg(s, &m, MSG_ERRQUEUE | MSG_DONTWAIT));
	r = recv(s, buf, sizeof buf, 0);
	say("the data after them: %zd %.1s", r, r == 1 ? buf : "");

}

static void test_shut_rd(void)
{
	int s = dial();
	echo(s, "before SHUT_RD", "rd");
	check("shutdown SHUT_RD", shutdown(s, SHUT_RD));
	char c;
	check("recv after SHUT_RD", recv(s, &c, 1, 0));
	check("send after SHUT_RD", send(s, "x", 1, 0));
	close(s);
}

/* splice between the socket and a pipe, both ways (a proxy's relay). */
static void test_splice(int s)
{
	int pp[2];
	if (pipe(pp) < 0)
		die("pipe");
	send(s, "splice", 6, 0);
	await(s, 6);
	check("splice from the socket", splice(s, NULL, pp[1], NULL, 6, 0));
	char buf[16];
	ssize_t r = read(pp[0], buf, sizeof buf);
	say("the pipe: %zd %.*s", r, (int)(r > 0 ? r : 0), buf);
	write(pp[1], "back", 4);
	check("splice to the socket", splice(pp[0], NULL, s, NULL, 4, 0));
	r = read_full(s, buf, 4);
	say("its echo: %zd %.4s", r, r == 4 ? buf : "");
	loff_t off = 0;
	check("splice with an offset on the socket", splice(s, &off, pp[1], NULL, 6, 0));
	check("splice with an offset on the pipe", splice(s, NULL, pp[1], &off, 6, 0));
	int f = open("/dev/null", O_WRONLY);
	check("splice to a file", splice(s, NULL, f, NULL, 6, 0));
	close(f);
	close(pp[0]);
	close(pp[1]);
}

/* A client that binds its end first (port 0: the kernel's choice) keeps
 * that port through connect. */
static void test_bind_connect(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in me = {.sin_family = AF_INET};
	check("bind to port 0", bind(s, (struct sockaddr *)&me, sizeof me));
	socklen_t l = sizeof me;
	getsockname(s, (struct sockaddr *)&me, &l);
	int port = ntohs(me.sin_port);
	say("bound to a port: %d", port != 0);
	check("connect", connect(s, (struct sockaddr *)&peer, sizeof peer));
	struct sockaddr_in after;
	l = sizeof after;
	getsockname(s, (struct sockaddr *)&after, &l);
	say("connected from that port: %d", ntohs(after.sin_port) == port);
	echo(s, "bound first", "bnd");
	check("bind again", bind(s, (struct sockaddr *)&me, sizeof me));
	check("connect again", connect(s, (struct sockaddr *)&peer, sizeof peer));
	close(s);
}

static volatile sig_atomic_t sigios;
static void on_sigio(int sig)
{
	(void)sig;
	sigios++;
}

/* Signal-driven I/O: SIGIO when the echo comes. */
static void test_async(void)
{
	int s = dial();
	signal(SIGIO, on_sigio);
	check("F_SETOWN", fcntl(s, F_SETOWN, getpid()));
	check("F_SETFL O_ASYNC", fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_ASYNC));
	say("its O_ASYNC: %d", !!(fcntl(s, F_GETFL) & O_ASYNC));
	send(s, "io", 2, 0);
	for (int i = 0; i < 500 && !sigios; i++)
		usleep(10000);
	say("SIGIO at the echo: %d", sigios > 0);
	char buf[2];
	say("the echo: %zd", read_full(s, buf, 2));
	close(s);
	signal(SIGIO, SIG_DFL);
}

/* A connection passed over a Unix socket (SCM_RIGHTS), its sender's
 * copy closed: the fd received carries it. */
/* SIOCOUTQ and SIOCOUTQNSD: what is written and not acknowledged, and
 * what is not sent: corked, with the send buffer full (the peer's echo,
 * unread, stops it), and after all came back. */
static void test_outq(void)
{
	int s = dial(), q = -1, nsd = -1, one = 1, zero = 0;
	setsockopt(s, IPPROTO_TCP, TCP_CORK, &one, sizeof one);
	send(s, "corked", 6, 0);
	say("corked: SIOCOUTQ %d %d", ioctl(s, SIOCOUTQ, &q), q);
	say("corked: SIOCOUTQNSD %d %d", ioctl(s, SIOCOUTQNSD, &nsd), nsd);
	setsockopt(s, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
	char back[6];
	say("uncorked: %zd", read_full(s, back, 6));
	q = nsd = -1;
	fcntl(s, F_SETFL, O_NONBLOCK);
	static char buf[65536];
	size_t sent = 0;
	int full = 0;
	for (int i = 0; i < 4096; i++) {
		ssize_t r = send(s, buf, sizeof buf, 0);
		if (r >= 0) {
			sent += r;
			continue;
		}
		if (errno != EAGAIN)
			break;
		full = 1;
		/* Full for a moment, the send buffer can empty as the peer
		 * acknowledges while it still has room (the kernel's queue was
		 * found empty so, once); once the peer's window closes (its
		 * echo, unread, stops it reading) it stays full. */
		if (ioctl(s, SIOCOUTQ, &q) == 0 && q > 0)
			break;
		usleep(1000);
	}
	say("send until EAGAIN: %s", full ? "EAGAIN" : strerror(errno));
	say("SIOCOUTQ > 0: %d (%d)", ioctl(s, SIOCOUTQ, &q) == 0 && q > 0, q > 0 ? 0 : q);
	/* How much is not sent depends on the two ends' buffers. */
	say("SIOCOUTQNSD in 0..SIOCOUTQ: %d", ioctl(s, SIOCOUTQNSD, &nsd) == 0 && nsd >= 0 && nsd <= q);
	fcntl(s, F_SETFL, 0);
	size_t got = 0;
	while (got < sent) {
		ssize_t r = recv(s, buf, sizeof buf, 0);
		if (r <= 0)
			break;
		got += r;
	}
	say("all back: %d", got == sent);
	q = nsd = -1;
	say("then SIOCOUTQ: %d %d", ioctl(s, SIOCOUTQ, &q), q);
	say("then SIOCOUTQNSD: %d %d", ioctl(s, SIOCOUTQNSD, &nsd), nsd);
	close(s);
}

/* MSG_ZEROCOPY on a socket with SO_ZEROCOPY: the send's completion comes
 * on the error queue (POLLERR), as msg_zerocopy.rst has it. */
static void test_zerocopy(void)
{
	int s = dial(), one = 1;
	check("set SO_ZEROCOPY", setsockopt(s, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one));
	static char buf[8192];
	memset(buf, 'z', sizeof buf);
	check("send MSG_ZEROCOPY", send(s, buf, sizeof buf, MSG_ZEROCOPY));
	check("send MSG_ZEROCOPY again", send(s, buf, sizeof buf, MSG_ZEROCOPY));
	static char back[2 * sizeof buf];
	say("its echo: %zd", read_full(s, back, sizeof back));
	for (int i = 0; i < 2; i++) {
		struct pollfd p = {.fd = s};
		int r = poll(&p, 1, 5000);
		say("poll for the completion: %d, POLLERR %d", r, !!(p.revents & POLLERR));
		char ctl[128];
		struct msghdr m = {.msg_control = ctl, .msg_controllen = sizeof ctl};
		ssize_t n = recvmsg(s, &m, MSG_ERRQUEUE);
		if (n < 0) {
			say("recvmsg MSG_ERRQUEUE: -1 %s", strerror(errno));
			break;
		}
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		if (!c) {
			say("recvmsg MSG_ERRQUEUE: %zd, no message", n);
			break;
		}
		struct sock_extended_err ee;
		memcpy(&ee, CMSG_DATA(c), sizeof ee);
		say("recvmsg MSG_ERRQUEUE: %zd, level %d type %d, errno %u origin %u, sends %u to %u", n,
		    c->cmsg_level, c->cmsg_type, ee.ee_errno, ee.ee_origin, ee.ee_info, ee.ee_data);
		if (ee.ee_data == 1)
			break; /* both in one */
	}
	close(s);
}

static void test_pass(void)
{
	int s = dial();
	echo(s, "before passing", "pass");
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp) < 0)
		die("socketpair");
	check("sendmsg SCM_RIGHTS", send_fd(sp[0], s));
	close(s);
	int r;
	check("recvmsg", recv_fd(sp[1], &r));
	say("an fd received: %d", r >= 0);
	if (r >= 0) {
		echo(r, "passed", "passed");
		close(r);
	}
	close(sp[0]);
	close(sp[1]);
}

static void test_sendfile(int s)
{
	char tmpl[] = "/tmp/calls.XXXXXX";
	int f = mkstemp(tmpl);
	if (f < 0)
		die("mkstemp");
	unlink(tmpl);
	if (write(f, "0123456789", 10) != 10)
		die("write");
	off_t off = 2;
	ssize_t r = sendfile(s, f, &off, 5);
	char buf[16];
	say("sendfile at 2: %zd, offset %ld, echo %.*s", r, (long)off,
	    (int)(r > 0 && read_full(s, buf, r) == r ? r : 0), buf);
	lseek(f, 1, SEEK_SET);
	r = sendfile(s, f, NULL, 3);
	say("sendfile from the file's offset: %zd, now %ld, echo %.*s", r, (long)lseek(f, 0, SEEK_CUR),
	    (int)(r > 0 && read_full(s, buf, r) == r ? r : 0), buf);
	r = sendfile(s, f, NULL, 100);
	say("sendfile past the end: %zd, echo %.*s", r, (int)(r > 0 && read_full(s, buf, r) == r ? r : 0), buf);
	check("sendfile at the end", sendfile(s, f, NULL, 100));
	close(f);
	check("sendfile from a closed file", sendfile(s, f, NULL, 1));
}

static volatile sig_atomic_t usr1s;
static void on_usr1(int sig)
{
	(void)sig;
	usr1s++;
}

/* Each wait below runs with SIGUSR1 blocked and pending, and unblocks it
 * by its own mask: the kernel delivers it and the wait fails with EINTR
 * at once. Without a mask, or with one that blocks it, the wait times
 * out. */
static void test_masks(int s)
{
	struct sigaction sa = {.sa_handler = on_usr1};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, NULL);
	sigset_t usr1, none, old;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigemptyset(&none);
	pthread_sigmask(SIG_BLOCK, &usr1, &old);
	struct timespec t50 = {0, 50000000};
	struct pollfd p = {.fd = s, .events = POLLIN};

	check("ppoll, idle, 50 ms", ppoll(&p, 1, &t50, NULL));
	raise(SIGUSR1);
	check("ppoll, SIGUSR1 blocked and pending, its mask blocks it", ppoll(&p, 1, &t50, &usr1));
	check("ppoll, its mask lets SIGUSR1 in", ppoll(&p, 1, NULL, &none));
	say("handled %d", (int)usr1s);

	fd_set r;
	FD_ZERO(&r);
	FD_SET(s, &r);
	check("pselect, idle, 50 ms", pselect(s + 1, &r, NULL, NULL, &t50, NULL));
	raise(SIGUSR1);
	FD_ZERO(&r);
	FD_SET(s, &r);
	check("pselect, its mask lets SIGUSR1 in", pselect(s + 1, &r, NULL, NULL, NULL, &none));
	say("handled %d", (int)usr1s);

	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, got[2];
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	check("epoll_pwait, idle, 50 ms", epoll_pwait(ep, got, 2, 50, NULL));
	raise(SIGUSR1);
	check("epoll_pwait, its mask lets SIGUSR1 in", epoll_pwait(ep, got, 2, -1, &none));
	say("handled %d", (int)usr1s);
	check("epoll_pwait2, idle, 50 ms", epoll_pwait2(ep, got, 2, &t50, NULL));
	raise(SIGUSR1);
	check("epoll_pwait2, its mask lets SIGUSR1 in", epoll_pwait2(ep, got, 2, NULL, &none));
	say("handled %d", (int)usr1s);
	send(s, "ping", 4, 0);
	struct timespec t5 = {5, 0};
	int n = epoll_pwait2(ep, got, 2, &t5, &none);
	say("epoll_pwait2, data: %d, the socket's: %d", n, n == 1 && got[0].data.fd == s);
	char buf[4];
	read_full(s, buf, 4);
	close(ep);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	say("handled %d", (int)usr1s);
}

static void test_epoll_create(int s)
{
	check("epoll_create(0)", epoll_create(0));
	int ep = epoll_create(1);
	say("epoll_create(1): %s", ep >= 0 ? "an fd" : strerror(errno));
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = 7}, got;
	check("epoll_ctl add", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
	check("epoll_wait, idle", epoll_wait(ep, &got, 1, 0));
	send(s, "e", 1, 0);
	int n = epoll_wait(ep, &got, 1, 5000);
	say("epoll_wait: %d, data %u", n, n == 1 ? got.data.u32 : 0);
	char c;
	recv(s, &c, 1, 0);
	check("fcntl F_GETFD", fcntl(ep, F_GETFD));
	close(ep);
}

static void test_dup3(int s)
{
	check("dup3 onto itself", dup3(s, s, 0));
	check("dup3 with a bad flag", dup3(s, 90, O_NONBLOCK));
	int t = dup3(s, 90, O_CLOEXEC);
	say("dup3: %d", t);
	check("its F_GETFD", fcntl(t, F_GETFD));
	check("the original's F_GETFD", fcntl(s, F_GETFD));
	echo(t, "through dup3's", "d3");
	close(t);
	echo(s, "the original after", "d3x");
}

static void setint(int s, int level, int opt, const char *name, int v)
{
	if (setsockopt(s, level, opt, &v, sizeof v) < 0)
		say("set %s %d: %s", name, v, strerror(errno));
	getint(s, level, opt, name);
}

static void test_options(int s)
{
	static const struct {
		int level, opt;
		const char *name;
		int v;
	} sets[] = {
		{SOL_SOCKET, SO_KEEPALIVE, "SO_KEEPALIVE", 1},
		{IPPROTO_TCP, TCP_KEEPIDLE, "TCP_KEEPIDLE", 30},
		{IPPROTO_TCP, TCP_KEEPINTVL, "TCP_KEEPINTVL", 5},
		{IPPROTO_TCP, TCP_KEEPCNT, "TCP_KEEPCNT", 3},
		{IPPROTO_TCP, TCP_KEEPIDLE, "TCP_KEEPIDLE", 0},
		{IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY", 0},
		{IPPROTO_TCP, TCP_NODELAY, "TCP_NODELAY", 1},
		{SOL_SOCKET, SO_REUSEADDR, "SO_REUSEADDR", 1},
		{SOL_SOCKET, SO_RCVBUF, "SO_RCVBUF", 65536},
		{SOL_SOCKET, SO_SNDBUF, "SO_SNDBUF", 65536},
		{SOL_SOCKET, SO_RCVLOWAT, "SO_RCVLOWAT", 1},
		{IPPROTO_IP, IP_TOS, "IP_TOS", 0x10},
		{IPPROTO_IP, IP_TTL, "IP_TTL", 33},
		{IPPROTO_TCP, TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT", 5000},
		{IPPROTO_TCP, TCP_QUICKACK, "TCP_QUICKACK", 1},
		{IPPROTO_TCP, TCP_QUICKACK, "TCP_QUICKACK", 0},
	};
	/* After the echoes before, which answer what they read: 0 on the
	 * kernel, the ACK mode of a connection that answers (ping-pong);
	 * an unconnected socket reads 1. */
	getint(s, IPPROTO_TCP, TCP_QUICKACK, "TCP_QUICKACK");
	for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++)
		setint(s, sets[k].level, sets[k].opt, sets[k].name, sets[k].v);
	getint(s, IPPROTO_TCP, TCP_MAXSEG, "TCP_MAXSEG");
	getint(s, SOL_SOCKET, SO_TYPE, "SO_TYPE");
	getint(s, SOL_SOCKET, SO_ERROR, "SO_ERROR");
	getint(s, SOL_SOCKET, SO_ACCEPTCONN, "SO_ACCEPTCONN");
	struct linger lg = {1, 5}, lg2 = {0, 0};
	socklen_t l = sizeof lg2;
	check("set SO_LINGER", setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	getsockopt(s, SOL_SOCKET, SO_LINGER, &lg2, &l);
	say("get SO_LINGER: %d %d (%u bytes)", lg2.l_onoff, lg2.l_linger, (unsigned)l);
	lg.l_onoff = 0;
	setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	check("set SO_LINGER, short", setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, 4));
	struct tcp_info ti;
	l = sizeof ti;
	memset(&ti, 0, sizeof ti);
	check("get TCP_INFO", getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &l));
	say("TCP_INFO: state %d, whole %d", ti.tcpi_state, l == sizeof ti);
	int v = 1;
	check("set an unknown option", setsockopt(s, SOL_SOCKET, 9999, &v, sizeof v));
	check("get an unknown option", getsockopt(s, SOL_SOCKET, 9999, &v, &l));
	check("set with a short length", setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, 2));
	struct timeval tv = {2, 500000}, tv2 = {0, 0};
	check("set SO_RCVTIMEO", setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	l = sizeof tv2;
	getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv2, &l);
	say("get SO_RCVTIMEO: %ld.%06ld (%u bytes)", (long)tv2.tv_sec, (long)tv2.tv_usec, (unsigned)l);
	check("set SO_RCVTIMEO, short", setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, 4));
	tv.tv_sec = tv.tv_usec = 0;
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	l = 0;
	check("get with no room", getsockopt(s, IPPROTO_TCP, TCP_NODELAY, &v, &l));
	say("its length: %u", (unsigned)l);
	echo(s, "after the options", "opts");
}

/* unread waits (up to 2 s) for at least n bytes to be queued on s,
 * unread: FIONREAD. */
static int unread(int s, int n)
{
	int q = 0;
	for (int i = 0; i < 2000 && (ioctl(s, FIONREAD, &q) < 0 || q < n); i++)
		usleep(1000);
	return q;
}

static void *send_12_later(void *arg)
{
	usleep(50000);
	send(*(int *)arg, "efghijklmnop", 12, 0);
	return NULL;
}

/* SO_RCVLOWAT: readable with the mark's bytes queued, not with fewer; a
 * blocking read waits for the mark (and returns what it has then), a
 * non-blocking one takes what there is. TCP_NOTSENT_LOWAT: writable
 * while less than half the mark is unsent (here held by TCP_CORK), and
 * a send fills the last segment's room past the mark. */
static void test_lowat(void)
{
	int s = dial(), lw = 10;
	setint(s, SOL_SOCKET, SO_RCVLOWAT, "SO_RCVLOWAT", lw);
	send(s, "abcd", 4, 0);
	say("lowat: 4 queued: %d", unread(s, 4));
	struct pollfd p = {.fd = s, .events = POLLIN};
	check("lowat: poll, 4 of 10", poll(&p, 1, 50));
	int ep = epoll_create1(0), et = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = s}, got;
	epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	ev.events = EPOLLIN | EPOLLET;
	epoll_ctl(et, EPOLL_CTL_ADD, s, &ev);
	check("lowat: epoll_wait, 4 of 10", epoll_wait(ep, &got, 1, 50));
	check("lowat: epoll_wait EPOLLET, 4 of 10", epoll_wait(et, &got, 1, 50));
	send(s, "efghijkl", 8, 0);
	say("lowat: 12 queued: %d", unread(s, 12));
	p.revents = 0;
	check("lowat: poll, 12 of 10", poll(&p, 1, 1000));
	say("lowat: its events: %#x", p.revents);
	check("lowat: epoll_wait, 12 of 10", epoll_wait(ep, &got, 1, 1000));
	check("lowat: epoll_wait EPOLLET, 12 of 10", epoll_wait(et, &got, 1, 1000));
	check("lowat: epoll_wait EPOLLET again", epoll_wait(et, &got, 1, 50));
	close(et);
	char buf[64];
	check("lowat: recv", recv(s, buf, sizeof buf, 0));
	send(s, "abcd", 4, 0);
	unread(s, 4);
	check("lowat: recv MSG_DONTWAIT, 4 of 10", recv(s, buf, sizeof buf, MSG_DONTWAIT));
	/* A blocking read takes the 4 there, and waits for the mark. */
	send(s, "abcd", 4, 0);
	unread(s, 4);
	pthread_t t;
	pthread_create(&t, NULL, send_12_later, &s);
	ssize_t r = recv(s, buf, sizeof buf, 0);
	pthread_join(t, NULL);
	say("lowat: blocking recv: %zd %.16s", r, r == 16 ? buf : "");
	/* readv: the mark counts over all the vectors. */
	send(s, "abcd", 4, 0);
	unread(s, 4);
	pthread_create(&t, NULL, send_12_later, &s);
	char v1[3], v2[64];
	struct iovec iv[2] = {{v1, sizeof v1}, {v2, sizeof v2}};
	r = readv(s, iv, 2);
	pthread_join(t, NULL);
	say("lowat: blocking readv: %zd %.3s %.13s", r, v1, r == 16 ? v2 : "");
	/* A peek into two vectors sees the stream once. */
	send(s, "abcdefgh", 8, 0);
	unread(s, 8);
	char p1[2], p2[10];
	struct iovec pv[2] = {{p1, sizeof p1}, {p2, sizeof p2}};
	struct msghdr pm = {.msg_iov = pv, .msg_iovlen = 2};
	r = recvmsg(s, &pm, MSG_PEEK | MSG_DONTWAIT);
	say("peek into two vectors: %zd %.2s %.6s", r, p1, r == 8 ? p2 : "");
	check("then a read", recv(s, buf, sizeof buf, MSG_DONTWAIT));
	send(s, "abcd", 4, 0);
	unread(s, 4);
	check("lowat: blocking recv of 3, 4 of 10", recv(s, buf, 3, 0));
	check("lowat: the one left", recv(s, buf, sizeof buf, MSG_DONTWAIT));
	close(ep);

	int one = 1, zero = 0;
	setint(s, IPPROTO_TCP, TCP_NOTSENT_LOWAT, "TCP_NOTSENT_LOWAT", 100);
	setsockopt(s, IPPROTO_TCP, TCP_CORK, &one, sizeof one);
	struct pollfd o = {.fd = s, .events = POLLOUT};
	check("notsent: poll, none unsent", poll(&o, 1, 0));
	static const char sixty[61] = "0123456789012345678901234567890123456789012345678901234567890";
	check("notsent: send 60, corked", send(s, sixty, 60, MSG_DONTWAIT));
	o.revents = 0;
	check("notsent: poll, 60 unsent", poll(&o, 1, 0));
	check("notsent: send 30 more", send(s, sixty, 30, MSG_DONTWAIT));
	setsockopt(s, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero);
	char back[90];
	say("notsent: uncorked, back: %zd", read_full(s, back, 90));
	o.revents = 0;
	check("notsent: poll, all sent", poll(&o, 1, 1000));
	close(s);
}

static void test_vfork(int s)
{
	pid_t p = vfork();
	if (p == 0) {
		execl("/bin/true", "true", (char *)NULL);
		_exit(127);
	}
	int st = 0;
	waitpid(p, &st, 0);
	say("vfork and exec: exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	echo(s, "after vfork", "vf");
}

/* The exec test hands a connection to a program of its own (this one,
 * as "calls child FD"), as inetd hands one to a server, and closes its
 * own copy: the child echoes on it and exits. */
static void test_exec(const char *self)
{
	int s = dial();
	echo(s, "before exec", "ex");
	pid_t p = fork();
	if (p == 0) {
		char fd[16];
		snprintf(fd, sizeof fd, "%d", s);
		execl(self, self, "child", fd, (char *)NULL);
		_exit(127);
	}
	close(s);
	int st = 0;
	waitpid(p, &st, 0);
	say("exec'd child: exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* The spawn test hands connections on as the exec test does, but by
 * posix_spawn, whose child execs inside libc, by a posix_spawn file
 * action that dup2s a close-on-exec connection to another number, and
 * by system(), which runs the child through the shell. */
static void test_spawn(const char *self)
{
	static const char *const how[] = {"posix_spawn", "posix_spawn dup2", "system"};
	for (int i = 0; i < 3; i++) {
		int s = socket(AF_INET, SOCK_STREAM | (i == 1 ? SOCK_CLOEXEC : 0), 0);
		if (s < 0 || connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
			die("spawn: connect");
		echo(s, how[i], "sp");
		char fd[16], cmd[4096];
		snprintf(fd, sizeof fd, "%d", i == 1 ? 40 : s);
		char *argv[] = {(char *)self, "child", fd, (char *)how[i], NULL};
		int r = 0, st = 0;
		pid_t p = -1;
		if (i == 2) {
			snprintf(cmd, sizeof cmd, "'%s' child %s system", self, fd);
			st = system(cmd);
		} else {
			posix_spawn_file_actions_t fa;
			posix_spawn_file_actions_init(&fa);
			if (i == 1)
				posix_spawn_file_actions_adddup2(&fa, s, 40);
			r = posix_spawn(&p, self, &fa, NULL, argv, environ);
			posix_spawn_file_actions_destroy(&fa);
		}
		close(s);
		if (r == 0 && p > 0)
			waitpid(p, &st, 0);
		say("%s: %d, exited %d", how[i], r, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	}
}

static int child(int s, const char *who)
{
	char what[64], at[96];
	snprintf(what, sizeof what, "%s child", who);
	echo(s, what, "inherited");
	snprintf(at, sizeof at, "%s: shutdown", what);
	check(at, shutdown(s, SHUT_WR));
	char c;
	snprintf(at, sizeof at, "%s: recv at the end", what);
	check(at, recv(s, &c, 1, 0));
	return 0;
}

/* daemon() before the program's sockets, as a server that detaches
 * first: the grandchild makes its connection and says what it got
 * through a pipe. */
static void test_daemon(void)
{
	int pp[2];
	if (pipe(pp) < 0)
		die("pipe");
	pid_t p = fork();
	if (p == 0) {
		close(pp[0]);
		if (daemon(1, 1) < 0)
			_exit(1);
		int s = dial();
		char buf[8];
		send(s, "daemon", 6, 0);
		ssize_t r = read_full(s, buf, 6);
		dprintf(pp[1], "%zd %.6s\n", r, r == 6 ? buf : "");
		close(s);
		_exit(0);
	}
	close(pp[1]);
	int st = 0;
	waitpid(p, &st, 0);
	char line[64] = {0};
	struct pollfd q = {.fd = pp[0], .events = POLLIN};
	if (poll(&q, 1, 10000) == 1 && read(pp[0], line, sizeof line - 1) > 0)
		say("after daemon(): %s", strtok(line, "\n"));
	else
		say("after daemon(): nothing in 10 s");
	close(pp[0]);
}

int main(int argc, char **argv)
{
	if ((argc == 3 || argc == 4) && strcmp(argv[1], "child") == 0)
		return child(atoi(argv[2]), argc == 4 ? argv[3] : "exec'd");
	if (argc != 3) {
		fprintf(stderr, "usage: calls ADDR PORT\n");
		return 2;
	}
	if (set_peer("calls", argv[1], argv[2]))
		return 2;
	signal(SIGPIPE, SIG_IGN);
	alarm(60); /* a hang fails the run rather than the test's timeout */
	int s = dial();
	echo(s, "first socket", "hello");
	test_vectors(s);
	test_mmsg(s);
	test_mmsg_eof();
	test_flags(s);
	test_shut_rd();
	test_splice(s);
	test_bind_connect();
	test_async();
	test_zerocopy();
	test_outq();
	test_pass();
	test_sendfile(s);
	test_masks(s);
	test_epoll_create(s);
	test_dup3(s);
	test_options(s);
	test_lowat();
	test_vfork(s);
	test_exec(argv[0]);
	test_spawn(argv[0]);
	test_daemon();
	echo(s, "at the end", "bye");
	say("done");
	return 0;
}
