/*
 * cancel: threads cancelled (pthread_cancel) while blocked on a
 * connection (A, which tells the name server at ADDR:PORT its name and
 * then waits for what never comes): in recv (three times), poll, select
 * and epoll_wait, and in accept on a listener; a thread with
 * cancellation off blocks in recv until its SO_RCVTIMEO and is cancelled
 * at its next cancellation point after it turns it on. Then A is closed
 * and the server, asked on a new connection, says whether it read A's
 * end (under the shim each cancelled call held A, and its close sent
 * nothing until the process ended).
 *
 * usage: cancel ADDR PORT
 */
#include "conform.h"
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/select.h>

static int a, l, ep;

static void *in_recv(void *arg)
{
	char b[16];
	(void)arg;
	say("recv returned %zd", recv(a, b, sizeof b, 0));
	return NULL;
}

static void *in_poll(void *arg)
{
	struct pollfd p = {.fd = a, .events = POLLIN};
	(void)arg;
	say("poll returned %d", poll(&p, 1, -1));
	return NULL;
}

static void *in_select(void *arg)
{
	fd_set r;
	FD_ZERO(&r);
	FD_SET(a, &r);
	(void)arg;
	say("select returned %d", select(a + 1, &r, NULL, NULL, NULL));
	return NULL;
}

static void *in_epoll_wait(void *arg)
{
	struct epoll_event ev;
	(void)arg;
	say("epoll_wait returned %d", epoll_wait(ep, &ev, 1, -1));
	return NULL;
}

static void *in_accept(void *arg)
{
	(void)arg;
	say("accept returned %d", accept(l, NULL, NULL));
	return NULL;
}

/* off_then_on blocks in recv with cancellation off until A's receive
 * timeout, then turns it on: the cancellation pending acts at once. */
static void *off_then_on(void *arg)
{
	char b[16];
	(void)arg;
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);
	ssize_t r = recv(a, b, sizeof b, 0);
	say("recv with cancellation off: %zd %s", r, r < 0 ? strerror(errno) : "");
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
	pthread_testcancel();
	say("not cancelled");
	return NULL;
}

/* cancel_in starts fn on a thread, cancels it 100 ms later and says
 * whether it ended cancelled. */
static void cancel_in(const char *what, void *(*fn)(void *))
{
	pthread_t t;
	void *res;
	if (pthread_create(&t, NULL, fn, NULL) != 0)
		die("pthread_create");
	usleep(100 * 1000);
	pthread_cancel(t);
	pthread_join(t, &res);
	say("%s: cancelled %s", what, res == PTHREAD_CANCELED ? "yes" : "no");
}

int main(int argc, char **argv)
{
	int r = peer_args(argc, argv);
	if (r)
		return r;
	a = dial();
	name_conn(a, "A");
	for (int i = 0; i < 3; i++)
		cancel_in("recv", in_recv);
	cancel_in("poll", in_poll);
	cancel_in("select", in_select);
	ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = a};
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, a, &ev) < 0)
		die("epoll");
	cancel_in("epoll_wait", in_epoll_wait);
	l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in any = {.sin_family = AF_INET};
	if (l < 0 || bind(l, (struct sockaddr *)&any, sizeof any) < 0 || listen(l, 8) < 0)
		die("listen");
	cancel_in("accept", in_accept);
	struct timeval tv = {.tv_usec = 300 * 1000};
	setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	cancel_in("recv with cancellation off", off_then_on);
	close(ep);
	close(a);
	ask_end("A");
	return 0;
}
