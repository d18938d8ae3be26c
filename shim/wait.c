/* wait.c: waiting: spin on the stack, then block in the kernel on the
 * thread's eventfd beside the program's own fds (see shim.h). */
#include "shim.h"

/* ---- waiting ---------------------------------------------------------- */

pthread_key_t thread_key;
__thread int t_efd = -1;
/* The thread's own epoll set for blocking in epoll_wait (wait_block):
 * its eventfd, the stack's interrupt fd (EPOLLEXCLUSIVE) and the
 * program's epoll fd t_ep_prog of instance t_ep_gen. */
__thread int t_ep = -1;
__thread int t_ep_prog = -1;
static __thread uint32_t t_ep_gen;
uint32_t epoll_gen; /* numbers the epoll instances (fdent.epgen) */

/* waiter_threads counts the threads that have waited on the stack, with
 * a timeout other than 0 (t_waiter): with two or more, a spinner yields
 * (SPIN_YIELD_NS). */
int waiter_threads;
__thread char t_waiter;

__thread char t_keyed; /* thread_ends ran */

__thread struct undo *t_undo;
__thread int t_coff, t_cancel_was;

/* run_undo lets go of what the thread's calls hold (the undo list), as a
 * cancellation unwinds it out of a CANCEL_POINT. */
void run_undo(void *unused)
{
	(void)unused;
	while (t_undo) {
		struct undo *u = t_undo;
		t_undo = u->next;
		u->fn(u->arg);
	}
	t_coff = 0;
}

void thread_exit(void *p)
{
	(void)p;
	/* A thread that sends and ends (a worker's last answer) gives its
	 * kick as it goes, where the stack's Sleeper would give it only at
	 * its 1 ms bound (and was seen not to for seconds, before
	 * interrupts.Sleeper.TimerSet's second look). */
	if (kick_owed) {
		kick_owed = 0;
		if (core_state == 1 && !after_fork)
			CORE_VOID(core.kick());
	}
	if (t_efd >= 0) {
		/* No wake may write the number once it is closed: it could
		 * name the program's next file. */
		if (core_state == 1 && !after_fork)
			CORE_VOID(core.forget_efd(t_efd));
		real_close(t_efd);
	}
	if (t_waiter) {
		t_waiter = 0;
		__atomic_sub_fetch(&waiter_threads, 1, __ATOMIC_RELAXED);
	}
	if (t_ep >= 0)
		real_close(t_ep);
	t_efd = t_ep = t_ep_prog = -1;
	if (t_tee[0] >= 0) {
		real_close(t_tee[0]);
		real_close(t_tee[1]);
		t_tee[0] = t_tee[1] = -1;
	}
	if (t_alt) {
		/* The core counted the thread at its first call (onl_thread).
		 * t_alt stays set through the call: core_enter would count
		 * the thread again. */
		if (core_state == 1 && !after_fork)
			CORE_VOID(core.thread_gone());
		t_alt = 0;
	}
	stack_t ss;
	if (t_alt_mem && real_sigaltstack(NULL, &ss) == 0) {
		/* Ours goes, taken down first if it is installed (the program
		 * may have put another in its place since: its own again, as
		 * varnish's thread does as it ends), and kept if a handler
		 * runs on it now. */
		int installed = ss.ss_sp == t_alt_mem;
		if (installed && !(ss.ss_flags & SS_ONSTACK)) {
			ss.ss_flags = SS_DISABLE;
			installed = real_sigaltstack(&ss, NULL) != 0;
		}
		if (!installed)
			munmap(t_alt_mem, ALTSTACK);
	}
	t_alt_mem = NULL;
}

/* The kernel's SS_AUTODISARM (Linux 4.7), which the C library's headers
 * may not name. */
#define SS_AUTODISARM_FLAG (1u << 31)

/* t_prog_ss is the signal stack the program last set (or had) on a
 * thread whose own is the shim's: what sigaltstack reports to it. */
static __thread stack_t t_prog_ss = {.ss_flags = SS_DISABLE};

/* thread_altstack runs at a thread's first call into the core: the core
 * counts the thread (onl_thread, until thread_exit's onl_thread_gone)
 * and the thread gets a signal stack. */
