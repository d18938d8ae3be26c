/*
 * ends: a program that ends without closing its sockets, as a program
 * killed by a signal or ending with _exit does (TestShimEnds).
 *
 *   ends ADDR PORT HOW SIG
 *
 * It opens two connections to ADDR:PORT and tags each with its first
 * byte: on 'D' it then writes BYTES bytes of a pattern (byte i is
 * (i * 7 + 3) & 0xff); on 'U' it reads nothing, and waits until the
 * server's bytes have come in unread. It prints how it sees signal SIG's
 * disposition ("SIG disposition default", or "... handled" or
 * "... ignored"; nothing for SIG 0), then "ready", and ends by HOW:
 *
 *   wait    waits (at most 30 s, then exits 3) for a signal from outside
 *   busy    goes on writing the pattern (at most 30 s) until a signal
 *           from outside comes, most likely while it is in a send
 *   raise   raises SIG itself, its data perhaps still on its way
 *   _exit   calls _exit(7)
 *   closed  closes the 'D' connection, its data perhaps still on its
 *           way, and calls exit(7) (the 'U' one stays open)
 *   forked  waits until its peer has acknowledged everything (nothing
 *           is left to deliver), forks a child and calls exit(7); the
 *           child, 300 ms on,
 *           writes FORKED more bytes of the pattern on 'D', closes it and
 *           calls _exit(0), holding 'U' to its end
 *   oneshot sets, before its first socket, a one-shot handler for SIG
 *           (SA_RESETHAND) that raises SIG again, as node's for SIGTERM
 *           and SIGINT; then waits as wait does
 *   pipe    opens a third connection, tagged 'S', shuts down its sending
 *           side and writes on it: the write's SIGPIPE (SIG 13) ends it
 *   kpipe   writes to a pipe whose reader has gone (a kernel fd): the
 *           write's SIGPIPE (SIG 13) ends it
 *   fault   writes through a null pointer: SIGSEGV (SIG 11) ends it
 *   abort   calls abort(): SIGABRT (SIG 6) ends it
 *   report  sets, before its first socket, a handler for SIGSEGV (SIG
 *           11) as redis's crash report does, then faults as fault
 *           does: the handler resets the default and sends the signal
 *           to the process (kill), and the fault comes again as it
 *           returns
 *
 * (fault, abort and report leave no core file.)
 *
 * It closes neither socket (but as HOW says). On the kernel the process's end closes
 * them: the 'D' peer reads every byte and then the end (a FIN), the 'U'
 * peer gets a reset (unread data), and a signal's default action ends
 * the process with that signal.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BYTES (4 << 20)
#define FORKED 4096

static void raise_again(int sig)
{
	raise(sig); /* the default, since the handler was one-shot */
}

static void report(int sig, siginfo_t *si, void *uc)
{
	(void)si, (void)uc;
	static const char msg[] = "ends: crashed, reporting\n";
	write(2, msg, sizeof msg - 1);
	struct sigaction dfl = {.sa_handler = SIG_DFL, .sa_flags = SA_NODEFER | SA_ONSTACK | SA_RESETHAND};
	sigemptyset(&dfl.sa_mask);
	sigaction(sig, &dfl, NULL);
	kill(getpid(), sig);
}

