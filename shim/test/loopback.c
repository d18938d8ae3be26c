/*
 * loopback: a program whose TCP is all on loopback (a database client's
 * local connection; varnish's manager, whose command line listens on
 * 127.0.0.1): it listens on 127.0.0.1:PORT, connects to it, echoes a
 * line both ways, and prints each step: the same under the shim as on
 * the kernel, where no stack serves 127.0.0.0/8. Under the shim the core
 * does not load for it (TestShimLoopback).
 *
 *	loopback PORT
 */
#define _GNU_SOURCE
#include "conform.h"

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s PORT\n", argv[0]);
		return 2;
	}
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) < 0 || listen(l, 8) < 0)
		die("listen");
	say("listening on 127.0.0.1");
	if (set_peer(argv[0], "127.0.0.1", argv[1]))
		return 2;
	int c = dial();
	int s = accept(l, NULL, NULL);
	if (s < 0)
		die("accept");
	say("connected and accepted");
	char buf[64];
	const char line[] = "over loopback";
	if (send(c, line, sizeof line - 1, 0) != sizeof line - 1 || read_full(s, buf, sizeof line - 1) != sizeof line - 1)
		die("client to server");
	say("server read: %.*s", (int)sizeof line - 1, buf);
	if (send(s, buf, sizeof line - 1, 0) != sizeof line - 1 || read_full(c, buf, sizeof line - 1) != sizeof line - 1)
		die("server to client");
	say("client read: %.*s", (int)sizeof line - 1, buf);
	return 0;
}