static void install_altstack(void)
{
	stack_t ss;
	if (real_sigaltstack(NULL, &ss) < 0)
		return;
	if (!(ss.ss_flags & SS_DISABLE)) {
		if (ss.ss_flags & SS_ONSTACK)
			return; /* the program's, in use now */
		/* The program's own stands aside: the Go runtime's handlers
		 * (its preemption signal, 2,000 a second under load) run on
		 * it too, and need room and a stack of the thread's own.
		 * varnish gives every worker thread the same 80 KiB, for its
		 * SIGSEGV handler: two threads' preemption signals at once
		 * there ended its worker process. The program's handlers run
		 * on ours. */
		static int said;
		if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
			debugf("the program's own signal stacks (%zu KiB on the first thread found with one) stand aside on "
			       "its threads that call the stack: the shim's (%d KiB a thread) stand in, for the Go "
			       "runtime's handlers and the program's",
			       ss.ss_size >> 10, ALTSTACK >> 10);
	}
	void *m = mmap(NULL, ALTSTACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (m == MAP_FAILED)
		return;
	stack_t prog = ss;
	ss = (stack_t){.ss_sp = m, .ss_size = ALTSTACK};
	if (real_sigaltstack(&ss, NULL) < 0) {
		munmap(m, ALTSTACK);
		return;
	}
	t_prog_ss = prog;
	t_alt_mem = m;
	thread_ends();
}

/* sigaltstack: on a thread whose signal stack is the shim's (t_alt_mem),
 * the program's own stays aside: a stack it sets is recorded and
 * reported back (t_prog_ss), and the shim's stays installed, with the
 * program's handlers running on it. varnish's threads each set the one
 * stack they share as they start and again as they end; one that set it
 * after its first call into the stack put the Go runtime's handlers back
 * on it, on many threads at once. While a handler runs on the shim's
 * stack, the stack reported is the one in use, as the kernel reports
 * it. Elsewhere the call is the C library's. */
EXPORT int sigaltstack(const stack_t *ss, stack_t *old)
{
	stack_t cur;
	if (!t_alt_mem || real_sigaltstack(NULL, &cur) < 0 || cur.ss_sp != t_alt_mem)
		return real_sigaltstack(ss, old);
	int onstack = cur.ss_flags & SS_ONSTACK;
	if (ss) {
		if (onstack) {
			errno = EPERM;
			return -1;
		}
		if ((unsigned)ss->ss_flags & ~(SS_DISABLE | SS_AUTODISARM_FLAG)) {
			errno = EINVAL;
			return -1;
		}
		if (!(ss->ss_flags & SS_DISABLE) && ss->ss_size < (size_t)MINSIGSTKSZ) {
			errno = ENOMEM;
			return -1;
		}
	}
	stack_t was = onstack ? cur : t_prog_ss;
	if (ss)
		t_prog_ss = *ss;
	if (old)
		*old = was;
	return 0;
}

void thread_altstack(void)
{
	t_alt = 1;
	thread_ends(); /* thread_exit uncounts it */
	/* The stack first: the thread's first call into Go installs the
	 * runtime's own 32 KiB signal stack on a thread that has none, and
	 * this one was then never installed. */
	install_altstack();
	in_core = 1;
	core.thread(log_file ? log_write : NULL);
	in_core = 0;
}

static int thread_efd(void)
{
	if (t_efd < 0) {
		t_efd = fd_high(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
		thread_ends();
	}
	return t_efd;
}

/* thread_ep is the thread's epoll set with the program's epoll fd epfd
 * in it (epfd -1: a wait on the stack alone, the program's out of it),
 * or -1 (the caller blocks with ppoll). The stack's interrupt fd joins
 * it for each block (wait_block). The program's epoll fd is registered
 * again when the thread waits on another one, or on a new instance under
 * the same number (epgen). */
static int thread_ep(int epfd)
{
	struct fdent *ee = NULL;
	if (epfd >= 0 && (!(ee = ent(epfd)) || ee->kind != K_EPOLL))
		return -1;
	if (t_ep < 0) {
		int efd = thread_efd();
		if (efd < 0 || (t_ep = fd_high(real_epoll_create1(EPOLL_CLOEXEC))) < 0)
			return t_ep = -1;
		struct epoll_event a = {.events = EPOLLIN, .data.fd = efd};
		struct epoll_event c = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = remote_fd};
		if (real_epoll_ctl(t_ep, EPOLL_CTL_ADD, efd, &a) < 0 ||
		    (remote_fd >= 0 && real_epoll_ctl(t_ep, EPOLL_CTL_ADD, remote_fd, &c) < 0)) {
			real_close(t_ep);
			return t_ep = -1;
		}
	}
	if (!ee) {
		if (t_ep_prog >= 0)
			real_epoll_ctl(t_ep, EPOLL_CTL_DEL, t_ep_prog, NULL);
		t_ep_prog = -1;
		return t_ep;
	}
	if (t_ep_prog != epfd || t_ep_gen != ee->epgen) {
		if (t_ep_prog >= 0)
			real_epoll_ctl(t_ep, EPOLL_CTL_DEL, t_ep_prog, NULL);
		struct epoll_event c = {.events = EPOLLIN, .data.fd = epfd};
		if (real_epoll_ctl(t_ep, EPOLL_CTL_ADD, epfd, &c) < 0 && errno != EEXIST) {
			t_ep_prog = -1;
			return -1;
		}
		t_ep_prog = epfd;
		t_ep_gen = ee->epgen;
	}
	return t_ep;
}

int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

short to_poll(int ev)
{
	short r = 0;
	if (ev & ONL_READABLE) r |= POLLIN | POLLRDNORM;
	if (ev & ONL_WRITABLE) r |= POLLOUT | POLLWRNORM;
	if (ev & ONL_ERROR) r |= POLLERR;
	if (ev & ONL_HANGUP) r |= POLLHUP;
	if (ev & ONL_RDHUP) r |= POLLRDHUP;
	return r;
}

int from_poll(short ev)
{
	int r = 0;
	if (ev & (POLLIN | POLLRDNORM | POLLRDHUP)) r |= ONL_READABLE;
	if (ev & (POLLOUT | POLLWRNORM)) r |= ONL_WRITABLE;
	if (ev & POLLRDHUP) r |= ONL_RDHUP;
	return r;
}

/* Whether a blocking call a signal interrupted restarts: set (by
 * on_signal) when a handler without SA_RESTART runs on the thread, so
 * the call fails with EINTR as the kernel's would. */
__thread int sig_norestart;

/* t_handled counts the program's handlers run on the thread: a wait that
 * a signal interrupted tells by it whether the signal was the program's
 * (EINTR) or the Go runtime's (a wake-up like any). */
__thread unsigned t_handled;

/* SPIN_YIELD_NS: in a program with more than one thread that waits on
 * the stack (waiter_threads), a spinning thread yields its processor as it
 * starts to spin and then this often (sched_yield, which returns at once
 * when nothing else is runnable there). A spinner otherwise keeps the
 * processor for the scheduler's whole slice, a millisecond or more,
 * while the thread it woke (whose socket its poll made ready) waits for
 * one: memcached -t 2 under mcping on two CPUs had 1-4% of its gets take
 * over 1.1 ms, against 0.1% on the kernel, and its p99 was 0.7-1.8 ms.
 * Yielding at the spin's start took the p99 to 0.4-0.6 of that, the gets
 * a second unchanged (docs/SHIM-PERFORMANCE.md). A program with one such
 * thread (redis, sockperf, an nginx worker) wakes no sibling, and does
 * not yield: redis lost a few per cent to it. */
#define SPIN_YIELD_NS 20000

/* flush_kicks hands the NIC what this thread's sends left for a kick. */
static inline void flush_kicks(void)
{
	if (kick_owed) {
		kick_owed = 0;
		CORE_VOID(core.kick());
	}
}

/* keep_p: a thread that waits on the stack has its Go processor go
 * through the scheduler (onl_resched) every few milliseconds. The Go
 * runtime's monitor (sysmon) takes a processor back from a thread in C
 * once the processor has run no goroutine for 10 ms, and a thread that
 * comes in from C runs none: from then on it lost its processor at
 * nearly every wait, and its next call took one again and woke the
 * monitor (onl_resched has the figures). The turn costs the thread
 * about 40 us here, so it is taken where the thread would block anyway
 * (wait_block, RESCHED_IDLE_NS after the last), and by a thread that
 * does not block only at the start of a wait RESCHED_BUSY_NS after the
 * last, below the 10 ms with room for the monitor's own tick. A wait in
 * a signal handler leaves it to the thread's next wait outside one: the
 * turn blocks the thread until the runtime hands its processor back. */
#define RESCHED_IDLE_NS 5000000
static __thread int64_t t_resched;

void keep_p(int64_t now, int64_t every)
{
	if (now - t_resched >= every && core_state == 1 && !after_fork && !in_handler) {
		t_resched = now;
		CORE_VOID(core.resched());
	}
}

/* A thread among others that block on the stack takes the stack's
 * interrupt in its blocks (direct, in wait_block) only while its wakes
 * by it are of use to it: the interrupt wakes one thread of those that
 * wait on it (EPOLLEXCLUSIVE), the one that has waited longest, and a
 * thread whose connections are idle has waited longest. Woken for a
 * frame of another thread's, it polled the stack, woke that thread
 * through its eventfd and blocked again: two wake-ups a frame where one
 * does (TestShimPollHerd: 1.03 a round trip of one thread's seven
 * waiting). After IDLE_WAKES_MAX such wakes in a row it blocks on its
 * eventfd alone, which whoever polls the stack writes when its sockets
 * turn ready, and takes the interrupt again from then on.
 * t_irq_woke: the thread's last block ended by the interrupt, and no
 * wait has ended since (a wait that ends made it of use); t_idle_wakes:
 * the interrupt's wakes in a row that did not end the thread's wait. */
#define IDLE_WAKES_MAX 4
static __thread char t_irq_woke;
static __thread unsigned char t_idle_wakes;

/* wait_begin_spin is wait_begin, spinning only if spin. */
static void wait_begin_spin(struct wait *w, int64_t timeout_ns, int spin)
{
	if (t_irq_woke)
		t_irq_woke = t_idle_wakes = 0;
	if (timeout_ns != 0)
		count_waiter();
	flush_kicks();
	int64_t now = now_ns();
	keep_p(now, RESCHED_BUSY_NS);
	w->deadline = timeout_ns < 0 ? -1 : now + timeout_ns;
	w->spinning = 0;
	if (spin && timeout_ns != 0 && spin_ns > 0 && CORE(core.try_spin())) {
		w->spinning = 1;
		w->spin_end = now_ns() + spin_ns;
		w->yield_at = 0; /* at once: see SPIN_YIELD_NS */
	}
}

static void wait_begin(struct wait *w, int64_t timeout_ns) { wait_begin_spin(w, timeout_ns, 1); }

/* t_kernel_only counts the thread's polls and selects in a row that
 * ended with kernel fds ready alone, none of the stack's sockets: from
 * EP_KERNEL_ONLY on, they do not spin. */
static __thread unsigned t_kernel_only;

void wait_end(struct wait *w)
{
	if (w->spinning)
		CORE_VOID(core.end_spin());
	w->spinning = 0;
}

/* wait_over reports, after a check that found nothing, that the time is
 * up; *now is the time, where wait_block needs it. */
int wait_over(struct wait *w, int64_t *now)
{
	*now = w->deadline >= 0 || w->spinning ? now_ns() : 0;
	return w->deadline >= 0 && *now >= w->deadline;
}

/* block_arms is what wait_block armed while it blocks: a cancellation
 * there disarms it (block_unarm). */
struct block_arms {
	int *hs, k, efd, park, log, tep, kfds, lone;
};

/* ---- a thread a connection ------------------------------------------
 *
 * A server of a thread a connection (apache's workers, varnish, MariaDB,
 * test/bench/threadsrv) has each thread blocked in a read, or a poll, of
 * its one connection. On the stack each such block and its wake-up cost
 * more than the kernel's (the interrupt in and out of the thread's set,
 * the socket armed and disarmed, the frame's wake-up of whichever thread
 * waits on the interrupt and then of the connection's own): 45-65 µs of
 * CPU a request against the kernel's 11, 0.37-0.48 of its requests a
 * second (docs/SHIM-PERFORMANCE.md). lone_blocked counts the threads
 * blocked so at once (a lone wait: one connection, to read, no kernel fd
 * beside it). Once a thread about to block finds it at
 * ONLOAD_BLOCKED_THREADS (blocked_limit) less one, the process leaves
 * the stack (lone_leave): its listeners' ports go to their kernel
 * sockets and its new sockets stay the kernel's. Its connections go one
 * by one, each handed over by its own thread as that thread next waits
 * on it alone (lone_to_kernel), where nothing else of the thread's is
 * under way on it: a handover of another thread's connection met its
 * connect or its write half done (a connect failed with EBADF, wrk saw
 * connections end). A thread that spins, or waits on several sockets or
 * on kernel fds too (an event loop), is not counted, and its connections
 * stay on the stack. */
static int lone_blocked;
static int lone_left;  /* the process left the stack so (lone_leave) */
static int lone_fails; /* handovers that failed (each logged); at LONE_FAILS_MAX, no more are tried */
#define LONE_FAILS_MAX 4

static void lone_end(struct block_arms *b)
{
	if (b->lone)
		__atomic_sub_fetch(&lone_blocked, 1, __ATOMIC_RELAXED);
	b->lone = 0;
}

static void lone_leave(void)
{
	if (__atomic_exchange_n(&lone_left, 1, __ATOMIC_ACQ_REL))
		return;
	char what[128];
	snprintf(what, sizeof what, "%d threads blocked at once, each on one connection of its own (a server of a thread a "
		 "connection)", blocked_limit);
	leave_stack("for a thread a connection", what,
		    "such a server serves more on the kernel; ONLOAD_BLOCKED_THREADS=0 keeps them accelerated", 0, 0);
}

/* lone_to_kernel: a thread is about to block on connection h alone. If
 * the process left the stack for a thread a connection, or leaves it now,
 * the connection goes to the kernel here (1: the caller's call finds its
 * fd the kernel's); 0: it blocks. */
static int lone_to_kernel(int h)
{
	if (!__atomic_load_n(&lone_left, __ATOMIC_ACQUIRE)) {
		if (blocked_limit <= 0 || __atomic_load_n(&lone_blocked, __ATOMIC_RELAXED) + 1 < blocked_limit)
			return 0;
		lone_leave();
	}
	if (__atomic_load_n(&lone_fails, __ATOMIC_RELAXED) >= LONE_FAILS_MAX)
		return 0; /* the handovers fail here (logged): the connections stay */
	FDT_EACH(fd) {
		struct fdent *e = &fdt[fd];
		if (__atomic_load_n(&e->kind, __ATOMIC_RELAXED) != K_OURS || e->h != h || e->listening)
			continue;
		if (to_kernel(fd, e, "for a thread a connection") == 0)
			return 1;
		__atomic_add_fetch(&lone_fails, 1, __ATOMIC_RELAXED);
		return 0;
	}
	return 0;
}

/* drop_thread_ep closes the thread's epoll set, to be made again at its
 * next block: what is in it is no longer known (a block with the
 * program's kernel fds in it was cancelled, or one of them was closed
 * during it). */
static void drop_thread_ep(void)
{
	if (t_ep >= 0)
		real_close(t_ep);
	t_ep = t_ep_prog = -1;
}

static void block_unarm(void *arg)
{
	struct block_arms *b = arg;
	lone_end(b);
	if (b->kfds)
		drop_thread_ep();
	else if (b->tep >= 0)
		real_epoll_ctl(b->tep, EPOLL_CTL_DEL, irq_fd, NULL);
	if (b->log)
		CORE_VOID(core.disarm_ready(b->efd, b->park));
	else
		CORE_VOID(core.disarm(b->hs, b->k, b->efd, b->park));
}

/* no_kernel_fds: none of p[0..np-1] is a kernel fd to wait on (the
 * callers leave an accelerated socket's place at -1). */
static int no_kernel_fds(const struct pollfd *p, int np)
{
	for (int i = 0; i < np; i++)
		if (p[i].fd >= 0)
			return 0;
	return 1;
}

/* KFDS_IN_EP is the most kernel fds a poll's block adds to the thread's
 * epoll set (kernel_fds_in); a poll with more blocks in ppoll. */
#define KFDS_IN_EP 8

/* POLL_AS_EPOLL: the poll events that are epoll events of the same value
 * (Linux gives both one numbering). */
#define POLL_AS_EPOLL (POLLIN | POLLPRI | POLLOUT | POLLRDNORM | POLLRDBAND | POLLWRNORM | POLLWRBAND | POLLMSG | POLLRDHUP)

/* first_kernel_fd: p[i] is a kernel fd, and its first entry in p. */
static int first_kernel_fd(const struct pollfd *p, int i)
{
	if (p[i].fd < 0)
		return 0;
	for (int j = 0; j < i; j++)
		if (p[j].fd == p[i].fd)
			return 0;
	return 1;
}

/* kernel_fds_out takes the kernel fds of p[0..np-1] out of the thread's
 * epoll set tep (those of the first n entries where kernel_fds_in
 * stopped): 0, or -1 if one was not there (the program closed it during
 * the block, or put another file under its number), when the set is
 * dropped: a file closed under one number and open under another
 * (dup) stays in an epoll set, and would wake the thread's later
 * blocks. */
static int kernel_fds_out(int tep, const struct pollfd *p, int n)
{
	int bad = 0;
	for (int i = 0; i < n; i++) {
		if (first_kernel_fd(p, i) && real_epoll_ctl(tep, EPOLL_CTL_DEL, p[i].fd, NULL) < 0)
			bad = 1;
	}
	if (bad)
		drop_thread_ep();
	return bad ? -1 : 0;
}

/* kernel_fds_in adds the kernel fds of p[0..np-1] to the thread's epoll
 * set tep for a block, each once with the events of all its entries: 1,
 * or 0 with none added where one cannot be (a file epoll does not take,
 * such as a regular one: poll finds it ready, and the thread does not
 * block) or there are more than KFDS_IN_EP. So a thread whose poll mixes
 * the stack's sockets with its own fds (a thread pool's wake-up pipe, a
 * timerfd) blocks in epoll_wait with the stack's interrupt in its set
 * EPOLLEXCLUSIVE, as one on the stack's sockets alone does: in ppoll,
 * every frame woke every thread blocked so (TestShimPollHerd: 6 wake-ups
 * a round trip of eight threads' seven waiting). */
static int kernel_fds_in(int tep, const struct pollfd *p, int np)
{
	int n = 0;
	for (int i = 0; i < np; i++)
		n += p[i].fd >= 0;
	if (n > KFDS_IN_EP)
		return 0;
	for (int i = 0; i < np; i++) {
		if (!first_kernel_fd(p, i))
			continue;
		uint32_t ev = 0;
		for (int j = i; j < np; j++)
			if (p[j].fd == p[i].fd)
				ev |= (uint16_t)p[j].events & POLL_AS_EPOLL;
		struct epoll_event e = {.events = ev, .data.fd = p[i].fd};
		if (real_epoll_ctl(tep, EPOLL_CTL_ADD, p[i].fd, &e) < 0) {
			kernel_fds_out(tep, p, i);
			return 0;
		}
	}
	return 1;
}

/* log_wait_off: the stack cannot wake a thread at its ready log's next
 * entry (it is shared with other processes): epoll arms each member. */
int log_wait_off;

/* wait_block spins on (returns at once) or blocks: it arms the k
 * sockets hs for want (or, if logseq is set, the stack's ready log from
 * that position: onl_arm_ready) and polls p[0..np-1] with the thread's
 * eventfd in p[np] (and the stack's interrupt fd in p[np+1]) until
 * either side is ready, the deadline or a signal. 0: check again; 1:
 * check again, and the program's own fds (p[0..np-1]) are ready; -1
 * with errno.
 *
 * The thread waits on the stack's interrupt itself, as a thread blocked
 * on a kernel socket is woken by the kernel at a packet's arrival: the
 * AF_XDP socket is readable while a frame is in its RX ring, and the
 * thread polls the stack when it wakes so. The stack's Sleeper then
 * leaves the frames to it and attends the timers only (ParkDirect); a
 * wake-up through the Sleeper would take its thread's and then the
 * thread's eventfd, two threads' wake-ups where this is one (three when
 * it was a goroutine woken through the Go runtime's poller). The
 * eventfd still wakes the thread when another thread
 * or process polls the stack and makes one of its sockets ready. */
int wait_block(struct wait *w, int64_t now, int *hs, int *want, int *evs, unsigned *edges, int k,
		      const unsigned *logseq, struct pollfd *p, int np, int epfd, int conns, const sigset_t *mask)
{
	if (w->spinning && now < w->spin_end) {
		if (now >= w->yield_at && __atomic_load_n(&waiter_threads, __ATOMIC_RELAXED) > 1) {
			sched_yield();
			w->yield_at = now + SPIN_YIELD_NS;
		}
		return 0;
	}
	wait_end(w);
	/* A wait on one connection alone, to read (lone_to_kernel). */
	int lone = k == 1 && epfd < 0 && !logseq && conns && (want[0] & ONL_READABLE) && no_kernel_fds(p, np);
	if (lone && lone_to_kernel(hs[0]))
		return 0;
	int efd = thread_efd();
	/* A thread that waits on listeners only (memcached's accepting
	 * thread) leaves the interrupt to those that wait on connections,
	 * and to the Sleeper: with it, it was the thread every frame woke,
	 * to hand the frame to another. Unless it is the only thread that
	 * waits on a stack of this process's own (redis, an nginx worker,
	 * between connections): the Sleeper's wake-up for a SYN, and then
	 * the thread's for the connection, were two where this is one. */
	int alone = __atomic_load_n(&waiter_threads, __ATOMIC_RELAXED) <= 1;
	if (t_irq_woke) {
		/* The last block's wake by the interrupt made nothing of the
		 * thread's ready: its wait goes on. */
		t_irq_woke = 0;
		if (t_idle_wakes < IDLE_WAKES_MAX)
			t_idle_wakes++;
	}
	int direct = irq_fd >= 0 && (conns ? alone || t_idle_wakes < IDLE_WAKES_MAX : remote_fd < 0 && alone);
	/* epoll_pwait2 (glibc 2.35) takes the deadline to the nanosecond;
	 * without it, ppoll. */
	/* A wait on the stack alone (no kernel fd in p: a blocking read, or
	 * a poll of accelerated sockets only, as each of varnish's threads
	 * makes on its connection) takes the thread's set too, for
	 * EPOLLEXCLUSIVE (below): with ppoll, every frame woke each of
	 * varnish's 50 threads blocked so. */
	/* A wait with kernel fds in it takes the thread's set too, with them
	 * added for the block (kernel_fds_in), where other threads (or
	 * processes) may block on the stack beside it: one thread alone has
	 * no herd to wake, and ppoll costs it fewer system calls. */
	int tep = -1, kfds = 0;
	if (direct && real_epoll_pwait2) {
		if (epfd >= 0 || no_kernel_fds(p, np))
			tep = thread_ep(epfd);
		else if (!alone || remote_fd >= 0)
			kfds = (tep = thread_ep(-1)) >= 0;
	}
	int park = direct ? ONL_PARK_DIRECT : ONL_PARK;
	keep_p(now ? now : now_ns(), RESCHED_IDLE_NS); /* now is 0 without a deadline */
	if (logseq) {
		int a = CORE(core.arm_ready(efd, *logseq, park));
		if (a < 0)
			log_wait_off = 1; /* check again, and arm each member */
		if (a != 0)
			return 0;
	} else if (CORE(core.arm(hs, want, evs, edges, k, efd, park)) > 0) {
		return 0;
	}
	/* What a cancellation in the block lets go of (run_undo). */
	struct block_arms ba = {.hs = hs, .k = k, .efd = efd, .park = park, .log = logseq != NULL, .tep = -1};
	struct undo u;
	undo_push(&u, block_unarm, &ba);
	struct timespec ts, *tsp = NULL;
	if (w->deadline >= 0) {
		int64_t left = w->deadline - now;
		ts.tv_sec = left / 1000000000LL;
		ts.tv_nsec = left % 1000000000LL;
		tsp = &ts;
	}
	/* Go's preemption signal (SIGURG, for the threads it ran on) waits
	 * where the program gave a mask: it would fail the program's poll
	 * with EINTR. Without one, the thread's own mask stands (reading it
	 * is a system call a block), and a signal that ran none of the
	 * program's handlers (t_handled) is a wake-up like any: the caller
	 * checks and waits again. */
	sigset_t m, *mp = NULL;
	if (mask) {
		m = *mask;
		sigaddset(&m, SIGURG);
		mp = &m;
	}
	unsigned handled = t_handled;
	int r, irq = 0, woke = 0, remote = 0, prog = 0;
	/* The stack's interrupt joins the thread's set for the block only
	 * (EPOLLEXCLUSIVE: a frame wakes one of the blocked threads, not
	 * all; the thundering herd ppoll gives had memcached's threads wake
	 * together at every frame and fight for the stack). Left in the set
	 * while the thread runs or spins, it cost every frame's arrival the
	 * AF_XDP socket's wait-queue lock and the epoll callback, in the
	 * context that received the frame: on veth, the client's send
	 * (redis-benchmark's CPU, 4% of it). Level-triggered, the add reports
	 * a frame already in the ring. */
	struct epoll_event b = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = irq_fd};
	if (kfds && !kernel_fds_in(tep, p, np))
		kfds = 0, tep = -1; /* the ppoll below waits on them */
	if (tep >= 0 && real_epoll_ctl(tep, EPOLL_CTL_ADD, irq_fd, &b) < 0 && errno != EEXIST) {
		if (kfds)
			kernel_fds_out(tep, p, np);
		kfds = 0, tep = -1; /* the ppoll below waits on it */
	}
	if (lone) {
		ba.lone = 1;
		__atomic_add_fetch(&lone_blocked, 1, __ATOMIC_RELAXED);
	}
	if (tep >= 0) {
		struct epoll_event got[KFDS_IN_EP + 4];
		ba.tep = tep;
		ba.kfds = kfds;
		CANCEL_POINT(r = real_epoll_pwait2(tep, got, KFDS_IN_EP + 4, tsp, mp));
		int e = errno;
		real_epoll_ctl(tep, EPOLL_CTL_DEL, irq_fd, NULL);
		if (kfds)
			kernel_fds_out(tep, p, np);
		errno = e;
		for (int i = 0; i < r; i++) {
			int fd = got[i].data.fd;
			irq |= fd == irq_fd;
			woke |= fd == efd;
			remote |= fd == remote_fd;
			prog |= fd == epfd || (kfds && fd != irq_fd && fd != efd && fd != remote_fd);
		}
	} else {
		int n = np;
		p[n++] = (struct pollfd){.fd = efd, .events = POLLIN};
		if (direct)
			p[n++] = (struct pollfd){.fd = irq_fd, .events = POLLIN};
		if (remote_fd >= 0)
			p[n++] = (struct pollfd){.fd = remote_fd, .events = POLLIN};
		CANCEL_POINT(r = real_ppoll(p, n, tsp, mp));
		woke = r > 0 && (p[np].revents & POLLIN);
		irq = direct && r > 0 && (p[np + 1].revents & POLLIN);
		remote = remote_fd >= 0 && r > 0 && (p[n - 1].revents & POLLIN);
		for (int i = 0; r > 0 && i < np; i++)
			prog |= p[i].revents != 0;
	}
	int saved = errno;
	undo_pop(&u);
	lone_end(&ba);
	t_irq_woke = irq;
	if (woke)
		t_idle_wakes = 0; /* its sockets turned ready: their traffic goes on */
	int unpark = !direct ? ONL_PARK : irq ? ONL_UNPARK_POLL : ONL_PARK_DIRECT;
	if (logseq)
		CORE_VOID(core.disarm_ready(efd, unpark));
	else
		CORE_VOID(core.disarm(hs, k, efd, unpark));
	if (remote) {
		/* Another process's poll made ready sockets this process's
		 * threads wait on: wake them (our own readiness the caller
		 * checks again). */
		char b[64];
		while (real_recv(remote_fd, b, sizeof b, MSG_DONTWAIT) > 0)
			;
		CORE_VOID(core.take_remote());
	}
	/* One read empties the eventfd (a counter, not a semaphore). */
	uint64_t v;
	if (woke || remote)
		(void)real_read(efd, &v, sizeof v);
	if (r < 0 && saved == EINTR && !mp && t_handled == handled)
		r = 0;
	errno = saved;
	return r < 0 ? -1 : prog;
}

