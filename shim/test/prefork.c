/*
 * prefork: a pre-fork server whose second worker listens late. The master
 * listens on PORT and forks two workers, which inherit the socket. Worker
 * 0 waits on it at once (under the shim its stack's listener takes its
 * queue's connections). Worker 1 first makes its stack, by waiting on a
 * listener of its own on PORT+1, says "stack 1", and only DELAY_MS later
 * waits on the socket it inherited, as a worker slow to start would.
 * With "early", worker 1 makes no stack first: it comes to onloadd
 * ($ONLOAD_DAEMON_SOCKET) as a process whose core has loaded and not yet
 * asked for its stack would (a hello, no more), says "hello 1", and
 * DELAY_MS later waits on the socket (its stack is made then); worker 0
 * waits for its hello before its first wait. Each
 * worker answers each connection's 8-byte request with its own number
 * and the request, and closes it once the client has. The master prints
 * "listening" once it listens, each worker "ready N" once its first wait
 * on the socket returned; all end when the master's standard input ends.
 *
 *	prefork PORT DELAY_MS [early]
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
#include <sys/un.h>
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

/* hello comes to onloadd as the shim's core does, and keeps the
 * connection: a process with no stack yet. */
static void hello(void)
{
	const char *path = getenv("ONLOAD_DAEMON_SOCKET");
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int u = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (!path || strlen(path) >= sizeof sun.sun_path || u < 0) {
		fprintf(stderr, "prefork: no ONLOAD_DAEMON_SOCKET\n");
		exit(1);
	}
	strcpy(sun.sun_path, path);
	const char msg[] = "{\"v\":1,\"seq\":1,\"op\":\"hello\",\"hello\":{\"program\":\"prefork\"}}";
	char rep[4096];
	if (connect(u, (struct sockaddr *)&sun, sizeof sun) < 0 || send(u, msg, sizeof msg - 1, 0) < 0 ||
	    recv(u, rep, sizeof rep, 0) <= 0) {
		perror("prefork: hello to onloadd");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	if (argc != 3 && (argc != 4 || strcmp(argv[3], "early") != 0)) {
		fprintf(stderr, "usage: prefork PORT DELAY_MS [early]\n");
		return 2;
	}
	int port = atoi(argv[1]), delay = atoi(argv[2]), early = argc == 4;
	int l = listener(port);
	printf("listening\n");
	fflush(stdout);
	int said[2]; /* early: worker 1 has said hello, worker 0 may listen */
	if (pipe(said) < 0) {
		perror("prefork: pipe");
		return 1;
	}
	pid_t w[2];
	for (int i = 0; i < 2; i++) {
		if ((w[i] = fork()) == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (i == 1) {
				if (early) {
					hello();
					printf("hello 1\n");
					if (write(said[1], "h", 1) != 1)
						exit(1);
				} else {
					struct pollfd p = {.fd = listener(port + 1), .events = POLLIN};
					poll(&p, 1, 0); /* makes this worker's stack */
					printf("stack 1\n");
				}
				fflush(stdout);
				struct timespec ts = {.tv_sec = delay / 1000, .tv_nsec = (long)(delay % 1000) * 1000000};
				nanosleep(&ts, NULL);
			}
			char h;
			if (i == 0 && early && read(said[0], &h, 1) != 1)
				exit(1);
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
