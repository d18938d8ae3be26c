/*
 * pollherd: threads that each wait in poll() on a connection of their
 * own and a pipe (a kernel fd), as a thread pool with a wake-up pipe
 * does (TestShimPollHerd). One thread echoes ROUNDS lines through the
 * echo server at ADDR:PORT; the others wait. On the kernel a line's
 * arrival wakes the one thread whose connection it came on; the waiting
 * threads are not woken. Under the shim a wait with kernel fds in it
 * once blocked in ppoll with the stack's AF_XDP socket beside them, so
 * that every frame woke every such thread. Then each waiting thread is
 * woken through its pipe, and echoes a line through its connection.
 *
 * It prints the waiting threads' wake-ups (voluntary context switches)
 * a round trip, as "under 1" or the figure, and what each thread did.
 *
 *	pollherd ADDR PORT THREADS ROUNDS
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include "conform.h"

#define MAXT 32

static int nthreads, rounds;
static int conns[MAXT], pipes[MAXT][2];
static pid_t tids[MAXT];
static int ready, echoed;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

/* wait_conn polls conn and pipe until one is readable: 1 for the
 * connection, 2 for the pipe, -1 on an error. */
static int wait_conn(int i)
{
	struct pollfd p[2] = {{.fd = conns[i], .events = POLLIN}, {.fd = pipes[i][0], .events = POLLIN}};
	for (;;) {
		int r = poll(p, 2, 10000);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		if (p[1].revents & POLLIN)
			return 2;
		if (p[0].revents)
			return 1;
	}
}

/* echo_line sends a line on thread i's connection and reads it back. */
static int echo_line(int i, const char *line)
{
	size_t n = strlen(line);
	char buf[64];
	if (send(conns[i], line, n, 0) != (ssize_t)n)
		return -1;
	size_t got = 0;
	while (got < n) {
		if (wait_conn(i) != 1)
			return -1;
		ssize_t r = recv(conns[i], buf + got, n - got, MSG_DONTWAIT);
		if (r <= 0 && !(r < 0 && errno == EAGAIN))
			return -1;
		if (r > 0)
			got += r;
	}
	return memcmp(buf, line, n) == 0 ? 0 : -1;
}

static void *run(void *arg)
{
	int i = (int)(long)arg;
	tids[i] = (pid_t)syscall(SYS_gettid);
	conns[i] = dial();
	/* The first echo on each connection: every socket is in use (under
	 * the shim, on the stack) before the counting starts. */
	int ok = echo_line(i, "hello\n") == 0;
	pthread_mutex_lock(&mu);
	ready++;
	pthread_cond_broadcast(&cv);
	pthread_mutex_unlock(&mu);
	if (i == 0)
		return (void *)(long)ok;
	/* A waiting thread: woken by its pipe alone. */
	int w = wait_conn(i);
	char c;
	if (w != 2 || read(pipes[i][0], &c, 1) != 1 || echo_line(i, "piped\n") < 0)
		ok = 0;
	pthread_mutex_lock(&mu);
	echoed += ok;
	pthread_mutex_unlock(&mu);
	return (void *)(long)ok;
}

/* switches is thread tid's voluntary context switches so far. */
static long switches(pid_t tid)
{
	char path[64], line[128];
	snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
	FILE *f = fopen(path, "r");
	long v = -1;
	if (!f)
		return -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "voluntary_ctxt_switches: %ld", &v) == 1)
			break;
	fclose(f);
	return v;
}

int main(int argc, char **argv)
{
	int r = peer_args_more(argc, argv, 2, "THREADS ROUNDS");
	if (r)
		return r;
	nthreads = atoi(argv[3]);
	rounds = atoi(argv[4]);
	if (nthreads < 2 || nthreads > MAXT || rounds < 1 || rounds > 1000000) {
		fprintf(stderr, "pollherd: THREADS must be 2 to %d and ROUNDS 1 to 1000000\n", MAXT);
		return 2;
	}
	pthread_t th[MAXT];
	for (int i = 0; i < nthreads; i++) {
		if (pipe2(pipes[i], O_CLOEXEC) < 0)
			die("pipe");
	}
	/* Thread 0 is this one's echoes, run here after the others wait. */
	for (int i = 1; i < nthreads; i++)
		if (pthread_create(&th[i], NULL, run, (void *)(long)i) != 0)
			die("pthread_create");
	int first = run((void *)0L) != NULL;
	pthread_mutex_lock(&mu);
	while (ready < nthreads)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	usleep(100000); /* the waiting threads blocked */
	long before = 0, after = 0;
	for (int i = 1; i < nthreads; i++)
		before += switches(tids[i]);
	int ok = first;
	for (int n = 0; n < rounds && ok; n++)
		ok = echo_line(0, "ping\n") == 0;
	for (int i = 1; i < nthreads; i++)
		after += switches(tids[i]);
	double per = (double)(after - before) / rounds;
	if (per < 1)
		say("waiting threads' wake-ups a round trip: under 1");
	else
		say("waiting threads' wake-ups a round trip: %.2f (%ld in %d round trips of thread 0, %d threads waiting)", per,
		    after - before, rounds, nthreads - 1);
	say("thread 0: %s", ok ? "every line echoed" : "an echo failed");
	for (int i = 1; i < nthreads; i++)
		if (write(pipes[i][1], "x", 1) != 1)
			die("write");
	for (int i = 1; i < nthreads; i++)
		pthread_join(th[i], NULL);
	say("%d of %d waiting threads woken by their pipe echoed", echoed, nthreads - 1);
	return 0;
}
