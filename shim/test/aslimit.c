/*
 * aslimit: a program that limits its own address space (RLIMIT_AS), as
 * vsftpd's session processes do, with a connection open. It connects to
 * the echo server at ADDR:PORT (under the shim, through the stack), then
 * forks a child that sets a limit of 200 MiB and maps 12 KiB, sets a
 * limit of 1 GiB itself and maps 12 KiB, echoes a line through the
 * connection under it, and prints what each step gave: the same under
 * the shim as on the kernel. With "exec", the child execs
 * /bin/sh -c 'ulimit -v' instead, which prints the limit it inherited.
 * With "spawn", the parent then starts that shell with posix_spawn,
 * under its own limit, and again with LD_PRELOAD out of its
 * environment, and then with system and popen.
 *
 *	aslimit ADDR PORT [exec|spawn]
 */
#define _GNU_SOURCE
#include <spawn.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include "conform.h"
#include "noshim.h"

static void limit(const char *who, rlim_t bytes)
{
	struct rlimit r = {bytes, bytes}, back;
	int set = setrlimit(RLIMIT_AS, &r);
	getrlimit(RLIMIT_AS, &back);
	void *m = mmap(NULL, 12288, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	printf("%s: setrlimit %d, getrlimit %lu MiB / %lu MiB, mmap %s\n", who, set, (unsigned long)(back.rlim_cur >> 20),
	       (unsigned long)(back.rlim_max >> 20), m == MAP_FAILED ? strerror(errno) : "ok");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	int ex = argc == 4 && !strcmp(argv[3], "exec"), sp = argc == 4 && !strcmp(argv[3], "spawn");
	int r = peer_args_more(argc - ex - sp, argv, 0, "[exec|spawn]");
	if (r)
		return r;
	int s = dial();
	pid_t pid = fork();
	if (pid == 0) {
		if (ex) {
			struct rlimit r = {200UL << 20, RLIM_INFINITY};
			setrlimit(RLIMIT_AS, &r);
			execl("/bin/sh", "sh", "-c", "echo child exec: ulimit -v $(ulimit -v)", (char *)NULL);
			_exit(127);
		}
		limit("child", 200UL << 20);
		_exit(0);
	}
	waitpid(pid, NULL, 0);
	limit("parent", 1UL << 30);
	char buf[64];
	const char line[] = "through the connection\n";
	ssize_t n = -1;
	if (send(s, line, sizeof line - 1, 0) == sizeof line - 1)
		n = recv(s, buf, sizeof line - 1, MSG_WAITALL);
	printf("parent: echo %zd bytes\n", n);
	fflush(stdout);
	if (sp) {
		/* A shell whose first act is a fork (the command substitution),
		 * in the environment as it is; then one without LD_PRELOAD in
		 * its environment, which looks a moment later. */
		extern char **environ;
		char *bare[256];
		env_without_shim(bare, 256);
		char *sh[] = {"sh", "-c", "echo child spawn: ulimit -v $(ulimit -v)", NULL};
		char *later[] = {"sh", "-c", "sleep 0.3; echo child spawn without LD_PRELOAD: ulimit -v $(ulimit -v)", NULL};
		char **argvs[] = {sh, later}, **envs[] = {environ, bare};
		for (int i = 0; i < 2; i++) {
			int e = posix_spawn(&pid, "/bin/sh", NULL, NULL, argvs[i], envs[i]);
			if (e != 0)
				printf("posix_spawn: %s\n", strerror(e));
			else
				waitpid(pid, NULL, 0);
		}
		fflush(stdout);
		int st = system("echo child system: ulimit -v $(ulimit -v)");
		printf("system: %d\n", st);
		FILE *f = popen("echo child popen: ulimit -v $(ulimit -v)", "r");
		char got[128];
		if (!f)
			printf("popen: %s\n", strerror(errno));
		else {
			while (fgets(got, sizeof got, f))
				fputs(got, stdout);
			printf("pclose: %d\n", pclose(f));
		}
	}
	close(s);
	return 0;
}