/* check_poll is a poll that does not wait. A signal (Go's preemption
 * signal, SIGURG, comes to threads that ran Go code) may interrupt even
 * that: it is tried again. */
static int check_poll(struct pollfd *p, nfds_t n)
{
	int r;
	while ((r = real_poll(p, n, 0)) < 0 && errno == EINTR)
		;
	return r;
}

/* taken_over: of the k accelerated fds (fds[idx[j]]) whose core events
 * are evs[j], those whose socket the core no longer has (error and
 * hangup) may have been taken over by the kernel; 1 if any was. An fd
 * closed since the wait began (gone[j]) is not looked at: its number may
 * name another file. */
static int taken_over(const struct pollfd *fds, const int *idx, const int *evs, const int *gone, int k)
{
	int any = 0;
	for (int j = 0; j < k; j++)
		if (!gone[j] && (evs[j] & (ONL_ERROR | ONL_HANGUP)) == (ONL_ERROR | ONL_HANGUP) &&
		    kernel_took(fds[idx[j]].fd))
			any = 1;
	return any;
}

static int hold_h(int h);
static void release_h(int h);
static int poll_sel(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask, int sel);

/* poll_held is what wait_poll_sel holds while it blocks: the sockets
 * (held) and its scratch, let go of by a cancellation (poll_unhold). */
