/*
 * kernhalf: a server whose first connection its listener's kernel half
 * accepted before the shim took the port. It listens on PORT, says
 * "listening", and waits for a line on stdin (the test connects its
 * client meanwhile, which the kernel accepts into the backlog); then it
 * accepts (the shim's core takes the port here, and the kernel's
 * connection comes from the backlog) and echoes what the connection
 * sends until its end.
 *
 * usage: kernhalf PORT
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: kernhalf PORT\n");
		return 2;
	}
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 8) < 0) {
		perror("listen");
		return 1;
	}
	printf("listening\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof line, stdin)) {
		fprintf(stderr, "no go\n");
		return 1;
	}
	int c = accept(ls, NULL, NULL);
	if (c < 0) {
		perror("accept");
		return 1;
	}
	char buf[4096];
	long total = 0;
	for (;;) {
		ssize_t n = read(c, buf, sizeof buf);
		if (n < 0) {
			perror("read");
			return 1;
		}
		if (n == 0)
			break;
		for (ssize_t off = 0; off < n;) {
			ssize_t w = write(c, buf + off, n - off);
			if (w < 0) {
				perror("write");
				return 1;
			}
			off += w;
		}
		total += n;
	}
	printf("echoed %ld\n", total);
	return 0;
}
