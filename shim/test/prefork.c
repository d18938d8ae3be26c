/*
 * prefork: a pre-fork server whose second worker listens late. The master
 * listens on PORT and forks two workers, which inherit the socket. Worker
 * 0 waits on it at once (under the shim its stack's listener takes its
 * queue's connections). Worker 1 first makes its stack, by waiting on a
 * listener of its own on PORT+1, says "stack", and only DELAY_MS later
 * waits on the socket it inherited, as a worker slow to start would. Each
 * worker answers each connection's 8-byte request with its own number
 * and the request, and closes it once the client has. The master prints "listening" once it
 * listens, each worker "ready" once its first wait on the socket
 * returned; all end when the master's standard input ends.
 *
 *	prefork PORT DELAY_MS
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int listener(int port)
{
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (l < 0 || bind(l, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(l, 64) < 0) {
		perror("prefork: listen");
		exit(1);
	}
	return l;
}

static void serve(int l, int me)
{
	struct pollfd p = {.fd = l, .events = POLLIN};
	poll(&p, 1, 0); /* the first wait: the shim accelerates l here */
	printf("ready %d\n", me);
	fflush(stdout);
	for (;;) {
		if (poll(&p, 1, 1000) <= 0)
			continue;
		int c = accept(l, NULL, NULL);
		if (c < 0)
			continue;
		char buf[9];
		size_t got = 0;
		while (got < 8) {
			ssize_t r = recv(c, buf + 1 + got, 8 - got, 0);
			if (r <= 0)
				break;
			got += (size_t)r;
		}
		if (got == 8) {
			buf[0] = (char)('0' + me);
			send(c, buf, sizeof buf, MSG_NOSIGNAL);
			/* The client closes first: no TIME-WAIT here. */
			struct pollfd e = {.fd = c, .events = POLLIN};
			if (poll(&e, 1, 2000) == 1)
				recv(c, buf, 1, 0);
		}
		close(c);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: prefork PORT DELAY_MS\n");
		return 2;
	}
	int port = atoi(argv[1]), delay = atoi(argv[2]);
	int l = listener(port);
	printf("listening\n");
	fflush(stdout);
	pid_t w[2];
	for (int i = 0; i < 2; i++) {
		if ((w[i] = fork()) == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (i == 1) {
				struct pollfd p = {.fd = listener(port + 1), .events = POLLIN};
				poll(&p, 1, 0); /* makes this worker's stack */
				printf("stack 1\n");
				fflush(stdout);
				struct timespec ts = {.tv_sec = delay / 1000, .tv_nsec = (long)(delay % 1000) * 1000000};
				nanosleep(&ts, NULL);
			}
			serve(l, i);
		}
	}
	char b;
	while (read(0, &b, 1) > 0)
		;
	for (int i = 0; i < 2; i++) {
		kill(w[i], SIGTERM);
		waitpid(w[i], NULL, 0);
	}
	return 0;
}
