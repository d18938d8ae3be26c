/*
 * closeconnect: another thread closes a socket's fd while a connect on
 * it blocks (TestShimCloseDuringConnect). On the kernel the connect goes
 * on with the socket, which closes when the connect returns: the peer
 * gets a connection, then its end.
 *
 *   closeconnect ADDR PORT
 *
 * A thread connects to ADDR:PORT, blocking; 200 ms later the main thread
 * closes the socket's fd and prints "closed". The peer holds its answer
 * back until then (its accept queue full), so the connect is still
 * waiting. The main thread joins the thread and prints "connect ok", or
 * "connect -1 ERRNO".
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

static int fd;
static struct sockaddr_in peer = {.sin_family = AF_INET};
static int result = -1, result_errno;

static void *call(void *arg)
{
	(void)arg;
	result = connect(fd, (struct sockaddr *)&peer, sizeof peer);
	result_errno = errno;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: closeconnect ADDR PORT\n");
		return 2;
	}
	if (inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1) {
		fprintf(stderr, "closeconnect: %s is not an IPv4 address\n", argv[1]);
		return 2;
	}
	char *end;
	long port = strtol(argv[2], &end, 10);
	if (*end || port <= 0 || port > 65535) {
		fprintf(stderr, "closeconnect: %s is not a port\n", argv[2]);
		return 2;
	}
	peer.sin_port = htons(port);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) {
		perror("closeconnect: socket");
		return 1;
	}
	if (close_during(fd, call) < 0)
		return 1;
	if (result == 0)
		printf("connect ok\n");
	else
		printf("connect -1 %s\n", strerror(result_errno));
	return 0;
}
