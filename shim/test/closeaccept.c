/*
 * closeaccept: another thread closes a listener's fd while an accept on
 * it blocks (TestShimCloseDuringAccept). On the kernel the accept goes
 * on with the listener, which closes when the accept returns: a
 * connection that comes after the close is accepted.
 *
 *   closeaccept ADDR
 *
 * It listens on ADDR, port 0, and prints "listening PORT". A thread
 * blocks in accept; 200 ms later the main thread closes the listener's
 * fd and prints "closed". The peer connects after that. The thread
 * writes "hello\n" on the connection it accepted and closes it; the
 * main thread joins it and prints "accept ok", or "accept -1 ERRNO".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "closing.h"

static int lfd;
static int result = -1, result_errno;

static void *call(void *arg)
{
	(void)arg;
	int c = accept(lfd, NULL, NULL);
	result_errno = errno;
	if (c >= 0) {
		result = 0;
		if (write(c, "hello\n", 6) != 6)
			result_errno = errno, result = -1;
		close(c);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: closeaccept ADDR\n");
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET};
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
		fprintf(stderr, "closeaccept: %s is not an IPv4 address\n", argv[1]);
		return 2;
	}
	socklen_t l = sizeof a;
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 8) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&a, &l) < 0) {
		perror("closeaccept: listen");
		return 1;
	}
	printf("listening %d\n", ntohs(a.sin_port));
	fflush(stdout);
	if (close_during(lfd, call) < 0)
		return 1;
	if (result == 0)
		printf("accept ok\n");
	else
		printf("accept -1 %s\n", strerror(result_errno));
	return 0;
}
