/*
 * irqset: a program that blocks in epoll_wait on an accelerated
 * connection, then runs on without waiting on it
 * (TestShimInterruptOnlyWhileBlocked). Under the shim a thread blocks in
 * an epoll set of its own (the program's set and the stack's interrupt,
 * its AF_XDP socket, in it); the interrupt must leave that set when the
 * thread wakes: left in it, every frame's arrival paid the socket's
 * wait-queue lock and the epoll callback in the receiving context.
 *
 * It prints its process id and its epoll fd, then waits for its
 * standard input to close (a plain read on a kernel fd).
 *
 * usage: irqset ADDR PORT
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: irqset ADDR PORT\n");
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
		fprintf(stderr, "irqset: %s is not an IPv4 address\n", argv[1]);
		return 2;
	}
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("irqset: connect");
		return 1;
	}
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = s};
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0) {
		perror("irqset: epoll");
		return 1;
	}
	/* Nothing comes: each wait spins, then blocks until its timeout. */
	for (int i = 0; i < 3; i++) {
		struct epoll_event got;
		if (epoll_wait(ep, &got, 1, 50) != 0) {
			fprintf(stderr, "irqset: epoll_wait reported an event on an idle connection\n");
			return 1;
		}
	}
	printf("%d %d\n", getpid(), ep);
	fflush(stdout);
	char b[16];
	while (read(0, b, sizeof b) > 0)
		;
	return 0;
}
