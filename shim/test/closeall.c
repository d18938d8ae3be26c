/*
 * closeall: a program that closes every fd above its standard streams,
 * as a daemon does, while it has connections: with close_range, with
 * closefrom or with a loop of close (MODE). Two connections (A and B)
 * tell a server their names, a pipe, a file and an epoll instance are
 * open beside them; after the close it prints which of them are still
 * open, and asks the server on a new connection whether A and B ended
 * (it answers "eof" once it read the connection's end; each named with
 * the process's id, so that runs one after another do not meet). Under the shim the stack's
 * own fds are in the range too: before, the Go runtime ended the process
 * as they went ("netpollBreak write failed").
 *
 * In MODE dup2 it closes nothing, and dup2s its standard input onto the
 * first BPF map's fd it finds among its own (the shim's stack has some;
 * the kernel's none): the shim refuses it (EBADF) and the stack goes on.
 *
 * usage: closeall ADDR PORT close_range|closefrom|loop|dup2
 */
#define _GNU_SOURCE
#include "conform.h"
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <dirent.h>

/* bpf_map_fd is the first fd open on a BPF map, or -1. */
static int bpf_map_fd(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int found = -1;
	while (d && found < 0 && (de = readdir(d))) {
		char path[300], link[64];
		snprintf(path, sizeof path, "/proc/self/fd/%s", de->d_name);
		ssize_t n = readlink(path, link, sizeof link - 1);
		if (n > 0 && (link[n] = 0, !strcmp(link, "anon_inode:bpf-map")))
			found = atoi(de->d_name);
	}
	if (d)
		closedir(d);
	return found;
}

static const char *state(int fd)
{
	return fcntl(fd, F_GETFD) < 0 && errno == EBADF ? "closed" : "open";
}


int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s ADDR PORT close_range|closefrom|loop\n", argv[0]);
		return 2;
	}
	if (set_peer(argv[0], argv[1], argv[2]))
		return 2;
	int a = dial(), b = dial(), p[2];
	name_conn(a, "A");
	name_conn(b, "B");
	if (pipe(p) < 0)
		die("pipe");
	int f = open("/dev/null", O_RDONLY), ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = a};
	if (f < 0 || ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev) < 0)
		die("open, epoll");
	if (!strcmp(argv[3], "close_range")) {
		check("close_range", close_range(3, ~0u, 0));
	} else if (!strcmp(argv[3], "closefrom")) {
		closefrom(3);
	} else if (!strcmp(argv[3], "loop")) {
		struct rlimit rl;
		if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
			die("getrlimit");
		for (int fd = 3; fd < (int)rl.rlim_cur; fd++)
			close(fd);
	} else if (!strcmp(argv[3], "dup2")) {
		int m = bpf_map_fd();
		if (m < 0)
			say("no BPF map");
		else
			check("dup2 onto a BPF map's fd", dup2(0, m));
		close(a);
		close(b);
		close(p[0]);
		close(f);
		close(ep);
	} else {
		fprintf(stderr, "closeall: unknown mode %s\n", argv[3]);
		return 2;
	}
	say("A %s, B %s, pipe %s, file %s, epoll %s", state(a), state(b), state(p[0]), state(f), state(ep));
	int c = dial();
	ask(c, "A");
	ask(c, "B");
	/* The stack still works after: an epoll set on the new connection. */
	ep = epoll_create1(0);
	ev.data.fd = c;
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) < 0)
		die("epoll");
	char na[32];
	int lq = snprintf(na, sizeof na, "?A.%d\n", (int)getpid());
	if (send(c, na, lq, 0) != lq)
		die("send");
	check("epoll_wait", epoll_wait(ep, &ev, 1, 5000));
	return 0;
}
