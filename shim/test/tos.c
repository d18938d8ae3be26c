/*
 * tos: IP_TOS and IP_TTL on connections, which the test reads off the
 * wire at the peer: a connection that sets them before connect (its SYN
 * carries them), one that sets them after (its segments before carry
 * the defaults; IP_TOS given as a byte, as ip(7) allows), and a listener
 * that sets them before listen (its connection's, SYN-ACK on, carry
 * them). Each connection writes and reads back from the echo server at
 * ADDR:PORT (conform.h's echo); the listener's connection reads a line
 * and answers "served". Prints what getsockopt reads back.
 *
 * usage: tos ADDR PORT LPORT
 */
#include "conform.h"

static void set(int s, int name, int v)
{
	if (setsockopt(s, IPPROTO_IP, name, &v, sizeof v) < 0)
		die("setsockopt");
}

static void show(const char *what, int s)
{
	int tos = -1, ttl = -1;
	socklen_t l = sizeof tos;
	getsockopt(s, IPPROTO_IP, IP_TOS, &tos, &l);
	l = sizeof ttl;
	getsockopt(s, IPPROTO_IP, IP_TTL, &ttl, &l);
	say("%s: tos %#x ttl %d", what, tos, ttl);
}

int main(int argc, char **argv)
{
	int r = peer_args_more(argc, argv, 1, "LPORT");
	if (r)
		return r;
	int lport = atoi(argv[3]);

	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		die("socket");
	set(s, IP_TOS, 0xb8);
	set(s, IP_TTL, 33);
	if (connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	echo(s, "first", "before connect");
	show("set before connect", s);

	int t = dial();
	echo(t, "second", "defaults");
	unsigned char tos = 0x28;
	if (setsockopt(t, IPPROTO_IP, IP_TOS, &tos, 1) < 0)
		die("setsockopt");
	set(t, IP_TTL, 99);
	echo(t, "second", "set after connect");
	show("set after connect", t);

	int l = socket(AF_INET, SOCK_STREAM, 0);
	set(l, IP_TOS, 0x48);
	set(l, IP_TTL, 77);
	listen_on(l, lport);
	say("listening");
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	show("accepted", c);
	char buf[64];
	if (read(c, buf, sizeof buf) <= 0 || send(c, "served\n", 7, 0) != 7)
		die("serve");
	/* The peer closes first: our FIN's frame is not waited for. */
	if (read(c, buf, sizeof buf) != 0)
		die("the peer's end");
	close(c);
	close(s);
	close(t);
	say("done");
	return 0;
}
