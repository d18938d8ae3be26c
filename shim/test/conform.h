/*
 * conform.h: what the conformance programs (mixed.c, calls.c, accepts.c)
 * share. Each prints one line per result, so that its output under the
 * shim must be the same as without it; mixed.c and calls.c talk to a TCP
 * echo server at peer.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static struct sockaddr_in peer;

/* set_peer makes ADDR and PORT, a program's arguments, the peer's
 * address: 0, or 2 (the exit status of a usage error) with why on
 * standard error. */
static inline int set_peer(const char *prog, const char *addr, const char *port)
{
	peer.sin_family = AF_INET;
	peer.sin_port = htons(atoi(port));
	if (inet_pton(AF_INET, addr, &peer.sin_addr) != 1) {
		fprintf(stderr, "%s: bad address %s\n", prog, addr);
		return 2;
	}
	return 0;
}

/* peer_args_more takes a program's arguments, ADDR PORT and more
 * others (named in usage), the first two as the peer's address: 0, or 2
 * (the exit status of a usage error) with why on standard error. */
static inline int peer_args_more(int argc, char **argv, int more, const char *usage)
{
	if (argc != 3 + more) {
		fprintf(stderr, "usage: %s ADDR PORT%s%s\n", argv[0], *usage ? " " : "", usage);
		return 2;
	}
	return set_peer(argv[0], argv[1], argv[2]);
}

/* peer_args takes a program's arguments, ADDR PORT, as the peer's
 * address. */
static inline int peer_args(int argc, char **argv) { return peer_args_more(argc, argv, 0, ""); }

#define say(...) do { printf(__VA_ARGS__); printf("\n"); fflush(stdout); } while (0)
#define check(what, expr) do { long r_ = (long)(expr); say("%s: %ld%s%s", what, r_, r_ < 0 ? " " : "", r_ < 0 ? strerror(errno) : ""); } while (0)

static inline void die(const char *what)
{
	printf("FATAL %s: %s\n", what, strerror(errno));
	exit(1);
}

/* listen_on makes s, a TCP socket, listen on port (any address) with
 * SO_REUSEADDR, or dies. */
static inline void listen_on(int s, int port)
{
	int one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 8) < 0)
		die("listen");
}

static inline int dial(void)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		die("socket");
	if (connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	int one = 1;
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	return s;
}

/* name_conn names connection s to the name server (the tests'
 * nameServer) as TAG.pid. */
static inline void name_conn(int s, const char *tag)
{
	char name[32];
	int n = snprintf(name, sizeof name, "%s.%d\n", tag, (int)getpid());
	if (send(s, name, n, 0) != n)
		die("send");
}

/* ask asks the name server on s whether it read the end of the
 * connection named TAG, and prints its answer ("server: TAG eof", or
 * "open" after 5 s). */
static inline void ask(int s, const char *tag)
{
	char q[32], line[64];
	int n = snprintf(q, sizeof q, "?%s.%d\n", tag, (int)getpid());
	if (send(s, q, n, 0) != n)
		die("send");
	size_t got = 0;
	while (got < sizeof line - 1) {
		ssize_t r = recv(s, line + got, 1, 0);
		if (r <= 0)
			die("recv");
		if (line[got++] == '\n')
			break;
	}
	say("server: %s %.*s", tag, (int)got - 1, line);
}

/* ask_end is ask on a connection of its own. */
static inline void ask_end(const char *tag)
{
	int q = dial();
	ask(q, tag);
	close(q);
}

/* read_full reads n bytes from s, blocking: n, or what the recv that
 * stopped it returned (0 or -1). */
static inline ssize_t read_full(int s, char *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = recv(s, buf + got, n - got, 0);
		if (r <= 0)
			return r;
		got += r;
	}
	return got;
}

/* echo sends msg and reads its echo back, blocking. */
static inline void echo(int s, const char *what, const char *msg)
{
	char buf[256];
	size_t n = strlen(msg);
	if (n > sizeof buf)
		die("echo: message too long");
	if (send(s, msg, n, 0) != (ssize_t)n)
		die("send");
	if (read_full(s, buf, n) != (ssize_t)n)
		die("recv");
	say("%s: echo %.*s", what, (int)n, buf);
}

/* send_fd sends fd over Unix socket us (SCM_RIGHTS), with one byte:
 * sendmsg's result. */
static inline ssize_t send_fd(int us, int fd)
{
	char c = 'x';
	struct iovec iov = {&c, 1};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	memset(&ctl, 0, sizeof ctl);
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof fd);
	return sendmsg(us, &m, 0);
}

/* recv_fd receives what send_fd sent on Unix socket us, the fd into *fd
 * (-1 if none came): recvmsg's result. */
static inline ssize_t recv_fd(int us, int *fd)
{
	char c;
	struct iovec iov = {&c, 1};
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;
	memset(&ctl, 0, sizeof ctl);
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
	ssize_t r = recvmsg(us, &m, 0);
	struct cmsghdr *cm = r > 0 ? CMSG_FIRSTHDR(&m) : NULL;
	*fd = -1;
	if (cm && cm->cmsg_type == SCM_RIGHTS)
		memcpy(fd, CMSG_DATA(cm), sizeof *fd);
	return r;
}

/* getint prints socket option opt of s (an int), by name. */
static inline void getint(int s, int level, int opt, const char *name)
{
	int v = -1;
	socklen_t l = sizeof v;
	if (getsockopt(s, level, opt, &v, &l) < 0)
		say("get %s: %s", name, strerror(errno));
	else
		say("get %s: %d (%u bytes)", name, v, (unsigned)l);
}

/* await waits (up to 5 s) until n bytes can be read from s at once, so
 * that a call that reads them does not depend on how they arrived. */
static inline void await(int s, int n)
{
	for (int i = 0; i < 500; i++) {
		int avail = 0;
		if (ioctl(s, FIONREAD, &avail) < 0)
			die("FIONREAD");
		if (avail >= n)
			return;
		struct pollfd p = {.fd = s, .events = POLLIN};
		poll(&p, 1, 10);
		if (avail > 0)
			usleep(1000); /* some came: poll returns at once */
	}
	die("await: the echo did not come");
}
