/*
 * uring: sockets made through the C library and driven through an
 * io_uring instance (liburing): a connection to the echo server at
 * ADDR:PORT sends and receives through the ring; a listener on LPORT,
 * polled once through the C library (so that it passes the interposer),
 * prints "listening" and accepts, receives and answers through the ring.
 * Prints each completion. The ring is made first, or with "late" after
 * the connection has echoed once and the listener has been polled
 * through the C library (under the shim: after both were accelerated)
 * and a client's connection has come to it ("polled", then a line on
 * standard input): the connection echoes through the ring, the queued
 * one is taken with accept(2) and answered through the ring, and after
 * the ring's accept a second connection, made after the ring, echoes
 * through it too. With "late-raw", as "late" with the ring made by the
 * system call through the C library's syscall(2) and mapped by liburing
 * (io_uring_queue_mmap), as a program that makes its own system calls
 * does (Rust's io-uring crate).
 *
 * usage: uring ADDR PORT LPORT [late|late-raw]
 */
#include <liburing.h>
#include <sys/syscall.h>
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

static void make_ring(int raw)
{
	int r;
	if (raw) {
		struct io_uring_params p = {0};
		int fd = syscall(SYS_io_uring_setup, 8, &p);
		if (fd < 0)
			die("io_uring_setup");
		r = io_uring_queue_mmap(fd, &p, &ring);
		/* What io_uring_queue_init does beside: the features, and each
		 * submission slot naming its own entry. */
		ring.features = p.features;
		for (unsigned i = 0; !r && i < p.sq_entries; i++)
			ring.sq.array[i] = i;
	} else {
		r = io_uring_queue_init(8, &ring, 0);
	}
	if (r < 0) {
		fprintf(stderr, "uring: making the ring: %s\n", strerror(-r));
		exit(1);
	}
}

/* echo_ring sends "hello" on s and reads its echo, through the ring. */
static void echo_ring(int s)
{
	char buf[64];
	io_uring_prep_send(io_uring_get_sqe(&ring), s, "hello", 5, MSG_NOSIGNAL);
	complete("send through the ring", 0);
	io_uring_prep_recv(io_uring_get_sqe(&ring), s, buf, sizeof buf, 0);
	complete("recv through the ring", 0);
}

/* answer_ring reads what client c sends and sends it back, through the
 * ring; it exits if nothing comes. */
static void answer_ring(int c)
{
	char buf[64];
	io_uring_prep_recv(io_uring_get_sqe(&ring), c, buf, sizeof buf, 0);
	int n = complete("recv through the ring", 0);
	if (n <= 0)
		exit(1);
	io_uring_prep_send(io_uring_get_sqe(&ring), c, buf, n, MSG_NOSIGNAL);
	complete("send through the ring", 0);
}

int main(int argc, char **argv)
{
	int raw = argc == 5 && !strcmp(argv[4], "late-raw");
	int late = raw || (argc == 5 && !strcmp(argv[4], "late"));
	int r = peer_args_more(argc - late, argv, 1, "LPORT [late|late-raw]");
	if (r)
		return r;
	if (!late)
		make_ring(0);
	char buf[64];
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&peer, sizeof peer) < 0)
		die("connect");
	if (late) {
		check("send", send(s, "hello", 5, MSG_NOSIGNAL));
		check("recv", read_full(s, buf, 5));
	} else {
		echo_ring(s);
	}

	int l = socket(AF_INET, SOCK_STREAM, 0);
	listen_on(l, atoi(argv[3]));
	struct pollfd p = {.fd = l, .events = POLLIN};
	poll(&p, 1, 0);
	if (late) {
		/* A connection comes to the listener now, and waits in its
		 * queue (the stack's, under the shim) as the ring is made. */
		say("polled");
		if (!fgets(buf, sizeof buf, stdin))
			die("stdin");
		make_ring(raw);
		say("ring made");
		echo_ring(s);
		int q = accept(l, NULL, NULL);
		if (q < 0)
			die("accept");
		say("accepted the queued connection");
		answer_ring(q);
	}
	say("listening");
	io_uring_prep_accept(io_uring_get_sqe(&ring), l, NULL, NULL, 0);
	int c = complete("accept through the ring", 1);
	if (c < 0)
		return 1;
	answer_ring(c);
	if (late) {
		int s2 = socket(AF_INET, SOCK_STREAM, 0);
		if (s2 < 0 || connect(s2, (struct sockaddr *)&peer, sizeof peer) < 0)
			die("connect");
		say("connected after the ring");
		echo_ring(s2);
	}
	return 0;
}
