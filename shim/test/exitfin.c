/*
 * exitfin: a program that writes a little on a connection and exits at
 * once, without closing it (TestShimExitFIN). The kernel closes the
 * connection as the process ends: its FIN follows the data within a
 * round trip. Under the shim the data is likely still unacknowledged at
 * the exit, so the connection is handed over to the kernel
 * (handover_at_exit in shim/process.c) and must be let go there, not
 * left to the process's end.
 *
 * usage: exitfin ADDR PORT
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: exitfin ADDR PORT\n");
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
		fprintf(stderr, "exitfin: %s is not an IPv4 address\n", argv[1]);
		return 2;
	}
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("exitfin: connect");
		return 1;
	}
	char b[100] = "exitfin\n";
	if (write(s, b, sizeof b) != sizeof b) {
		perror("exitfin: write");
		return 1;
	}
	return 0;
}