struct poll_held {
	int *hs, *held, k;
	void *heap;
	struct arms *arm;
	char *nready;
};

static void poll_unhold(void *arg)
{
	struct poll_held *p = arg;
	for (int j = 0; j < p->k; j++)
		if (p->held[j])
			release_h(p->hs[j]);
	free(p->heap);
	free(p->arm->hs), free(p->arm->want), free(p->arm->evs), free(p->arm->edges), free(p->nready);
}

/*
 * wait_poll is poll() over fds where some are ours (select's, if sel).
 * Ours are checked through the core (a listener also in the kernel: it
 * serves clients that come through loopback); the rest with the kernel.
 * timeout_ns < 0 waits for ever.
 *
 * Once it blocks it holds each of its sockets (hrefs), as the kernel's
 * poll holds each file it waits on: another thread's close of an fd
 * meanwhile does not end the wait, and the socket lives until the wait
 * returns. The kernel's poll, woken by any of its files or by its time,
 * finds the number closed and reports POLLNVAL; so does this one, at
 * the closed socket's next event, another fd's, or the time. The
 * kernel's select (sel) then reports the number in each set it was in
 * (6.18, measured). Before 2026-12-04 the close ended the wait, the
 * socket reported closed (TestShimCloseDuringPoll).
 */
int wait_poll_sel(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask, int sel)
{
	cancel_off();
	int r = poll_sel(fds, n, timeout_ns, mask, sel);
	cancel_on();
	return r;
}

