/*
 * reuseport: a server with a listener a thread, as servers that scale
 * by threads make them: NTHREADS sockets bound to PORT with
 * SO_REUSEPORT, each accepting on a thread of its own (poll, then a
 * non-blocking accept), each connection answered with the number of the
 * listener that took it. It prints "listening", and after WANT
 * connections (or 10 s without one) how many each listener took, as
 * "listener N: took some" or "listener N: took none". The kernel spreads
 * a group's connections by their addresses; under the shim the first
 * listener took the port and the others listened in the kernel, where
 * no connection came: every connection went to the first thread.
 *
 * usage: reuseport PORT NTHREADS WANT
 */
#define _GNU_SOURCE
#include "conform.h"
#include <pthread.h>

#define MAXT 8
static int lfd[MAXT], took[MAXT], want, total;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void *serve(void *arg)
{
	int i = (int)(long)arg, idle = 0;
	for (;;) {
		pthread_mutex_lock(&mu);
		int done = total >= want;
		pthread_mutex_unlock(&mu);
		if (done || idle >= 50)
			return NULL; /* all came, or nothing for 10 s */
		struct pollfd p = {.fd = lfd[i], .events = POLLIN};
		int r = poll(&p, 1, 200);
		if (r < 0)
			die("poll");
		if (r == 0) {
			idle++;
			continue;
		}
		idle = 0;
		int c = accept4(lfd[i], NULL, NULL, SOCK_NONBLOCK);
		if (c < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				continue; /* another listener's thread took it */
			die("accept4");
		}
		int fl = 0;
		ioctl(c, FIONBIO, &fl);
		char buf[16];
		if (read_full(c, buf, 1) != 1)
			die("read");
		char n = '0' + i;
		if (send(c, &n, 1, MSG_NOSIGNAL) != 1)
			die("send");
		close(c);
		pthread_mutex_lock(&mu);
		took[i]++;
		total++;
		pthread_mutex_unlock(&mu);
	}
}

int main(int argc, char **argv)
{
	if (argc != 4 || atoi(argv[2]) < 1 || atoi(argv[2]) > MAXT) {
		fprintf(stderr, "usage: %s PORT NTHREADS(1-%d) WANT\n", argv[0], MAXT);
		return 2;
	}
	int n = atoi(argv[2]);
	want = atoi(argv[3]);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	for (int i = 0; i < n; i++) {
		int one = 1;
		lfd[i] = socket(AF_INET, SOCK_STREAM, 0);
		if (lfd[i] < 0 || setsockopt(lfd[i], SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) < 0 ||
		    bind(lfd[i], (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd[i], 128) < 0)
			die("listener");
		if (ioctl(lfd[i], FIONBIO, &one) < 0)
			die("FIONBIO");
	}
	pthread_t t[MAXT];
	for (int i = 0; i < n; i++)
		pthread_create(&t[i], NULL, serve, (void *)(long)i);
	say("listening");
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	say("connections: %d", total);
	for (int i = 0; i < n; i++)
		say("listener %d: took %s", i, took[i] ? "some" : "none");
	return 0;
}
