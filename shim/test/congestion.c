/*
 * congestion: TCP_CONGESTION (tcp(7)). Connections to the echo server at
 * ADDR:PORT: one set to reno before its connect, then to cubic; an
 * algorithm that does not exist; one set to OTHER (an algorithm the
 * kernel has and the stack has not, "-" for none) before its connect,
 * and OTHER on the first connection; and what a connection that set
 * nothing reports. Each line says what getsockopt read back.
 *
 * usage: congestion ADDR PORT OTHER
 */
#include "conform.h"

static const char *cc(int s)
{
	static char name[17];
	socklen_t l = 16;
	memset(name, 0, sizeof name);
	if (getsockopt(s, IPPROTO_TCP, TCP_CONGESTION, name, &l) < 0)
		return strerror(errno);
	return name;
}

static int set_cc(int s, const char *name)
{
	return setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, name, strlen(name));
}

int main(int argc, char **argv)
{
	int r = peer_args_more(argc, argv, 1, "OTHER");
	if (r)
		return r;
	const char *other = argv[3];

	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || set_cc(s, "reno") < 0)
		die("TCP_CONGESTION reno");
	if (connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	say("reno before the connect: %s", cc(s));
	echo(s, "reno", "a line");
	if (set_cc(s, "cubic") < 0)
		die("TCP_CONGESTION cubic");
	say("cubic on the connection: %s", cc(s));
	echo(s, "cubic", "a line");
	say("an algorithm that does not exist: %s", set_cc(s, "nosuchcc") < 0 ? strerror(errno) : "taken");

	if (strcmp(other, "-")) {
		int o = socket(AF_INET, SOCK_STREAM, 0);
		if (o < 0 || set_cc(o, other) < 0)
			die("TCP_CONGESTION other");
		if (connect(o, (struct sockaddr *)&peer, sizeof peer) < 0)
			die("connect");
		say("%s before the connect: %s", other, cc(o));
		echo(o, other, "a line");
		close(o);
		say("%s on the connection: %s, now %s", other, set_cc(s, other) < 0 ? strerror(errno) : "taken", cc(s));
		echo(s, "after it", "a line");
	}
	close(s);

	int d = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(d, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	say("set nothing: %s", cc(d));
	close(d);
	return 0;
}