static int poll_sel(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask, int sel)
{
	int hs_buf[64], want_buf[64], ev_buf[64], idx_buf[64], gone_buf[64], held_buf[64];
	unsigned gen_buf[64];
	struct pollfd tmp_buf[67]; /* and wait_block's three */
	int *hs = hs_buf, *want = want_buf, *evs = ev_buf, *idx = idx_buf, *gone = gone_buf, *held = held_buf;
	unsigned *gen = gen_buf;
	struct pollfd *tmp = tmp_buf;
	void *heap = NULL;
	if (n >= 64) {
		heap = malloc((n + 2) * (7 * sizeof(int) + sizeof(struct pollfd)));
		if (!heap) {
			errno = ENOMEM;
			return -1;
		}
		hs = heap; want = hs + n; evs = want + n; idx = evs + n; gone = idx + n; held = gone + n;
		gen = (unsigned *)(held + n);
		tmp = (struct pollfd *)(gen + n + 4);
	}
	int k = 0, nkernel = 0, conns = 0, holding = 0, nested = 0;
	struct poll_held hp;
	struct undo hu;
	struct arms arm = {0}; /* epoll instances' members to arm (ep_peek) */
	for (nfds_t i = 0; i < n; i++) {
		tmp[i] = fds[i];
		tmp[i].revents = 0;
		struct fdent *e = ours(fds[i].fd);
		if (e) {
			conns |= !e->listening;
			hs[k] = e->h;
			want[k] = from_poll(fds[i].events);
			gen[k] = fdgen[fds[i].fd];
			gone[k] = held[k] = 0;
			idx[k++] = i;
			if (!e->listening)
				tmp[i].fd = -1;
			else
				nkernel++;
		} else if (fds[i].fd >= 0) {
			nkernel++;
			nested |= (fds[i].events & (POLLIN | POLLRDNORM)) && ep_has_members(fds[i].fd);
		}
	}
	char *nready = nested ? calloc(n, 1) : NULL;
	if (nested && !nready) {
		free(heap);
		errno = ENOMEM;
		return -1;
	}
	struct wait w;
	wait_begin_spin(&w, timeout_ns, t_kernel_only < EP_KERNEL_ONLY);
	int ret = 0, ours_ready = 0;
	for (;;) {
		int ready = 0, closed = 0;
		CORE_VOID(core.events(hs, evs, NULL, k, w.spinning));
		for (int j = 0; j < k; j++) {
			if (!gone[j] && fdgen[fds[idx[j]].fd] != gen[j]) {
				gone[j] = 1;
				if (tmp[idx[j]].fd >= 0) {
					tmp[idx[j]].fd = -1; /* a listener's kernel half */
					nkernel--;
				}
			}
			closed |= gone[j];
		}
		if (taken_over(fds, idx, evs, gone, k)) {
			/* Those fds are the kernel's now: wait again. */
			wait_end(&w);
			if (holding)
				undo_pop(&hu);
			for (int j = 0; j < k; j++)
				if (held[j])
					release_h(hs[j]);
			free(heap);
			free(arm.hs), free(arm.want), free(arm.evs), free(arm.edges), free(nready);
			return poll_sel(fds, n, timeout_ns, mask, sel);
		}
		/* An epoll instance held here is readable for its accelerated
		 * members too (epoll.c, ep_peek), looked at before the kernel's
		 * poll: a look that finds none ready takes back what made it
		 * readable in the kernel for them. */
		arm.n = 0;
		for (nfds_t i = 0; nested && i < n && ret != -1; i++) {
			nready[i] = 0;
			if (fds[i].fd < 0 || !(fds[i].events & (POLLIN | POLLRDNORM)) || !ep_has_members(fds[i].fd))
				continue;
			int r = ep_peek(fds[i].fd, &arm, w.spinning);
			nready[i] = r > 0;
			ret = r < 0 ? -1 : 0;
		}
		if (ret == -1)
			break;
		if (nkernel > 0 && check_poll(tmp, n) < 0) {
			ret = -1;
			break;
		}
		for (nfds_t i = 0; i < n; i++)
			fds[i].revents = tmp[i].revents;
		int nval = 0;
		ours_ready = 0;
		for (int j = 0; j < k; j++) {
			struct pollfd *p = &fds[idx[j]];
			short re = to_poll(evs[j]) & (p->events | POLLERR | POLLHUP);
			ours_ready |= !gone[j] && re;
			if (!gone[j])
				p->revents |= re;
			else if (re)
				nval = 1; /* the closed socket's event wakes the kernel's poll */
		}
		for (nfds_t i = 0; nested && i < n; i++)
			if (nready[i]) {
				fds[i].revents |= fds[i].events & (POLLIN | POLLRDNORM);
				ours_ready = 1;
			}
		for (nfds_t i = 0; i < n; i++)
			ready += fds[i].revents != 0;
		int64_t now;
		int over = wait_over(&w, &now);
		if (closed && (ready > 0 || nval || over)) {
			/* Woken, the kernel's poll finds the numbers closed; its
			 * select puts them in each set they were in. */
			for (int j = 0; j < k; j++)
				if (gone[j]) {
					fds[idx[j]].revents = sel ? fds[idx[j]].events & (POLLIN | POLLOUT | POLLPRI) : POLLNVAL;
					ready++;
				}
		}
		if (ready > 0 || over) {
			ret = ready;
			if (ready > 0)
				t_kernel_only = ours_ready ? 0 : t_kernel_only + (t_kernel_only < EP_KERNEL_ONLY);
			break;
		}
		if (!holding) {
			holding = 1;
			for (int j = 0; j < k; j++)
				held[j] = !gone[j] && hold_h(hs[j]);
			hp = (struct poll_held){.hs = hs, .held = held, .k = k, .heap = heap, .arm = &arm, .nready = nready};
			undo_push(&hu, poll_unhold, &hp);
		}
		int *bh = hs, *bw = want, *be = evs, bk = k;
		unsigned *bedges = NULL;
		if (arm.n > 0) {
			/* The instances' members first, then the fds' own. */
			if (arms_append(&arm, hs, want, NULL, k) < 0) {
				ret = -1;
				break;
			}
			bh = arm.hs, bw = arm.want, be = arm.evs, bedges = arm.edges, bk = arm.n + k;
		}
		if (wait_block(&w, now, bh, bw, be, bedges, bk, NULL, tmp, n, -1, conns || arm.n, mask) < 0) {
			ret = -1;
			break;
		}
		for (nfds_t i = 0; i < n; i++)
			tmp[i].revents = 0;
	}
	wait_end(&w);
	if (holding)
		undo_pop(&hu);
	for (int j = 0; j < k; j++)
		if (held[j])
			release_h(hs[j]);
	free(heap);
	free(arm.hs), free(arm.want), free(arm.evs), free(arm.edges), free(nready);
	return ret;
}

