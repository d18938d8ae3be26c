/*
 * nested: an epoll instance that holds an accelerated connection, itself
 * waited on by poll, select and another epoll instance (an event loop
 * embedded in another's: libuv's backend fd, sd-event's), against an
 * echo server at ADDR PORT. It prints what each wait reports, before the
 * echo, once it came, after it was read, and for an echo that comes
 * while the wait blocks (sent by another thread), for a level-triggered,
 * an edge-triggered and a one-shot member, and with a pipe beside it.
 * Under the shim the kernel's epoll fd is readable for its kernel members
 * alone: before, every wait here missed the connection and ran to its
 * timeout.
 *
 * usage: nested ADDR PORT
 */
#define _GNU_SOURCE
#include "conform.h"
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/select.h>

static int conn;

static void *late_send(void *arg)
{
	(void)arg;
	usleep(200000);
	if (send(conn, "z", 1, 0) != 1)
		die("late send");
	return NULL;
}

static int poll_in(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};
	int r = poll(&p, 1, ms);
	return r > 0 ? p.revents : r;
}

static int select_in(int fd, int ms)
{
	fd_set rs;
	FD_ZERO(&rs);
	FD_SET(fd, &rs);
	struct timeval tv = {ms / 1000, ms % 1000 * 1000};
	return select(fd + 1, &rs, NULL, NULL, &tv) > 0 && FD_ISSET(fd, &rs);
}

static int epoll_in(int ep, int ms)
{
	struct epoll_event ev;
	int r = epoll_wait(ep, &ev, 1, ms);
	return r > 0 ? (int)ev.data.u32 : r;
}

/* waits prints what poll, select and the outer instance say of inner. */
static void waits(const char *when, int inner, int outer, int ms)
{
	say("%s: poll %#x, select %d, epoll %d", when, poll_in(inner, ms), select_in(inner, ms), epoll_in(outer, ms));
}

static void consume(int s, int n)
{
	char buf[16];
	if (read_full(s, buf, n) != n)
		die("read");
}

int main(int argc, char **argv)
{
	int r = peer_args(argc, argv);
	if (r)
		return r;
	const uint32_t modes[] = {0, EPOLLET, EPOLLONESHOT};
	const char *names[] = {"level", "edge", "oneshot"};
	for (int m = 0; m < 3; m++) {
		say("-- %s", names[m]);
		conn = dial();
		int inner = epoll_create1(0), outer = epoll_create1(0);
		struct epoll_event ev = {.events = EPOLLIN | modes[m], .data.u32 = 7};
		check("add the connection", epoll_ctl(inner, EPOLL_CTL_ADD, conn, &ev));
		ev = (struct epoll_event){.events = EPOLLIN, .data.u32 = 42};
		check("add the instance", epoll_ctl(outer, EPOLL_CTL_ADD, inner, &ev));
		waits("nothing yet", inner, outer, 100);
		if (send(conn, "x", 1, 0) != 1)
			die("send");
		usleep(100000);
		waits("the echo came", inner, outer, 1000);
		say("inner's own wait: %d", epoll_in(inner, 1000));
		waits("reported, unread", inner, outer, 100);
		consume(conn, 1);
		waits("read", inner, outer, 100);
		if (modes[m] == EPOLLONESHOT) {
			ev = (struct epoll_event){.events = EPOLLIN | EPOLLONESHOT, .data.u32 = 7};
			check("re-arm", epoll_ctl(inner, EPOLL_CTL_MOD, conn, &ev));
		}
		pthread_t t;
		pthread_create(&t, NULL, late_send, NULL);
		say("blocked in the outer wait: %d", epoll_in(outer, 3000));
		pthread_join(t, NULL);
		say("inner's own wait: %d", epoll_in(inner, 1000));
		consume(conn, 1);
		/* A pipe in the inner instance beside the connection. */
		int p[2];
		if (pipe(p) < 0)
			die("pipe");
		ev = (struct epoll_event){.events = EPOLLIN, .data.u32 = 9};
		check("add a pipe", epoll_ctl(inner, EPOLL_CTL_ADD, p[0], &ev));
		if (write(p[1], "p", 1) != 1)
			die("write");
		waits("the pipe written", inner, outer, 1000);
		say("inner's own wait: %d", epoll_in(inner, 1000));
		char c;
		if (read(p[0], &c, 1) != 1)
			die("read the pipe");
		waits("the pipe read", inner, outer, 100);
		close(p[0]);
		close(p[1]);
		close(inner);
		say("the inner instance closed: epoll %d", epoll_in(outer, 100));
		close(outer);
		close(conn);
	}
	return 0;
}
