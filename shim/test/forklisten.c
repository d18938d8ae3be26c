/*
 * forklisten: a server that forks a worker after its stack loaded, the
 * worker accepting on the listener it inherited (a pre-fork server whose
 * master used a socket first: gunicorn --preload with an application
 * that connects somewhere as it loads). The parent connects to the echo
 * server at ADDR:PORT and echoes once (the stack loads), listens on
 * LPORT and answers one client ("listening", then the client's line);
 * a first child only reads the listener's name ("looker"); then it
 * forks again: the child polls the listener ("child ready"), accepts
 * a client and answers it, and exits; the parent reaps it, accepts and
 * answers one more client, and echoes once more on its connection. An
 * answer is the client's bytes back. Every line says who did what.
 *
 * usage: forklisten ADDR PORT LPORT
 */
#include <sys/wait.h>
#include "conform.h"

/* answer accepts a client on l, sends back what it sends, and says so. */
static void answer(int l, const char *who)
{
	char buf[64];
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	ssize_t n = recv(c, buf, sizeof buf, 0);
	if (n <= 0 || send(c, buf, n, MSG_NOSIGNAL) != n)
		die("answer");
	say("%s accepted: %.*s", who, (int)n, buf);
	close(c);
}

int main(int argc, char **argv)
{
	int r = peer_args_more(argc, argv, 1, "LPORT");
	if (r)
		return r;
	int s = dial();
	echo(s, "parent", "hello");
	int l = socket(AF_INET, SOCK_STREAM, 0);
	listen_on(l, atoi(argv[3]));
	struct pollfd p = {.fd = l, .events = POLLIN};
	poll(&p, 1, 0);
	say("listening");
	answer(l, "parent");
	/* A child that only looks at the listener, and exits. */
	pid_t looker = fork();
	if (looker < 0)
		die("fork");
	if (looker == 0) {
		struct sockaddr_in a;
		socklen_t al = sizeof a;
		if (getsockname(l, (struct sockaddr *)&a, &al) < 0)
			die("getsockname");
		say("looker: port %d", ntohs(a.sin_port));
		_exit(0);
	}
	int st;
	if (waitpid(looker, &st, 0) != looker)
		die("waitpid");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		/* The worker: its first use of the listener, then its accept. */
		p.revents = 0;
		say("child ready: poll %d", poll(&p, 1, 0));
		answer(l, "child");
		_exit(0);
	}
	if (waitpid(pid, &st, 0) != pid)
		die("waitpid");
	say("parent: child exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	answer(l, "parent");
	echo(s, "parent", "again");
	return 0;
}
