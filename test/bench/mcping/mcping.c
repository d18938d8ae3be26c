/*
 * mcping: a memcached ping-pong load for make bench's shim section.
 *
 *   mcping ADDR PORT CONNS SECONDS
 *
 * Each of CONNS connections (one thread each) stores a key of its own,
 * then sends "get" and reads the whole reply, one request at a time, for
 * SECONDS. It prints one line:
 *
 *   gets N seconds S p50_us X p99_us Y
 *
 * where the percentiles are over every request of every connection (at
 * most 1,000,000 a connection are kept). Unlike memcslap it spends almost
 * nothing of its own a request, so the server's cost shows, and it keeps
 * each connection's requests strictly one at a time, as a latency-bound
 * client does.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 256
#define MAX_SAMPLES 1000000

struct conn {
	pthread_t t;
	int id;
	long gets;
	float *lat_us;
	long n;
	const char *err;
	int errnum;
};

static struct sockaddr_in dst;
static double deadline;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int write_all(int fd, const char *b, size_t n)
{
	while (n > 0) {
		ssize_t r = write(fd, b, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

/* read_reply reads until the reply ends with end (a whole reply: the
 * requests go one at a time), and ends buf with a NUL. */
static int read_reply(int fd, char *buf, size_t cap, const char *end)
{
	size_t got = 0, el = strlen(end);
	for (;;) {
		ssize_t r = read(fd, buf + got, cap - 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = ECONNRESET;
			return -1;
		}
		got += (size_t)r;
		buf[got] = 0;
		if (got >= el && memcmp(buf + got - el, end, el) == 0)
			return 0;
		if (got == cap - 1) {
			errno = EMSGSIZE;
			return -1;
		}
	}
}

static void *run(void *arg)
{
	struct conn *c = arg;
	char buf[4096], req[64];
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&dst, sizeof dst) < 0) {
		c->err = "connect"; c->errnum = errno;
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	int n = snprintf(req, sizeof req, "set mcping%d 0 0 5\r\nhello\r\n", c->id);
	if (write_all(fd, req, (size_t)n) < 0 || read_reply(fd, buf, sizeof buf, "STORED\r\n") < 0) {
		c->err = "set"; c->errnum = errno;
		close(fd);
		return NULL;
	}
	n = snprintf(req, sizeof req, "get mcping%d\r\n", c->id);
	for (;;) {
		double t0 = now();
		if (t0 >= deadline)
			break;
		if (write_all(fd, req, (size_t)n) < 0 || read_reply(fd, buf, sizeof buf, "END\r\n") < 0) {
			c->err = "get"; c->errnum = errno;
			break;
		}
		if (!strstr(buf, "hello")) {
			c->err = "get: wrong value";
			c->errnum = EPROTO;
			break;
		}
		if (c->n < MAX_SAMPLES)
			c->lat_us[c->n++] = (float)((now() - t0) * 1e6);
		c->gets++;
	}
	close(fd);
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: mcping ADDR PORT CONNS SECONDS\n");
		return 2;
	}
	int port = atoi(argv[2]), conns = atoi(argv[3]), secs = atoi(argv[4]);
	dst.sin_family = AF_INET;
	dst.sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1 || port <= 0 || port > 65535) {
		fprintf(stderr, "mcping: %s:%s is not an IPv4 address and port\n", argv[1], argv[2]);
		return 2;
	}
	if (conns < 1 || conns > MAX_CONNS || secs < 1 || secs > 600) {
		fprintf(stderr, "mcping: CONNS must be 1-%d and SECONDS 1-600\n", MAX_CONNS);
		return 2;
	}
	static struct conn cs[MAX_CONNS];
	deadline = now() + secs;
	for (int i = 0; i < conns; i++) {
		cs[i].id = i;
		cs[i].lat_us = malloc(sizeof(float) * MAX_SAMPLES);
		if (!cs[i].lat_us || pthread_create(&cs[i].t, NULL, run, &cs[i]) != 0) {
			fprintf(stderr, "mcping: cannot start connection %d\n", i);
			return 1;
		}
	}
	long gets = 0, total = 0;
	for (int i = 0; i < conns; i++) {
		pthread_join(cs[i].t, NULL);
		if (cs[i].err) {
			fprintf(stderr, "mcping: connection %d: %s failed: %s\n", i, cs[i].err, strerror(cs[i].errnum));
			return 1;
		}
		gets += cs[i].gets;
		total += cs[i].n;
	}
	if (total == 0) {
		fprintf(stderr, "mcping: no request completed\n");
		return 1;
	}
	float *all = malloc(sizeof(float) * (size_t)total);
	if (!all) {
		fprintf(stderr, "mcping: out of memory\n");
		return 1;
	}
	long k = 0;
	for (int i = 0; i < conns; i++) {
		memcpy(all + k, cs[i].lat_us, sizeof(float) * (size_t)cs[i].n);
		k += cs[i].n;
	}
	qsort(all, (size_t)total, sizeof(float), cmp);
	printf("gets %ld seconds %d p50_us %.1f p99_us %.1f\n", gets, secs, all[total / 2], all[total * 99 / 100]);
	return 0;
}
