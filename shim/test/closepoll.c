/*
 * closepoll: another thread closes a connection's fd while poll or
 * select waits on it (TestShimCloseDuringPoll). The kernel's poll and
 * select hold the socket: the close does not end the wait. Woken by the
 * socket's next event, poll finds the number closed and reports
 * POLLNVAL, and select puts it in each set it was in (6.18). The wait's
 * time is 1.5 s.
 *
 *   closepoll poll|select ADDR PORT
 *
 * It connects to ADDR:PORT and prints "connected". A thread waits for
 * the connection to turn readable; 200 ms later the main thread closes
 * the fd and prints "closed". The peer sends a byte some time after
 * that. The main thread joins the thread and prints what the wait
 * returned and when: "poll R REVENTS MS" (REVENTS in hex) or "select R
 * ISSET MS", MS its milliseconds from its start.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "closing.h"

static int fd, use_select;
static int result, result_errno, result_ev;
static long result_ms;

static long ms_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
}

static void *call(void *arg)
{
	(void)arg;
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (use_select) {
		fd_set r;
		FD_ZERO(&r);
		FD_SET(fd, &r);
		struct timeval tv = {.tv_sec = 1, .tv_usec = 500000};
		result = select(fd + 1, &r, NULL, NULL, &tv);
		result_ev = result > 0 && FD_ISSET(fd, &r);
	} else {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		result = poll(&p, 1, 1500);
		result_ev = p.revents;
	}
	result_errno = errno;
	result_ms = ms_since(&t0);
	return NULL;
}

int main(int argc, char **argv)
{
	struct sockaddr_in peer = {.sin_family = AF_INET};
	char *end;
	long port = argc == 4 ? strtol(argv[3], &end, 10) : 0;
	if (argc != 4 || (strcmp(argv[1], "poll") && strcmp(argv[1], "select")) ||
	    inet_pton(AF_INET, argv[2], &peer.sin_addr) != 1 || *end || port <= 0 || port > 65535) {
		fprintf(stderr, "usage: closepoll poll|select IPV4-ADDR PORT\n");
		return 2;
	}
	use_select = !strcmp(argv[1], "select");
	peer.sin_port = htons(port);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&peer, sizeof peer) < 0) {
		perror("closepoll: connect");
		return 1;
	}
	printf("connected\n");
	fflush(stdout);
	if (close_during(fd, call) < 0)
		return 1;
	if (result < 0)
		printf("%s -1 %s %ld\n", argv[1], strerror(result_errno), result_ms);
	else
		printf("%s %d %#x %ld\n", argv[1], result, result_ev, result_ms);
	return 0;
}
