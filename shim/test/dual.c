/*
 * dual: IPv6 sockets that reach IPv4, run under the shim and without it,
 * whose outputs must be the same. Each line names a call and what it
 * gave: families, IPv4-mapped addresses, ports where the test fixes
 * them, errno names.
 *
 *   dual serve PORT PEER   listens on [::]:PORT (dual-stack) and on
 *                          [::]:PORT+1 with IPV6_V6ONLY, says
 *                          "listening", accepts one connection on the
 *                          first from PEER (an IPv4 address), names it,
 *                          echoes it to its end, and connects to
 *                          [::1]:PORT, which the listener's kernel half
 *                          accepts
 *   dual connect ADDR PORT connects an IPv6 socket to ::ffff:ADDR:PORT,
 *                          names it, sends a line and reads its echo;
 *                          then tries ADDR:PORT+1 (refused: IPv6 only),
 *                          from a socket bound to [::1], and with an
 *                          IPv4 sockaddr on an IPv6 socket
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *ename(int e)
{
	switch (e) {
	case 0: return "ok";
	case ECONNREFUSED: return "ECONNREFUSED";
	case EAFNOSUPPORT: return "EAFNOSUPPORT";
	case EINVAL: return "EINVAL";
	case ENETUNREACH: return "ENETUNREACH";
	case ENOTCONN: return "ENOTCONN";
	}
	return strerror(e);
}

/* show prints a name: its family and length, its address, and its port
 * if showport. */
static void show(const char *what, const struct sockaddr_storage *ss, socklen_t l, int showport)
{
	char buf[INET6_ADDRSTRLEN] = "?";
	int port = 0;
	if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
		inet_ntop(AF_INET6, &s6->sin6_addr, buf, sizeof buf);
		port = ntohs(s6->sin6_port);
	} else if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
		inet_ntop(AF_INET, &s4->sin_addr, buf, sizeof buf);
		port = ntohs(s4->sin_port);
	}
	printf("%s: family %s len %u addr %s", what, ss->ss_family == AF_INET6 ? "inet6" : ss->ss_family == AF_INET ? "inet" : "other",
	       (unsigned)l, buf);
	if (showport)
		printf(" port %d", port);
	printf("\n");
}

static void names(const char *who, int fd, int localport, int peerport)
{
	struct sockaddr_storage ss;
	socklen_t l = sizeof ss;
	char what[64];
	memset(&ss, 0, sizeof ss);
	snprintf(what, sizeof what, "%s getsockname", who);
	if (getsockname(fd, (struct sockaddr *)&ss, &l) == 0)
		show(what, &ss, l, localport);
	else
		printf("%s: %s\n", what, ename(errno));
	memset(&ss, 0, sizeof ss);
	l = sizeof ss;
	snprintf(what, sizeof what, "%s getpeername", who);
	if (getpeername(fd, (struct sockaddr *)&ss, &l) == 0)
		show(what, &ss, l, peerport);
	else
		printf("%s: %s\n", what, ename(errno));
	/* A short buffer: truncated, the length the whole name's. */
	struct sockaddr_in6 small;
	l = 8;
	memset(&small, 0, sizeof small);
	snprintf(what, sizeof what, "%s getsockname(8 bytes)", who);
	if (getsockname(fd, (struct sockaddr *)&small, &l) == 0)
		printf("%s: len %u family %s\n", what, (unsigned)l, small.sin6_family == AF_INET6 ? "inet6" : "other");
	int dom = 0;
	l = sizeof dom;
	getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &l);
	printf("%s SO_DOMAIN: %s\n", who, dom == AF_INET6 ? "inet6" : "inet");
}

static int listener6(int port, int v6only)
{
	int s = socket(AF_INET6, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = IN6ADDR_ANY_INIT};
	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 8) < 0) {
		perror("listen");
		exit(1);
	}
	return s;
}

static int echo(int c)
{
	char buf[4096];
	long total = 0;
	for (;;) {
		ssize_t n = read(c, buf, sizeof buf);
		if (n <= 0)
			return n < 0 ? -1 : (int)total;
		if (write(c, buf, n) != n)
			return -1;
		total += n;
	}
}

