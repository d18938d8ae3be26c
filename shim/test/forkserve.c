/*
 * forkserve: a server of a process a connection, as PostgreSQL's
 * postmaster and inetd are: it accepts on PORT, forks a child for each
 * connection and closes its own copy at once (under the shim the
 * connection goes to the kernel for the child); the child reads a
 * request of 8 bytes, writes it back and exits. It prints "listening"
 * once it listens, and serves until its standard input ends. With
 * "greet", the parent writes "hello\n" on each connection before it
 * forks, as a server that uses its connections itself does.
 *
 *	forkserve PORT [greet]
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 2 && (argc != 3 || strcmp(argv[2], "greet") != 0)) {
		fprintf(stderr, "usage: forkserve PORT [greet]\n");
		return 2;
	}
	int greet = argc == 3;
	signal(SIGCHLD, SIG_IGN); /* children reaped as they end */
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (l < 0 || bind(l, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(l, 64) < 0) {
		perror("forkserve: listen");
		return 1;
	}
	printf("listening\n");
	fflush(stdout);
	for (;;) {
		struct pollfd p[2] = {{.fd = l, .events = POLLIN}, {.fd = 0, .events = POLLIN}};
		if (poll(p, 2, -1) < 0)
			continue;
		if (p[1].revents)
			return 0; /* standard input ended */
		int c = accept(l, NULL, NULL);
		if (c < 0)
			continue;
		if (greet && send(c, "hello\n", 6, MSG_NOSIGNAL) != 6) {
			close(c);
			continue;
		}
		pid_t pid = fork();
		if (pid == 0) {
			close(l);
			char buf[8];
			size_t got = 0;
			while (got < sizeof buf) {
				ssize_t r = recv(c, buf + got, sizeof buf - got, 0);
				if (r <= 0)
					_exit(1);
				got += r;
			}
			send(c, buf, sizeof buf, MSG_NOSIGNAL);
			close(c);
			_exit(0);
		}
		close(c);
	}
}
