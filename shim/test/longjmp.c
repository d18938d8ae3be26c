/*
 * longjmp: a signal handler that leaves a blocked call with siglongjmp,
 * as programs that time their reads out with an alarm do. A connection
 * to the name server at ADDR:PORT (named "A.pid", as closeall.c's) blocks
 * in recv, then in poll, each until SIGALRM's handler jumps out; then a
 * recv with a receive timeout ends by itself, and the program prints its
 * thread's cancellation state, closes the connection and asks the server
 * whether it read the end. Before, under the shim, each jump left the
 * call's hold on the socket: the close sent no FIN until the process
 * ended.
 *
 * usage: longjmp ADDR PORT
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/time.h>
#include "conform.h"

static sigjmp_buf env;

static void on_alarm(int sig)
{
	(void)sig;
	siglongjmp(env, 1);
}

static void alarm_in(long ms)
{
	struct itimerval it = {.it_value = {.tv_sec = ms / 1000, .tv_usec = ms % 1000 * 1000}};
	setitimer(ITIMER_REAL, &it, NULL);
}

int main(int argc, char **argv)
{
	int r = peer_args(argc, argv);
	if (r)
		return r;
	struct sigaction sa = {.sa_handler = on_alarm};
	sigaction(SIGALRM, &sa, NULL);

	int a = dial();
	name_conn(a, "A");
	if (sigsetjmp(env, 1) == 0) {
		alarm_in(200);
		char c;
		say("recv returned %zd: the alarm did not jump", recv(a, &c, 1, 0));
		return 1;
	}
	say("jumped out of recv");
	if (sigsetjmp(env, 1) == 0) {
		alarm_in(200);
		struct pollfd p = {.fd = a, .events = POLLIN};
		say("poll returned %d: the alarm did not jump", poll(&p, 1, -1));
		return 1;
	}
	say("jumped out of poll");
	struct timeval tv = {.tv_usec = 300 * 1000};
	setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	char c;
	check("recv with a timeout", recv(a, &c, 1, 0));
	int was;
	pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &was);
	say("cancellation %s", was == PTHREAD_CANCEL_ENABLE ? "enabled" : "disabled");
	close(a);

	ask_end("A");
	return 0;
}
