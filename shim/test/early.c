/*
 * early: calls the shim interposes, made from a library's constructor,
 * which the loader runs before the shim's own (a library the program
 * needs is initialized before one LD_PRELOAD put in, as sshd's
 * libcap-ng is). Built twice: with -DEARLY_LIB as libearly.so, whose
 * constructor makes the calls, and as the program that needs it. It
 * prints the same with and without the shim (TestShimEarlyCalls).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef EARLY_LIB
__attribute__((constructor)) static void early(void)
{
	int p[2];
	char c = 0;
	if (pipe(p) < 0) {
		printf("constructor: pipe failed\n");
		return;
	}
	printf("constructor: write %zd\n", write(p[1], "x", 1));
	int n = -1;
	printf("constructor: ioctl FIONREAD %d, %d\n", ioctl(p[0], FIONREAD, &n), n);
	printf("constructor: fcntl F_GETFL O_WRONLY %d\n", (fcntl(p[1], F_GETFL) & O_ACCMODE) == O_WRONLY);
	struct pollfd q = {.fd = p[0], .events = POLLIN};
	printf("constructor: poll %d\n", poll(&q, 1, 0));
	printf("constructor: read %zd %c\n", read(p[0], &c, 1), c);
	struct sigaction old;
	printf("constructor: sigaction %d\n", sigaction(SIGUSR1, NULL, &old));
	int s = socket(AF_INET, SOCK_STREAM, 0);
	printf("constructor: socket %d\n", s >= 0);
	printf("constructor: close %d %d %d\n", close(p[0]), close(p[1]), close(s));
	fflush(stdout);
}
#else
int main(void)
{
	printf("main\n");
	return 0;
}
#endif
