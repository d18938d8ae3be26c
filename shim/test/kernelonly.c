/*
 * kernelonly: an epoll instance (or a poll's set, a select's) whose
 * accelerated member stays idle (a listener nobody dials) while its kernel
 * member (a pipe) is the one that turns ready: a thread writes a byte to
 * the pipe every millisecond, 300 times, and the main thread waits for
 * each in epoll_wait (poll, select). It prints the
 * main thread's CPU time a wait, in µs. Under the shim, a wait that spins
 * on the stack until the byte comes costs about the millisecond
 * (ONLOAD_SPIN_US above it); one that blocks, a few µs
 * (TestShimKernelOnlyNoSpin).
 *
 *	kernelonly ADDR PORT [epoll|poll|select]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/select.h>
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

/* wait_pipe waits (1 s at most) for the pipe, beside listener ls, by how:
 * 1 if only the pipe is ready. */
static int wait_pipe(const char *how, int ep, int ls)
{
	if (!strcmp(how, "poll")) {
		struct pollfd p[2] = {{.fd = ls, .events = POLLIN}, {.fd = pipefd[0], .events = POLLIN}};
		return poll(p, 2, 1000) == 1 && p[1].revents == POLLIN && !p[0].revents;
	}
	if (!strcmp(how, "select")) {
		fd_set r;
		FD_ZERO(&r);
		FD_SET(ls, &r);
		FD_SET(pipefd[0], &r);
		struct timeval tv = {.tv_sec = 1};
		int m = ls > pipefd[0] ? ls : pipefd[0];
		return select(m + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(pipefd[0], &r);
	}
	struct epoll_event out[2];
	return epoll_wait(ep, out, 2, 1000) == 1 && out[0].data.fd == pipefd[0];
}

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: kernelonly ADDR PORT [epoll|poll|select]\n");
		return 2;
	}
	const char *how = argc == 4 ? argv[3] : "epoll";
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
		if (!wait_pipe(how, ep, ls)) {
			printf("FATAL %s %d: not the pipe alone ready (%s)\n", how, i, strerror(errno));
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
