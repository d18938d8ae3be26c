/*
 * kernelonly: an epoll instance whose accelerated member stays idle (a
 * listener nobody dials) while its kernel member (a pipe) is the one that
 * turns ready: a thread writes a byte to the pipe every millisecond, 300
 * times, and the main thread waits for each in epoll_wait. It prints the
 * main thread's CPU time a wait, in µs. Under the shim, a wait that spins
 * on the stack until the byte comes costs about the millisecond
 * (ONLOAD_SPIN_US above it); one that blocks, a few µs
 * (TestShimKernelOnlyNoSpin).
 *
 *	kernelonly ADDR PORT
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>

#include "conform.h"

#define ROUNDS 300

static int pipefd[2];

static void *writer(void *arg)
{
	(void)arg;
	struct timespec ms = {.tv_nsec = 1000000};
	for (int i = 0; i < ROUNDS; i++) {
		nanosleep(&ms, NULL);
		if (write(pipefd[1], "x", 1) != 1)
			die("write");
	}
	return NULL;
}

static double thread_cpu_us(void)
{
	struct rusage ru;
	getrusage(RUSAGE_THREAD, &ru);
	return ru.ru_utime.tv_sec * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_sec * 1e6 + ru.ru_stime.tv_usec;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: kernelonly ADDR PORT\n");
		return 2;
	}
	if (set_peer("kernelonly", argv[1], argv[2]))
		return 2;
	alarm(30);
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (ls < 0 || bind(ls, (struct sockaddr *)&peer, sizeof peer) < 0 || listen(ls, 16) < 0)
		die("listen");
	if (pipe(pipefd) < 0)
		die("pipe");
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = ls};
	if (epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev) < 0)
		die("epoll_ctl listener");
	ev.data.fd = pipefd[0];
	if (epoll_ctl(ep, EPOLL_CTL_ADD, pipefd[0], &ev) < 0)
		die("epoll_ctl pipe");
	pthread_t t;
	if (pthread_create(&t, NULL, writer, NULL))
		die("pthread_create");
	double cpu0 = thread_cpu_us();
	for (int i = 0; i < ROUNDS; i++) {
		struct epoll_event out[2];
		int n = epoll_wait(ep, out, 2, 1000);
		if (n != 1 || out[0].data.fd != pipefd[0]) {
			printf("FATAL wait %d: %d events, the first fd %d (the pipe is %d)\n", i, n, n > 0 ? out[0].data.fd : -1, pipefd[0]);
			return 1;
		}
		char c;
		if (read(pipefd[0], &c, 1) != 1)
			die("read");
	}
	double cpu = thread_cpu_us() - cpu0;
	pthread_join(t, NULL);
	printf("cpu_us_per_wait %.1f\n", cpu / ROUNDS);
	return 0;
}