int wait_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask)
{
	return wait_poll_sel(fds, n, timeout_ns, mask, 0);
}

/* wait_conn_once is wait_poll for one accelerated connection, named by
 * its handle h (a call that holds it: its fd may be closed meanwhile):
 * 1 ready (or error, or hang-up), 0 the time is up, -1 with errno. */
static int wait_conn_once(int h, short events, int64_t timeout_ns)
{
	int want = from_poll(events), ev = 0, ret;
	struct pollfd tmp[3]; /* wait_block's */
	struct wait w;
	wait_begin(&w, timeout_ns);
	for (;;) {
		CORE_VOID(core.events(&h, &ev, NULL, 1, w.spinning));
		if (to_poll(ev) & (events | POLLERR | POLLHUP)) {
			ret = 1;
			break;
		}
		int64_t now;
		if (wait_over(&w, &now)) {
			ret = 0;
			break;
		}
		if (wait_block(&w, now, &h, &want, &ev, NULL, 1, NULL, tmp, 0, -1, 1, NULL) < 0) {
			ret = -1;
			break;
		}
	}
	wait_end(&w);
	return ret;
}

/* wait_until waits for fd (ours; or, with h, the connection h, which the
 * caller holds) to be ready for events, until deadline (on now_ns; -1:
 * for ever); 0, or -1 with errno: EINTR for a signal whose handler does
 * not restart, EAGAIN when the deadline passed. A call with a deadline is
 * not restarted after any handler, SA_RESTART or not (signal(7): sockets
 * with timeouts). */
