/*
 * exitkick: a thread sends on a connection and ends at once, while the
 * main thread blocks in recv for the echo. It prints the median, over
 * the rounds, of the time from the send to the echo's arrival, in
 * microseconds. Under the shim the send leaves its frames for the
 * thread's next wait's kick; a thread that ends has none, and gives the
 * kick as it ends (thread_exit in shim/wait.c), instead of leaving
 * the frames for the stack's Sleeper to send within a millisecond.
 *
 * usage: exitkick ADDR PORT
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define ROUNDS 40

static int sock;
static double sent_at;

static double now_us(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void *sender(void *arg)
{
	(void)arg;
	usleep(3000); /* the main thread blocks in recv meanwhile */
	sent_at = now_us();
	if (send(sock, "ping", 4, 0) != 4)
		perror("send");
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: exitkick ADDR PORT\n");
		return 2;
	}
	struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1) {
		fprintf(stderr, "exitkick: bad address %s\n", argv[1]);
		return 2;
	}
	sock = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (connect(sock, (struct sockaddr *)&peer, sizeof peer) < 0) {
		perror("connect");
		return 1;
	}
	double d[ROUNDS];
	for (int i = 0; i < ROUNDS; i++) {
		pthread_t t;
		pthread_create(&t, NULL, sender, NULL);
		char buf[4];
		size_t got = 0;
		while (got < sizeof buf) {
			ssize_t r = recv(sock, buf + got, sizeof buf - got, 0);
			if (r <= 0) {
				perror("recv");
				return 1;
			}
			got += r;
		}
		d[i] = now_us() - sent_at;
		pthread_join(t, NULL);
	}
	qsort(d, ROUNDS, sizeof d[0], cmp);
	printf("median_us %.0f max_us %.0f\n", d[ROUNDS / 2], d[ROUNDS - 1]);
	return 0;
}
