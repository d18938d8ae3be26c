/*
 * sigfork: signal handlers that call the shim, and forks, beside the
 * shim's own lock and the Go runtime's threads. It talks to a TCP echo
 * server at ADDR PORT (so that the shim's stack is in use) and prints one
 * line per result, the same under the shim as on the kernel:
 *
 *	sigfork ADDR PORT
 *
 * A: a thread signals the main thread every few microseconds while it
 *    makes listeners and polls them (under the shim each poll hands its
 *    listener to the stack); the handler makes and closes an epoll
 *    instance. Run while the shim held its table's lock, the handler took
 *    it again and the thread hung.
 * B: as postgres 15's postmaster: SIGCHLD blocked but in a ppoll, and
 *    the handler reaps each child and forks the next, which makes an
 *    epoll instance and exits 7. A process-directed SIGCHLD went to a Go
 *    runtime thread (which does not block it), whose handler ran beside
 *    the blocked main thread; a child forked there hung.
 * C: the main thread forks children while another thread makes and
 *    closes epoll instances: a child forked while that thread held the
 *    shim's lock started with it held, and hung at its first socket call.
 *
 * A child that is still running after its bound is killed, and counted.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <time.h>

#include "conform.h"

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* child_exit is what each child does: a call that takes the shim's
 * lock, then exit 7. */
static void child_exit(void)
{
	int e = epoll_create1(0);
	if (e >= 0)
		close(e);
	_exit(7);
}

/* ---- A ---- */

static volatile sig_atomic_t a_handled, a_done;
static pthread_t main_thread;

static void on_usr1(int sig)
{
	(void)sig;
	int e = epoll_create1(EPOLL_CLOEXEC);
	if (e >= 0)
		close(e);
	a_handled++;
}

static void *signaller(void *arg)
{
	(void)arg;
	for (int i = 0; i < 200000 && !a_done; i++) {
		pthread_kill(main_thread, SIGUSR1);
		usleep(5);
	}
	return NULL;
}

static void phase_a(void)
{
	struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
	sigaction(SIGUSR1, &sa, NULL);
	main_thread = pthread_self();
	pthread_t t;
	pthread_create(&t, NULL, signaller, NULL);
	int made = 0, polled = 0;
	/* 200 listeners, and on until the handler has run a few times (the
	 * signaller thread may start late), for 10 s at most. */
	double end = now_s() + 10;
	for (int i = 0; i < 200 || (a_handled < 20 && now_s() < end); i++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in sin = {.sin_family = AF_INET};
		if (s < 0 || bind(s, (struct sockaddr *)&sin, sizeof sin) < 0 || listen(s, 4) < 0)
			die("listener");
		made++;
		struct pollfd p = {.fd = s, .events = POLLIN};
		/* Nothing to accept; or a signal came first (the kernel's
		 * poll fails with EINTR even with no timeout). */
		int r = poll(&p, 1, 0);
		if (r == 0 || (r < 0 && errno == EINTR))
			polled++;
		close(s);
	}
	a_done = 1;
	pthread_join(t, NULL);
	signal(SIGUSR1, SIG_IGN);
	say("A: every listener made and polled with nothing to accept: %s; the handler ran: %s",
	    made == polled && made >= 200 ? "yes" : "no", a_handled > 0 ? "yes" : "no");
}

/* ---- B ---- */

#define B_CHILDREN 40

static volatile sig_atomic_t b_reaped, b_sevens, b_forked, b_blocked_now, b_while_blocked, b_elsewhere;
static pid_t b_pids[B_CHILDREN];
static pid_t main_tid;

static void b_fork(void)
{
	pid_t pid = fork();
	if (pid == 0)
		child_exit();
	if (pid > 0)
		b_pids[b_forked++] = pid;
}

