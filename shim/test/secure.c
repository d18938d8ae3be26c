/*
 * secure: a program that execs its worker with its real and effective
 * users apart, as squid's master does (root in effect, its user in
 * name): the dynamic loader runs the worker in secure mode. It forks two
 * children that exec this program as "worker": the first as it is, the
 * second after setresuid(65534, 0, 0). Each worker prints whether it
 * runs in secure mode and echoes a line through the echo server at
 * ADDR:PORT: the same under the shim as on the kernel (the first worker
 * accelerated, the second on the kernel, the shim saying why). Then a
 * third child, forked, takes user 65534 in full, as a daemon's worker
 * does, makes a UDP socket and echoes through a connection of its own
 * (under the shim a standalone stack needs root: the kernel's), its
 * shim's lines going to a log file it could no longer open. Run as
 * root.
 *
 *	secure ADDR PORT
 */
#define _GNU_SOURCE
#include <limits.h>
#include <sys/auxv.h>
#include <sys/wait.h>
#include "conform.h"

static void worker(const char *tag)
{
	int s = dial();
	printf("%s: secure mode %lu\n", tag, getauxval(AT_SECURE));
	fprintf(stderr, "%s: pid %d\n", tag, (int)getpid()); /* its lines in the shim's log */
	echo(s, tag, "through the worker's connection");
	close(s);
}

static void spawn(char **argv, const char *tag, int apart)
{
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		if (apart && setresuid(65534, 0, 0) < 0)
			die("setresuid");
		char self[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
		if (n < 0)
			die("readlink");
		self[n] = 0;
		execl(self, argv[0], argv[1], argv[2], "worker", tag, (char *)NULL);
		die("execl");
	}
	int st;
	waitpid(pid, &st, 0);
	printf("%s: exit %d\n", tag, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

int main(int argc, char **argv)
{
	if (argc == 5 && !strcmp(argv[3], "worker")) {
		if (set_peer(argv[0], argv[1], argv[2]))
			return 2;
		worker(argv[4]);
		return 0;
	}
	int r = peer_args(argc, argv);
	if (r)
		return r;
	spawn(argv, "same users", 0);
	spawn(argv, "users apart", 1);
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		if (setresuid(65534, 65534, 65534) < 0)
			die("setresuid");
		int u = socket(AF_INET, SOCK_DGRAM, 0);
		if (u < 0)
			die("socket");
		close(u);
		worker("another user");
		exit(0);
	}
	int st;
	waitpid(pid, &st, 0);
	printf("another user: exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	return 0;
}