static int wait_until(int fd, int h, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		int64_t left = -1;
		if (deadline >= 0 && (left = deadline - now_ns()) <= 0) {
			errno = EAGAIN;
			return -1;
		}
		sig_norestart = 0;
		int r = h ? wait_conn_once(h, events, left) : wait_poll(&p, 1, left, NULL);
		if (r > 0)
			return 0;
		if (r == 0 || (errno == EINTR && !sig_norestart && deadline < 0))
			continue;
		return -1;
	}
}

/* wait_one is wait_until for fd itself. */
int wait_one(int fd, short events, int64_t deadline)
{
	return wait_until(fd, 0, events, deadline);
}

/* timeo_opt says whether level and name are SO_RCVTIMEO or SO_SNDTIMEO
 * (either layout of the time). */
int timeo_opt(int level, int name)
{
	return level == SOL_SOCKET && (name == SO_RCVTIMEO_OLD || name == SO_SNDTIMEO_OLD ||
				       name == SO_RCVTIMEO_NEW || name == SO_SNDTIMEO_NEW);
}

/* sock_deadline is the deadline of a blocking call on fd (ours, entry e)
 * that waits for ev from now: its kernel socket's SO_RCVTIMEO (POLLIN)
 * or SO_SNDTIMEO, where the program set one (htimeo); -1: none. */
