/*
 * passlisten: a listener handed on while its connections live on, as a
 * server's reload does (haproxy's, passing its listeners over a Unix
 * socket to the new process, which accepts from then on while the old
 * one finishes its connections). The server accepts the client's first
 * connection and keeps it, passes the listener to a process of its own
 * (exec'd, so that only the message carries it: SCM_RIGHTS) and closes
 * its own copy; then the first connection answers again, and the client
 * dials the second at once, the third half a second later: the new
 * process accepts both. With keep, the old process keeps its copy open
 * (without accepting on it) until the end: the new process accepts all
 * the same, as the two share one socket. Both sides print one line per
 * result, so that the server's output under the shim must be the same
 * as without it (TestShimPassListener).
 *
 *	passlisten serve PORT [keep]
 *	passlisten connect ADDR PORT
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/wait.h>

#include "conform.h"

/* answer waits (5 s at most) for what the peer sends on c, prints it
 * under what and answers reply. */
static void answer(int c, const char *what, const char *reply)
{
	struct pollfd p = {.fd = c, .events = POLLIN};
	char buf[32];
	ssize_t r = poll(&p, 1, 5000) == 1 ? recv(c, buf, sizeof buf, 0) : 0;
	if (r <= 0) {
		say("%s: %s", what, r < 0 ? strerror(errno) : "nothing in 5 s");
		return;
	}
	say("%s: %.*s", what, (int)r, buf);
	if (send(c, reply, strlen(reply), MSG_NOSIGNAL) < 0)
		say("%s: its answer: %s", what, strerror(errno));
}

/* take accepts the next connection on ls (5 s at most): -1 if none. */
static int take(int ls, const char *who)
{
	struct pollfd p = {.fd = ls, .events = POLLIN};
	if (poll(&p, 1, 5000) != 1) {
		say("%s: no connection in 5 s", who);
		return -1;
	}
	/* Close-on-exec: the new process gets the listener only, and the
	 * old one's connection stays its own (an inherited one would go to
	 * the kernel at the exec). */
	int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
	if (c < 0)
		say("%s: accept: %s", who, strerror(errno));
	return c;
}

/* receive is the new process: the listener comes on Unix socket us. */
static int receive(int us)
{
	int ls;
	if (recv_fd(us, &ls) != 1 || ls < 0)
		die("recvmsg");
	/* Nothing said yet: the old process answers the first connection
	 * again meanwhile, and the two print to one stream. */
	for (int i = 2; i <= 3; i++) {
		int k = take(ls, "new process");
		if (k >= 0) {
			answer(k, "new process, a connection", "new");
			close(k);
		}
	}
	return 0;
}

static int serve(const char *self, int port, int keep)
{
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 16) < 0)
		die("listen");
	/* A look at the listener first: under the shim that accelerates it
	 * (the stack's filter is in before the client dials). */
	struct pollfd lp = {.fd = ls, .events = POLLIN};
	poll(&lp, 1, 0);
	say("listening");
	int c1 = take(ls, "old process");
	if (c1 < 0)
		return 1;
	answer(c1, "old process, the first connection", "old");
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
		die("socketpair");
	pid_t pid = fork();
	if (pid == 0) {
		char fd[16];
		snprintf(fd, sizeof fd, "%d", sp[1]);
		fcntl(sp[1], F_SETFD, 0);
		execl(self, self, "receive", fd, (char *)NULL);
		_exit(127);
	}
	close(sp[1]);
	check("old process: the listener passed", send_fd(sp[0], ls));
	if (!keep)
		check("old process: its copy closed", close(ls));
	answer(c1, "old process, the first connection again", "old again");
	int st;
	waitpid(pid, &st, 0);
	if (keep)
		check("old process: its copy closed at the end", close(ls));
	close(c1);
	say("done");
	return 0;
}

/* hello dials the server, sends msg and prints its answer. */
static int hello(const char *what, const char *msg)
{
	int s = dial();
	char buf[32];
	if (send(s, msg, strlen(msg), 0) < 0)
		die("send");
	ssize_t r = recv(s, buf, sizeof buf, 0);
	say("%s: %.*s", what, r > 0 ? (int)r : 0, buf);
	return s;
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "receive"))
		return receive(atoi(argv[2]));
	if ((argc == 3 || argc == 4) && !strcmp(argv[1], "serve"))
		return serve("/proc/self/exe", atoi(argv[2]), argc == 4 && !strcmp(argv[3], "keep"));
	if (argc != 4 || strcmp(argv[1], "connect")) {
		fprintf(stderr, "usage: passlisten serve PORT [keep] | connect ADDR PORT\n");
		return 2;
	}
	if (set_peer("passlisten", argv[2], argv[3]))
		return 2;
	alarm(30);
	int c1 = hello("the first connection", "1");
	/* The server answers again once it has passed its listener (and
	 * closed its copy): the second connection comes at once, while the
	 * new process may not have looked at the listener yet, and must find
	 * the port the kernel socket's, which the two processes share (under
	 * the shim: not a stack that has no listener on it). The third comes
	 * after the new process has taken it (its stack's, under the shim). */
	char buf[32];
	send(c1, "again", 5, 0);
	ssize_t r = recv(c1, buf, sizeof buf, 0);
	say("the first again: %.*s", r > 0 ? (int)r : 0, buf);
	close(hello("the second", "2"));
	usleep(500000);
	close(hello("the third", "3"));
	close(c1);
	say("done");
	return 0;
}