static void on_chld(int sig)
{
	(void)sig;
	int saved = errno;
	if (gettid() != main_tid)
		b_elsewhere++;
	if (b_blocked_now)
		b_while_blocked++;
	int st;
	pid_t pid;
	while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
		b_reaped++;
		if (WIFEXITED(st) && WEXITSTATUS(st) == 7)
			b_sevens++;
		if (b_forked < B_CHILDREN)
			b_fork();
	}
	errno = saved;
}

/* reap_stuck kills and reaps the children in pids that are still
 * running: how many there were. */
static int reap_stuck(pid_t *pids, int n)
{
	int stuck = 0;
	for (int i = 0; i < n; i++) {
		if (pids[i] > 0 && waitpid(pids[i], NULL, WNOHANG) == 0) {
			stuck++;
			kill(pids[i], SIGKILL);
			waitpid(pids[i], NULL, 0);
		}
	}
	return stuck;
}

static void phase_b(void)
{
	main_tid = gettid();
	sigset_t chld, unblocked;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, &unblocked);
	sigdelset(&unblocked, SIGCHLD);
	struct sigaction sa = {.sa_handler = on_chld, .sa_flags = SA_RESTART};
	sigemptyset(&sa.sa_mask);
	sigaction(SIGCHLD, &sa, NULL);
	b_fork();
	double end = now_s() + 10;
	while (b_reaped < B_CHILDREN && now_s() < end) {
		/* Work with SIGCHLD blocked, as the postmaster's loop does
		 * (here most of the time, so that children end there), then
		 * wait a moment with it unblocked. */
		b_blocked_now = 1;
		for (double busy = now_s() + 0.002; now_s() < busy;) {
			int s = socket(AF_INET, SOCK_STREAM, 0);
			if (s >= 0)
				close(s);
		}
		b_blocked_now = 0;
		struct timespec ms = {0, 1000000};
		ppoll(NULL, 0, &ms, &unblocked);
	}
	int stuck = reap_stuck(b_pids, b_forked);
	signal(SIGCHLD, SIG_DFL);
	sigprocmask(SIG_UNBLOCK, &chld, NULL);
	say("B: %d children reaped of %d, %d exited 7, %d killed still running", (int)b_reaped, B_CHILDREN, (int)b_sevens,
	    stuck);
	say("B: the handler ran on another thread: %s; while the program blocked SIGCHLD: %s",
	    b_elsewhere ? "yes" : "no", b_while_blocked ? "yes" : "no");
}

/* ---- C ---- */

#define C_CHILDREN 100

static volatile sig_atomic_t c_done;

static void *churner(void *arg)
{
	(void)arg;
	for (int i = 0; i < 10000000 && !c_done; i++) {
		int e = epoll_create1(0);
		if (e >= 0)
			close(e);
	}
	return NULL;
}

static void phase_c(void)
{
	pthread_t t;
	pthread_create(&t, NULL, churner, NULL);
	int sevens = 0, stuck = 0;
	for (int i = 0; i < C_CHILDREN; i++) {
		pid_t pid = fork();
		if (pid == 0)
			child_exit();
		if (pid < 0)
			die("fork");
		int st = 0;
		pid_t r = 0;
		for (double end = now_s() + 2; (r = waitpid(pid, &st, WNOHANG)) == 0 && now_s() < end;)
			usleep(200);
		if (r == 0)
			stuck += reap_stuck(&pid, 1);
		else if (WIFEXITED(st) && WEXITSTATUS(st) == 7)
			sevens++;
	}
	c_done = 1;
	pthread_join(t, NULL);
	say("C: %d children forked beside a thread in the shim, %d exited 7, %d killed still running", C_CHILDREN, sevens,
	    stuck);
}

int main(int argc, char **argv)
{
	if (peer_args(argc, argv))
		return 2;
	int s = dial();
	echo(s, "connected", "hello\n");
	phase_a();
	phase_b();
	phase_c();
	echo(s, "still connected", "again\n");
	close(s);
	say("done");
	return 0;
}