int64_t sock_deadline(const struct fdent *e, int fd, short ev)
{
	if ((unsigned)e->h >= MAX_HANDLES || !htimeo[e->h])
		return -1;
	struct timeval tv;
	socklen_t l = sizeof tv;
	if (real_getsockopt(fd, SOL_SOCKET, ev == POLLIN ? SO_RCVTIMEO : SO_SNDTIMEO, &tv, &l) < 0 ||
	    (tv.tv_sec == 0 && tv.tv_usec == 0))
		return -1;
	return now_ns() + tv.tv_sec * 1000000000LL + tv.tv_usec * 1000LL;
}

/* ---- a call on an accelerated socket ------------------------------------
 *
 * A call that reads or writes a connection (recv_call, send_call),
 * accepts on a listener (accept_call) or waits for a connect's end
 * (connect_call), works
 * on the socket its fd named as it began (ccall_begin), and holds it once
 * it blocks (a count in hrefs, as each fd naming it has): another
 * thread's close of the fd meanwhile lets go of the number at once, but
 * the socket lives, and the call goes on, until it returns, as the
 * kernel's call holds its file; the socket closes then (ccall_end). Before,
 * such a call failed with EBADF, and the close ended the connection at
 * once: a write of 8 MiB that another thread closed under it delivered
 * 350 KB, and a recv failed with EBADF instead of returning the data
 * that came after (TestShimCloseDuringCall). A close that comes before
 * the call has blocked still fails it with EBADF. The fd's kernel socket
 * (the port's reservation) closes with the fd. */

struct ccall ccall_begin(struct fdent *e, int fd)
{
	return (struct ccall){.e = e, .fd = fd, .h = e->h, .nonblock = e->nonblock, .gen = fdgen[fd]};
}

/* ccall_gone: the call's fd was closed since it began (the number may
 * name another file now). */
int ccall_gone(const struct ccall *c)
{
	return fdgen[c->fd] != c->gen;
}

/* ccall_check says how the call goes on: CC_OK on its socket (its fd
 * still names it, or the call holds it); CC_CLOSED, with EBADF, when the
 * fd was closed before the call held the socket; CC_KERNEL when a
 * handover gave the socket to the kernel (the fd is the kernel's). */
int ccall_check(const struct ccall *c)
{
	if (ccall_gone(c)) {
		if (c->held)
			return CC_OK;
		errno = EBADF;
		return CC_CLOSED;
	}
	return c->e->kind == K_OURS ? CC_OK : CC_KERNEL;
}

/* ccall_taken: the core no longer has the call's socket because the
 * kernel took it over (kernel_took), its fd still the call's. */
int ccall_taken(const struct ccall *c)
{
	return !ccall_gone(c) && kernel_took(c->fd);
}

static int ccall_hold(struct ccall *c);
static void ccall_unhold(void *arg);

/* ccall_blocked: the call found nothing to do (EAGAIN). It counts that
 * for EPOLLET (on the fd's entry, unless the fd was closed meanwhile),
 * and, unless the call must not block, holds the socket and waits for
 * ev on it until *deadline (the call's: DL_UNREAD before its first wait,
 * which reads it). While the fd names a listener the wait is on the fd:
 * the listener's kernel half takes the clients that come through
 * loopback. 1: try again; 0: the call ends, with errno (EAGAIN, EINTR)
 * if it did nothing. */
int ccall_blocked(struct ccall *c, int flags, short ev, int64_t *deadline)
{
	int gone = ccall_gone(c);
	if (!gone && ev == POLLIN)
		c->e->rd_eagain++;
	else if (!gone)
		c->e->wr_eagain++;
	if (c->nonblock || (flags & MSG_DONTWAIT)) {
		errno = EAGAIN;
		return 0;
	}
	if (!c->coff) {
		/* Cancellation off from the call's first block to its end
		 * (ccall_done): a call that does not block pays nothing. */
		cancel_off();
		c->coff = 1;
	}
	if (*deadline == DL_UNREAD)
		*deadline = gone ? -1 : sock_deadline(c->e, c->fd, ev);
	if (!c->held && !ccall_hold(c) && (ccall_gone(c) || c->e->kind != K_OURS))
		return 1; /* closed or taken over just now: ccall_check says which */
	int on_fd = !ccall_gone(c) && c->e->listening;
	return wait_until(c->fd, on_fd ? 0 : c->h, ev, *deadline) == 0;
}

/* ccall_hold takes a hold on the call's socket, without the table's lock
 * (a signal handler's call must not wait for it): the count goes up only
 * from above 0, so a socket whose last name a close let go (and closed)
 * is never held; whoever takes the count to 0 closes the socket. If the
 * fd turns out closed or taken over since the call began, the hold is let
 * go again (closing the socket if it was the last) and ccall_hold fails. */
static int ccall_hold(struct ccall *c)
{
	if (!hold_h(c->h))
		return 0;
	c->held = 1;
	undo_push(&c->undo, ccall_unhold, c);
	if (ccall_gone(c) || c->e->kind != K_OURS) {
		ccall_end(c);
		return 0;
	}
	return 1;
}

/* hold_h takes a hold on handle h, as ccall_hold: the count goes up only
 * from above 0 (0: not held, the socket closed or no count). */
static int hold_h(int h)
{
	if ((unsigned)h >= MAX_HANDLES)
		return 0;
	int *r = &hrefs[h];
	int v = __atomic_load_n(r, __ATOMIC_SEQ_CST);
	do {
		if (v <= 0)
			return 0;
	} while (!__atomic_compare_exchange_n(r, &v, v + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
	return 1;
}

/* release_h lets go of a hold on h: the socket closes if nothing else
 * names it. */
static void release_h(int h)
{
	if (__atomic_sub_fetch(&hrefs[h], 1, __ATOMIC_SEQ_CST) == 0 && !after_fork)
		CORE_VOID(core.close(h));
}

/* ccall_end lets go of the call's hold: the socket closes if no fd names
 * it any more (the fd was closed while the call waited). */
void ccall_end(struct ccall *c)
{
	if (!c->held)
		return;
	undo_pop(&c->undo);
	c->held = 0;
	release_h(c->h);
}

/* ccall_unhold is ccall_end for a cancelled call (run_undo, which took
 * it off the list). */
static void ccall_unhold(void *arg)
{
	struct ccall *c = arg;
	c->held = 0;
	release_h(c->h);
}

/* ccall_to_kernel: the call goes on in the kernel (a handover took its
 * socket): it lets go of its hold, and the kernel's call is the
 * cancellation point. */
void ccall_to_kernel(struct ccall *c)
{
	ccall_end(c);
	if (c->coff) {
		c->coff = 0;
		cancel_on();
	}
}

/* ccall_done ends the call (ccall_begin). */
void ccall_done(struct ccall *c)
{
	ccall_end(c);
	if (c->coff)
		cancel_on();
}
