/*
 * threadsrv: a thread-a-connection HTTP server for make bench's shim
 * section, as apache's worker threads, varnish's and MariaDB's serve.
 *
 *   threadsrv PORT
 *
 * The main thread accepts; each connection gets a thread of its own,
 * which blocks in read() until a request's header ends ("\r\n\r\n") and
 * answers it with write(): a 200 with a 1 KiB body, kept alive. It runs
 * until it is killed. A request longer than its buffer (4 KiB) closes
 * the connection; at most 1024 connections at a time are served, the
 * rest closed at once.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAX_CONNS 1024
#define BODY 1024

static char resp[256 + BODY];
static int resp_len;
static int live;

static void *serve(void *arg)
{
	int fd = (int)(long)arg;
	char buf[4096];
	size_t have = 0;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof buf - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += n;
		char *end;
		while ((end = memmem(buf, have, "\r\n\r\n", 4)) != NULL) {
			size_t used = end + 4 - buf;
			for (int off = 0; off < resp_len;) {
				ssize_t w = write(fd, resp + off, resp_len - off);
				if (w < 0 && errno == EINTR)
					continue;
				if (w <= 0)
					goto out;
				off += w;
			}
			memmove(buf, buf + used, have - used);
			have -= used;
		}
		if (have == sizeof buf)
			break;
	}
out:
	close(fd);
	__atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2 || atoi(argv[1]) <= 0 || atoi(argv[1]) > 65535) {
		fprintf(stderr, "usage: threadsrv PORT\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	char body[BODY];
	memset(body, 'x', sizeof body);
	resp_len = snprintf(resp, sizeof resp, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n", BODY);
	memcpy(resp + resp_len, body, BODY);
	resp_len += BODY;

	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (l < 0) {
		perror("threadsrv: socket");
		return 1;
	}
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 128) < 0) {
		perror("threadsrv: listen");
		return 1;
	}
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256 << 10);
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE)
				continue;
			perror("threadsrv: accept");
			return 1;
		}
		if (__atomic_add_fetch(&live, 1, __ATOMIC_RELAXED) > MAX_CONNS) {
			close(c);
			__atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
			continue;
		}
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		pthread_t t;
		if (pthread_create(&t, &at, serve, (void *)(long)c) != 0) {
			close(c);
			__atomic_sub_fetch(&live, 1, __ATOMIC_RELAXED);
		}
	}
}
