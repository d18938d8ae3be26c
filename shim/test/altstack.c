/*
 * altstack: threads that share one signal stack, as varnish's worker
 * threads do (one 80 KiB buffer, installed by each thread for a SIGSEGV
 * handler that only reports and ends the process): THREADS threads each
 * set it, connect to the echo server at ADDR:PORT and echo ROUNDS lines,
 * then report whether every echo came back and whether their handler's
 * signal (SIGUSR1, SA_ONSTACK, sent to each thread once its echoes are
 * done, one at a time) ran on an alternate stack. Prints the same under
 * the shim as on the kernel. Under the shim the Go runtime's handlers run
 * on the thread's signal stack too, on many threads at once (its
 * preemption signal; GOGC=1 makes the collector send it often): on the
 * program's shared stack they ended the process.
 *
 * WHEN says when each thread sets the shared stack: "first", before its
 * first socket call (as varnish's threads do as they start), or "later",
 * after its first echo (its first call into the stack under the shim, as
 * a thread that sets it again does: varnish's, as they end). Each thread
 * reads the stack back (sigaltstack) and reports whether it is the one it
 * set.
 *
 *	altstack ADDR PORT THREADS ROUNDS first|later
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include "conform.h"

static char shared[80 << 10];
static int rounds, later;
static volatile sig_atomic_t on_alt[64], done[64], saw[64];

static void usr1(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)si;
	stack_t ss;
	if (sigaltstack(NULL, &ss) == 0)
		on_alt[si->si_value.sival_int] = (ss.ss_flags & SS_ONSTACK) ? 1 : -1;
	(void)uc;
}

struct arg {
	int i, ok;
	pthread_t t;
};

static void *run(void *p)
{
	struct arg *a = p;
	stack_t ss = {.ss_sp = shared, .ss_size = sizeof shared}, q;
	if (!later && sigaltstack(&ss, NULL) < 0)
		die("sigaltstack");
	int s = dial();
	char line[32], back[32];
	a->ok = 1;
	for (int r = 0; r < rounds && a->ok; r++) {
		int n = snprintf(line, sizeof line, "thread %d round %d\n", a->i, r);
		a->ok = send(s, line, n, 0) == n && read_full(s, back, n) == n && !memcmp(line, back, n);
		if (later && r == 0 && sigaltstack(&ss, NULL) < 0)
			die("sigaltstack");
	}
	saw[a->i] = sigaltstack(NULL, &q) == 0 && q.ss_sp == shared && q.ss_size == sizeof shared && !(q.ss_flags & SS_DISABLE);
	close(s);
	done[a->i] = 1;
	/* Wait for the handler's signal before the thread ends. */
	for (int k = 0; k < 5000 && !on_alt[a->i]; k++)
		usleep(1000);
	return NULL;
}

int main(int argc, char **argv)
{
	int r = peer_args_more(argc, argv, 3, "THREADS ROUNDS first|later");
	if (r)
		return r;
	int n = atoi(argv[3]);
	rounds = atoi(argv[4]);
	later = !strcmp(argv[5], "later");
	if (n < 1 || n > 64 || rounds < 1 || (!later && strcmp(argv[5], "first")))
		return 2;
	struct sigaction sa = {.sa_sigaction = usr1, .sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART};
	sigaction(SIGUSR1, &sa, NULL);
	struct arg a[64];
	for (int i = 0; i < n; i++) {
		a[i].i = i;
		if (pthread_create(&a[i].t, NULL, run, &a[i]) != 0)
			die("pthread_create");
	}
	int bad = 0, onalt = 0, sawn = 0;
	for (int i = 0; i < n; i++) {
		/* One at a time: the program's own handlers never share it. */
		union sigval v = {.sival_int = i};
		for (int k = 0; k < 30000 && !done[i]; k++)
			usleep(1000);
		for (int k = 0; k < 5000 && done[i] && !on_alt[i]; k++) {
			if (k % 100 == 0)
				pthread_sigqueue(a[i].t, SIGUSR1, v);
			usleep(1000);
		}
		pthread_join(a[i].t, NULL);
		bad += !a[i].ok;
		onalt += on_alt[i] == 1;
		sawn += saw[i];
	}
	say("%d threads: %d echoed every line, %d ran their handler on an alternate stack, %d read back the stack they set", n, n - bad,
	    onalt, sawn);
	return 0;
}
