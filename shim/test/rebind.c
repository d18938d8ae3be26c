/*
 * rebind: a connection handed to a child that closes it first, then a
 * listener on its port, as a server that restarts makes one. It talks
 * to a TCP echo server at ADDR PORT (which closes after the end of what
 * it reads) and prints one line per result, the same under the shim as
 * on the kernel:
 *
 *	rebind ADDR PORT
 *
 * Its socket has SO_REUSEADDR and a port of its own before it connects.
 * After a line, it forks; the parent closes its copy (under the shim the
 * connection goes to the kernel, for the child), the child sends a line,
 * shuts its side and reads to the end: its side of the connection waits
 * in TIME-WAIT. Then a new socket with SO_REUSEADDR binds the port and
 * listens. The kernel leaves a repaired socket's SO_REUSEADDR off, and a
 * handed-over connection's TIME-WAIT refused the bind for a minute.
 */
#define _GNU_SOURCE
#include <sys/wait.h>

#include "conform.h"

int main(int argc, char **argv)
{
	if (peer_args(argc, argv))
		return 2;
	int one = 1;
	int s = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in me = {.sin_family = AF_INET};
	socklen_t ml = sizeof me;
	if (s < 0 || bind(s, (struct sockaddr *)&me, sizeof me) < 0 || getsockname(s, (struct sockaddr *)&me, &ml) < 0)
		die("bind");
	if (connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	echo(s, "connected", "hello\n");
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0) {
		usleep(100000); /* the parent's close first */
		echo(s, "the child", "child\n");
		shutdown(s, SHUT_WR);
		char buf[64];
		ssize_t r;
		while ((r = recv(s, buf, sizeof buf, 0)) > 0)
			;
		say("the child read to the end: %s", r == 0 ? "yes" : strerror(errno));
		close(s);
		_exit(0);
	}
	close(s);
	int st;
	waitpid(pid, &st, 0);
	say("the child exited %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	check("a new socket with SO_REUSEADDR binds the port", bind(l, (struct sockaddr *)&me, sizeof me));
	check("and listens", listen(l, 4));
	close(l);
	say("done");
	return 0;
}
