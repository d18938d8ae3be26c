/*
 * bindtodev: sockets bound to an interface (SO_BINDTODEVICE). One bound
 * to DEV (not the interface towards the peer) connects to the echo
 * server at ADDR:PORT, non-blocking, and prints what became of it in
 * 300 ms; one bound to OURS (the interface towards the peer) echoes a
 * line; then a listener bound to DEV on LPORT prints "listening", and
 * after a line on standard input, whether a connection came.
 *
 * usage: bindtodev ADDR PORT LPORT DEV OURS
 */
#include <fcntl.h>
#include "conform.h"

static int bound(const char *dev)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		die("socket");
	if (setsockopt(s, SOL_SOCKET, SO_BINDTODEVICE, dev, strlen(dev)) < 0)
		die("SO_BINDTODEVICE");
	return s;
}

int main(int argc, char **argv)
{
	int r = peer_args_more(argc, argv, 3, "LPORT DEV OURS");
	if (r)
		return r;

	int s = bound(argv[4]);
	fcntl(s, F_SETFL, O_NONBLOCK);
	int c = connect(s, (struct sockaddr *)&peer, sizeof peer);
	int e = errno;
	struct pollfd p = {.fd = s, .events = POLLOUT};
	int n = c < 0 && e == EINPROGRESS ? poll(&p, 1, 300) : 1;
	int err = 0;
	socklen_t l = sizeof err;
	getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &l);
	say("bound elsewhere: connect %s; in 300 ms %s, %s", c == 0 ? "done" : strerror(e),
	    n == 0 ? "nothing" : "an end", err ? strerror(err) : "no error");
	close(s);

	int t = bound(argv[5]);
	if (connect(t, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	echo(t, "bound to ours", "a line");
	close(t);

	int ls = bound(argv[4]);
	listen_on(ls, atoi(argv[3]));
	say("listening");
	char line[16];
	if (!fgets(line, sizeof line, stdin))
		die("stdin");
	struct pollfd lp = {.fd = ls, .events = POLLIN};
	say("a connection came: %s", poll(&lp, 1, 0) == 1 ? "yes" : "no");
	return 0;
}
