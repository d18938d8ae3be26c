/*
 * uring: sockets made through the C library and driven through an
 * io_uring instance, made first (liburing): a connection to the echo
 * server at ADDR:PORT sends and receives through the ring; a listener on
 * LPORT, polled once through the C library (so that it passes the
 * interposer), prints "listening" and accepts, receives and answers
 * through the ring. Prints each completion.
 *
 * usage: uring ADDR PORT LPORT
 */
#include <liburing.h>
#include "conform.h"

static struct io_uring ring;

/* complete submits the operation prepared and prints its result (an
 * fd's number, if fd, as "an fd"): the result, or exits if none comes
 * in 3 s. */
static int complete(const char *what, int fd)
{
	io_uring_submit(&ring);
	struct io_uring_cqe *cqe;
	struct __kernel_timespec ts = {.tv_sec = 3};
	int r = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
	if (r < 0) {
		say("%s: no completion in 3 s", what);
		exit(1);
	}
	r = cqe->res;
	io_uring_cqe_seen(&ring, cqe);
	if (fd && r >= 0)
		say("%s: an fd", what);
	else
		say("%s: %d%s%s", what, r, r < 0 ? " " : "", r < 0 ? strerror(-r) : "");
	return r;
}

int main(int argc, char **argv)
{
	int r = peer_args_more(argc, argv, 1, "LPORT");
	if (r)
		return r;
	if ((r = io_uring_queue_init(8, &ring, 0)) < 0) {
		fprintf(stderr, "uring: io_uring_queue_init: %s\n", strerror(-r));
		return 1;
	}
	char buf[64];
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	io_uring_prep_send(io_uring_get_sqe(&ring), s, "hello", 5, MSG_NOSIGNAL);
	complete("send through the ring", 0);
	io_uring_prep_recv(io_uring_get_sqe(&ring), s, buf, sizeof buf, 0);
	complete("recv through the ring", 0);

	int l = socket(AF_INET, SOCK_STREAM, 0);
	listen_on(l, atoi(argv[3]));
	struct pollfd p = {.fd = l, .events = POLLIN};
	poll(&p, 1, 0);
	say("listening");
	io_uring_prep_accept(io_uring_get_sqe(&ring), l, NULL, NULL, 0);
	int c = complete("accept through the ring", 1);
	if (c < 0)
		return 1;
	io_uring_prep_recv(io_uring_get_sqe(&ring), c, buf, sizeof buf, 0);
	int n = complete("recv through the ring", 0);
	if (n <= 0)
		return 1;
	io_uring_prep_send(io_uring_get_sqe(&ring), c, buf, n, MSG_NOSIGNAL);
	complete("send through the ring", 0);
	return 0;
}
