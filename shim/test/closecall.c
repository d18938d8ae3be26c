/*
 * closecall: another thread closes a connection's fd while a call on it
 * blocks (TestShimCloseDuringCall). On the kernel the call goes on with
 * the socket, which closes when the call returns.
 *
 *   closecall ADDR PORT recv|send
 *
 * It connects and sends the mode's name and a newline. recv: a thread
 * blocks in recv for up to 100 bytes; the peer sends "late\n" 600 ms
 * after it got the name. send: a thread writes 8 MiB of a pattern (byte
 * i is (i * 7 + 3) & 0xff) in one write, which blocks: the peer reads
 * nothing for 600 ms. Either way the main thread closes the fd 200 ms
 * after the thread began, then joins it, and prints what the call
 * returned: "recv N DATA" or "send N", or "MODE -1 ERRNO".
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SEND_BYTES (8 << 20)

static int sock;
static const char *mode;
static long result;
static int result_errno;
static char got[101];

static void *call(void *arg)
{
	(void)arg;
	if (strcmp(mode, "recv") == 0) {
		result = recv(sock, got, 100, 0);
	} else {
		char *b = malloc(SEND_BYTES);
		for (long i = 0; i < SEND_BYTES; i++)
			b[i] = (char)(i * 7 + 3);
		result = write(sock, b, SEND_BYTES);
		free(b);
	}
	result_errno = errno;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[3], "recv") != 0 && strcmp(argv[3], "send") != 0)) {
		fprintf(stderr, "usage: closecall ADDR PORT recv|send\n");
		return 2;
	}
	mode = argv[3];
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1) {
		fprintf(stderr, "closecall: %s is not an IPv4 address\n", argv[1]);
		return 2;
	}
	sock = socket(AF_INET, SOCK_STREAM, 0);
	if (sock < 0 || connect(sock, (struct sockaddr *)&a, sizeof a) < 0) {
		perror("closecall: connect");
		return 1;
	}
	char hello[8];
	int n = snprintf(hello, sizeof hello, "%s\n", mode);
	if (write(sock, hello, n) != n) {
		perror("closecall: write");
		return 1;
	}
	pthread_t t;
	pthread_create(&t, NULL, call, NULL);
	struct timespec d = {0, 200 * 1000000L};
	nanosleep(&d, NULL);
	if (close(sock) != 0) {
		perror("closecall: close");
		return 1;
	}
	pthread_join(t, NULL);
	if (result < 0)
		printf("%s -1 %s\n", mode, strerror(result_errno));
	else if (strcmp(mode, "recv") == 0)
		printf("recv %ld %.*s", result, (int)result, got);
	else
		printf("send %ld\n", result);
	return 0;
}
