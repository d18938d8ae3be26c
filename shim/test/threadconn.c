/*
 * threadconn: a thread a connection, as a client's pool of connections
 * (or a thread-a-connection server's workers) uses them: THREADS threads,
 * each with a connection of its own to the echo server at ADDR:PORT,
 * each sending ROUNDS messages of 1 to 3,000 bytes and reading each
 * echo back with blocking reads (with "poll", a poll of the one
 * connection before each read, as varnish's and MariaDB's threads wait),
 * checking every byte (TestShimThreadAConnection). Under the shim, once
 * ONLOAD_BLOCKED_THREADS of its threads are blocked at once, each
 * connection goes to the kernel in the middle of its traffic, handed
 * over by its thread as it next waits on it; every echo must still come
 * back whole and in order.
 *
 * It prints, the same on the kernel and under the shim:
 *	"THREADS threads: every message echoed" or what went wrong first.
 *
 *	threadconn ADDR PORT THREADS ROUNDS [poll]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include "conform.h"

#define MAXT 64
#define MAXMSG 3000

static int nthreads, rounds, use_poll;
static int failed;
static char first_fail[256];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void fail(int i, int round, const char *what, int err)
{
	pthread_mutex_lock(&mu);
	if (!failed++)
		snprintf(first_fail, sizeof first_fail, "thread %d, message %d: %s%s%s", i, round, what, err ? ": " : "",
			 err ? strerror(err) : "");
	pthread_mutex_unlock(&mu);
}

/* wait_readable polls s alone until it is readable (10 s at most). */
static int wait_readable(int s)
{
	struct pollfd p = {.fd = s, .events = POLLIN};
	for (;;) {
		int r = poll(&p, 1, 10000);
		if (r < 0 && errno == EINTR)
			continue;
		return r > 0 ? 0 : -1;
	}
}

static void *run(void *arg)
{
	int i = (int)(long)arg, s = dial(); /* or the program ends, saying why */
	struct timeval tv = {.tv_sec = 10};
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char out[MAXMSG], in[MAXMSG];
	unsigned seed = 7919u * (unsigned)(i + 1);
	for (int r = 0; r < rounds; r++) {
		size_t n = 1 + rand_r(&seed) % MAXMSG;
		for (size_t k = 0; k < n; k++)
			out[k] = (char)(i * 31 + r * 7 + k);
		if (send(s, out, n, MSG_NOSIGNAL) != (ssize_t)n) {
			fail(i, r, "send", errno);
			break;
		}
		size_t got = 0;
		while (got < n) {
			if (use_poll && wait_readable(s) < 0) {
				fail(i, r, "poll: the echo did not come", errno);
				goto out;
			}
			ssize_t m = read(s, in + got, n - got);
			if (m < 0 && errno == EINTR)
				continue;
			if (m <= 0) {
				fail(i, r, m == 0 ? "read: the connection ended" : "read", m == 0 ? 0 : errno);
				goto out;
			}
			got += m;
		}
		if (memcmp(in, out, n) != 0) {
			fail(i, r, "the echo differs from what was sent", 0);
			break;
		}
	}
out:
	close(s);
	return NULL;
}

int main(int argc, char **argv)
{
	use_poll = argc == 6 && !strcmp(argv[5], "poll");
	int r = peer_args_more(argc - use_poll, argv, 2, "THREADS ROUNDS [poll]");
	if (r)
		return r;
	nthreads = atoi(argv[3]);
	rounds = atoi(argv[4]);
	if (nthreads < 1 || nthreads > MAXT || rounds < 1) {
		fprintf(stderr, "threadconn: THREADS is 1 to %d, ROUNDS at least 1\n", MAXT);
		return 2;
	}
	pthread_t t[MAXT];
	for (int i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, run, (void *)(long)i);
	for (int i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	if (failed)
		say("%d threads: %d failed, the first %s", nthreads, failed, first_fail);
	else
		say("%d threads: every message echoed", nthreads);
	return 0;
}