static int serve(int port, const char *peer)
{
	int ls = listener6(port, 0), only = listener6(port + 1, 1);
	names("listener", ls, 1, 0);
	/* The shim takes a listener at its first accept or wait: this one
	 * first, so that the client comes through the stack. */
	struct pollfd pf = {.fd = ls, .events = POLLIN};
	printf("poll before the client: %d\n", poll(&pf, 1, 0));
	printf("listening\n");
	fflush(stdout);
	struct sockaddr_storage ss;
	socklen_t l = sizeof ss;
	int c = accept(ls, (struct sockaddr *)&ss, &l);
	if (c < 0) {
		perror("accept");
		return 1;
	}
	show("accept", &ss, l, 0);
	char want[INET6_ADDRSTRLEN + 8];
	snprintf(want, sizeof want, "::ffff:%s", peer);
	char got[INET6_ADDRSTRLEN] = "";
	if (ss.ss_family == AF_INET6)
		inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, got, sizeof got);
	printf("accept from the peer: %s\n", strcmp(got, want) == 0 ? "yes" : "no");
	names("accepted", c, 1, 0);
	printf("echoed %d\n", echo(c));
	close(c);
	/* Through loopback, IPv6: the listener's kernel half. */
	int k = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	printf("connect [::1]: %s\n", connect(k, (struct sockaddr *)&lo, sizeof lo) == 0 ? "ok" : ename(errno));
	l = sizeof ss;
	int c2 = accept(ls, (struct sockaddr *)&ss, &l);
	if (c2 < 0) {
		printf("accept [::1]: %s\n", ename(errno));
		return 1;
	}
	show("accept [::1]", &ss, l, 0);
	printf("write [::1]: %zd\n", write(k, "ping\n", 5));
	char b[8];
	printf("read [::1]: %zd\n", read(c2, b, sizeof b));
	close(c2);
	close(k);
	close(only);
	close(ls);
	return 0;
}

static int connect6(const char *addr, int port)
{
	int s = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
	char mapped[64];
	snprintf(mapped, sizeof mapped, "::ffff:%s", addr);
	inet_pton(AF_INET6, mapped, &a.sin6_addr);
	names("unconnected", s, 0, 0);
	if (connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		printf("connect: %s\n", ename(errno));
		return 1;
	}
	printf("connect: ok\n");
	names("connected", s, 0, 1);
	const char msg[] = "over an IPv6 socket to IPv4\n";
	char got[sizeof msg] = "";
	ssize_t w = write(s, msg, sizeof msg - 1), r = 0;
	while (r < (ssize_t)sizeof msg - 1) {
		ssize_t n = read(s, got + r, sizeof msg - 1 - r);
		if (n <= 0)
			break;
		r += n;
	}
	printf("write %zd read %zd same %s\n", w, r, memcmp(got, msg, sizeof msg - 1) == 0 ? "yes" : "no");
	shutdown(s, SHUT_WR);
	printf("read at the end: %zd\n", read(s, got, sizeof got));
	close(s);

	/* IPv6 only: no IPv4. */
	int o = socket(AF_INET6, SOCK_STREAM, 0), one = 1;
	setsockopt(o, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
	printf("connect IPV6_V6ONLY to ::ffff:: %s\n", connect(o, (struct sockaddr *)&a, sizeof a) == 0 ? "ok" : ename(errno));
	close(o);
	/* The dual-stack listener on the port after: IPv6 only. */
	int p = socket(AF_INET6, SOCK_STREAM, 0);
	a.sin6_port = htons(port + 1);
	printf("connect to the IPv6-only listener: %s\n", connect(p, (struct sockaddr *)&a, sizeof a) == 0 ? "ok" : ename(errno));
	close(p);
	/* Bound to an IPv6 address: no IPv4 from there. */
	int b6 = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in6 lo = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
	a.sin6_port = htons(port);
	printf("bind [::1]: %s\n", bind(b6, (struct sockaddr *)&lo, sizeof lo) == 0 ? "ok" : ename(errno));
	printf("connect from [::1] to ::ffff:: %s\n", connect(b6, (struct sockaddr *)&a, sizeof a) == 0 ? "ok" : ename(errno));
	close(b6);
	/* An IPv4 sockaddr on an IPv6 socket. */
	int q = socket(AF_INET6, SOCK_STREAM, 0);
	struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, addr, &a4.sin_addr);
	printf("connect with an IPv4 sockaddr: %s\n", connect(q, (struct sockaddr *)&a4, sizeof a4) == 0 ? "ok" : ename(errno));
	close(q);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 4 && strcmp(argv[1], "serve") == 0)
		return serve(atoi(argv[2]), argv[3]);
	if (argc == 4 && strcmp(argv[1], "connect") == 0)
		return connect6(argv[2], atoi(argv[3]));
	fprintf(stderr, "usage: dual serve PORT PEER | dual connect ADDR PORT\n");
	return 2;
}