static int dial(const struct sockaddr_in *peer, char tag)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (const struct sockaddr *)peer, sizeof *peer) < 0 || write(fd, &tag, 1) != 1) {
		perror("ends: connect");
		exit(1);
	}
	return fd;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: ends ADDR PORT wait|busy|raise|_exit|closed|forked|pipe|kpipe|oneshot|fault|abort|report SIG\n");
		return 2;
	}
	struct sockaddr_in peer = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &peer.sin_addr) != 1) {
		fprintf(stderr, "ends: bad address %s\n", argv[1]);
		return 2;
	}
	const char *how = argv[3];
	int sig = atoi(argv[4]);

	if (strcmp(how, "oneshot") == 0) {
		struct sigaction a = {.sa_handler = raise_again, .sa_flags = SA_RESETHAND};
		sigemptyset(&a.sa_mask);
		if (sigaction(sig, &a, NULL) < 0) {
			perror("ends: sigaction");
			return 1;
		}
	}
	if (strcmp(how, "report") == 0) {
		struct sigaction a = {.sa_sigaction = report, .sa_flags = SA_NODEFER | SA_RESETHAND | SA_SIGINFO};
		sigemptyset(&a.sa_mask);
		if (sigaction(sig, &a, NULL) < 0) {
			perror("ends: sigaction");
			return 1;
		}
	}
	int unread = dial(&peer, 'U');
	int data = dial(&peer, 'D');
	static unsigned char buf[BYTES];
	for (int i = 0; i < BYTES; i++)
		buf[i] = (i * 7 + 3) & 0xff;
	for (int off = 0; off < BYTES;) {
		ssize_t n = write(data, buf + off, BYTES - off);
		if (n <= 0) {
			perror("ends: write");
			return 1;
		}
		off += n;
	}
	struct pollfd p = {.fd = unread, .events = POLLIN};
	if (poll(&p, 1, 10000) != 1) {
		fprintf(stderr, "ends: the server's bytes did not come\n");
		return 1;
	}

	if (sig > 0) {
		struct sigaction cur;
		if (sigaction(sig, NULL, &cur) < 0) {
			perror("ends: sigaction");
			return 1;
		}
		printf("%d disposition %s\n", sig,
		       cur.sa_handler == SIG_DFL ? "default" : cur.sa_handler == SIG_IGN ? "ignored" : "handled");
	}
	printf("ready\n");
	fflush(stdout);

	if (strcmp(how, "pipe") == 0) {
		int shut = dial(&peer, 'S');
		if (shutdown(shut, SHUT_WR) < 0) {
			perror("ends: shutdown");
			return 1;
		}
		ssize_t n = write(shut, "x", 1);
		fprintf(stderr, "ends: a write after shutdown returned %zd (%s)\n", n, strerror(errno));
	} else if (strcmp(how, "kpipe") == 0) {
		int pp[2];
		if (pipe(pp) < 0 || close(pp[0]) < 0) {
			perror("ends: pipe");
			return 1;
		}
		ssize_t n = write(pp[1], "x", 1);
		fprintf(stderr, "ends: a write to a pipe with no reader returned %zd (%s)\n", n, strerror(errno));
	} else if (strcmp(how, "fault") == 0 || strcmp(how, "abort") == 0 || strcmp(how, "report") == 0) {
		struct rlimit none = {0, 0};
		setrlimit(RLIMIT_CORE, &none);
		if (how[0] == 'a')
			abort();
		/* Null, where the compiler cannot see it: a write through a
		 * literal null pointer may compile to a trap (SIGILL). */
		*(volatile int *)(uintptr_t)(sig - SIGSEGV) = 1;
	} else if (strcmp(how, "raise") == 0) {
		raise(sig);
	} else if (strcmp(how, "_exit") == 0) {
		_exit(7);
	} else if (strcmp(how, "closed") == 0) {
		close(data);
		exit(7);
	} else if (strcmp(how, "forked") == 0) {
		struct tcp_info ti;
		for (int i = 0, quiet = 0; i < 10000 && quiet < 3; i++) {
			socklen_t l = sizeof ti;
			quiet = getsockopt(data, IPPROTO_TCP, TCP_INFO, &ti, &l) == 0 && ti.tcpi_unacked == 0 ? quiet + 1 : 0;
			usleep(1000);
		}
		pid_t p = fork();
		if (p < 0) {
			perror("ends: fork");
			return 1;
		}
		if (p > 0)
			exit(7);
		usleep(300000);
		int r = write(data, buf + BYTES % 256, FORKED) == FORKED ? 0 : 1;
		if (r)
			perror("ends: the child's write");
		close(data);
		_exit(r);
	} else if (strcmp(how, "busy") == 0) {
		time_t end = time(NULL) + 30;
		for (long off = BYTES; time(NULL) < end;) {
			ssize_t n = write(data, buf + off % 256, 65536); /* the pattern's period */
			if (n <= 0) {
				perror("ends: write");
				return 1;
			}
			off += n;
		}
	} else if (strcmp(how, "wait") == 0 || strcmp(how, "oneshot") == 0) {
		for (int i = 0; i < 300; i++)
			usleep(100000);
	} else {
		fprintf(stderr, "ends: HOW is wait, busy, raise, _exit, closed, forked, pipe, kpipe, oneshot, fault, abort or report, not %s\n", how);
		return 2;
	}
	fprintf(stderr, "ends: still running after %s\n", how);
	return 3;
}
