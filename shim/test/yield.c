/*
 * yield: does a spinning thread give its processor to another thread
 * that wants it? (TestShimSpinYields)
 *
 *   yield ADDR PORT
 *
 * The process pins itself to one processor. Two threads each connect to
 * ADDR:PORT (a server that sends nothing) and block in recv, so that
 * under the shim with a long spin (ONLOAD_SPIN_US) one of them spins and
 * the other sleeps; the program has two threads waiting on the stack.
 * The main thread, on the same processor, then counts for 500 ms and
 * prints the share of that time it ran:
 *
 *   hog share S
 *
 * On the kernel the two threads sleep and the share is near 1. A spinner
 * that kept the processor for its whole slice would leave it near 0.5.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_in peer;

static double secs(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *waiter(void *arg)
{
	(void)arg;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&peer, sizeof peer) < 0) {
		perror("yield: connect");
		exit(1);
	}
	char b[64];
	recv(fd, b, sizeof b, 0); /* blocks until the process exits */
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: yield ADDR PORT\n");
		return 2;
	}
	peer.sin_family = AF_INET;
	peer.sin_port = htons(atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1) {
		fprintf(stderr, "yield: bad address %s\n", argv[1]);
		return 2;
	}
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	if (sched_setaffinity(0, sizeof one, &one) < 0) {
		perror("yield: sched_setaffinity");
		return 1;
	}
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		if (pthread_create(&t[i], NULL, waiter, NULL) != 0) {
			fprintf(stderr, "yield: pthread_create failed\n");
			return 1;
		}
	usleep(200000); /* both connected and waiting */
	double w0 = secs(CLOCK_MONOTONIC), c0 = secs(CLOCK_THREAD_CPUTIME_ID);
	volatile unsigned long n = 0;
	while (secs(CLOCK_MONOTONIC) - w0 < 0.5)
		n++;
	double share = (secs(CLOCK_THREAD_CPUTIME_ID) - c0) / (secs(CLOCK_MONOTONIC) - w0);
	printf("hog share %.3f\n", share);
	fflush(stdout);
	_exit(0);
}
