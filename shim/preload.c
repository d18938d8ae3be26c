/*
 * libonload.so: the LD_PRELOAD interposer. `onloadd run -- CMD` preloads
 * it into an unmodified program.
 *
 * It keeps a table of the program's file descriptors that are TCP/IPv4
 * sockets. Every call on any other descriptor goes straight to libc (its
 * function found once with dlsym(RTLD_NEXT)) after one table lookup.
 * socket(), bind() and listen() stay in the kernel. The Go core
 * (libonload-core.so, shim/core) is loaded at the first operation that
 * needs a stack: a connect(), or the first accept, poll or epoll_ctl on a
 * listening socket. So a pre-fork master that only binds and listens
 * leaves its workers free to load it. The core then decides: a socket it
 * does not accelerate (another interface, loopback, no stack) stays the
 * kernel's, with ONLOAD_LOG=debug saying why.
 *
 * An accelerated socket stands on its kernel socket, whose fd number the
 * program holds: it holds the port, and fstat, fcntl and /proc/self/fd
 * see a socket. Its data goes through the core.
 *
 * Waiting (blocking calls, poll, select, epoll) spins on the stack for
 * the profile's spin time, then arms the sockets with the thread's
 * eventfd and blocks in the kernel on it beside the program's own fds.
 *
 * The Go runtime cannot run in a child forked after it loaded: there an
 * inherited connection is handed over to the kernel at its first use
 * (onloadd, or the parent for a stack it made, re-creates it on its
 * kernel socket with TCP_REPAIR), and is the kernel's from then on, in
 * the child and in the parent; close() closes only the child's fd. A
 * connection passed across exec is handed over before it.
 *
 * The program's signal handlers run through on_signal, which holds a
 * signal that finds its thread in the core until the thread leaves. On a
 * stack of the process's own, its end closes its connections as the
 * kernel's would: exit (atexit), _exit, the signals it leaves at a
 * default that ends it (caught, then raised again at the default), and
 * a fault in its own code (on_fault).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <alloca.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "onload.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- libc's functions ---------------------------------------------- */

#define REAL(ret, name, ...) static ret (*real_##name)(__VA_ARGS__)
REAL(int, socket, int, int, int);
REAL(int, listen, int, int);
REAL(int, accept, int, struct sockaddr *, socklen_t *);
REAL(int, accept4, int, struct sockaddr *, socklen_t *, int);
REAL(int, connect, int, const struct sockaddr *, socklen_t);
REAL(ssize_t, read, int, void *, size_t);
REAL(ssize_t, write, int, const void *, size_t);
REAL(ssize_t, readv, int, const struct iovec *, int);
REAL(ssize_t, writev, int, const struct iovec *, int);
REAL(ssize_t, recv, int, void *, size_t, int);
REAL(ssize_t, recvfrom, int, void *, size_t, int, struct sockaddr *, socklen_t *);
REAL(ssize_t, recvmsg, int, struct msghdr *, int);
REAL(int, recvmmsg, int, struct mmsghdr *, unsigned int, int, struct timespec *);
REAL(ssize_t, send, int, const void *, size_t, int);
REAL(ssize_t, sendto, int, const void *, size_t, int, const struct sockaddr *, socklen_t);
REAL(ssize_t, sendmsg, int, const struct msghdr *, int);
REAL(int, sendmmsg, int, struct mmsghdr *, unsigned int, int);
REAL(ssize_t, sendfile, int, int, off_t *, size_t);
REAL(int, close, int);
REAL(int, shutdown, int, int);
REAL(int, getsockopt, int, int, int, void *, socklen_t *);
REAL(int, setsockopt, int, int, int, const void *, socklen_t);
REAL(int, getsockname, int, struct sockaddr *, socklen_t *);
REAL(int, getpeername, int, struct sockaddr *, socklen_t *);
REAL(int, fcntl, int, int, ...);
REAL(int, ioctl, int, unsigned long, ...);
REAL(int, dup, int);
REAL(int, dup2, int, int);
REAL(int, dup3, int, int, int);
REAL(int, poll, struct pollfd *, nfds_t, int);
REAL(int, ppoll, struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
REAL(int, select, int, fd_set *, fd_set *, fd_set *, struct timeval *);
REAL(int, pselect, int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
REAL(int, epoll_create, int);
REAL(int, epoll_create1, int);
REAL(int, epoll_ctl, int, int, int, struct epoll_event *);
REAL(int, epoll_wait, int, struct epoll_event *, int, int);
REAL(int, epoll_pwait, int, struct epoll_event *, int, int, const sigset_t *);
REAL(int, epoll_pwait2, int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
REAL(pid_t, fork, void);
REAL(int, execve, const char *, char *const[], char *const[]);
REAL(int, execvpe, const char *, char *const[], char *const[]);
REAL(int, fexecve, int, char *const[], char *const[]);
REAL(int, sigaction, int, const struct sigaction *, struct sigaction *);
static void (*real__exit)(int);

/* maybe_ours has a bit for each fd below NFAST that is accelerated: set
 * before the fd's entry becomes K_OURS, cleared when it stops. A call on
 * any other fd reads one word here, beside libc's function pointers, and
 * never the fd table: where every system call flushes the TLB (page-table
 * isolation without PCID, as on the machine the shim was measured on),
 * each page an interposed call touches costs a page walk. */
#define NFAST 8192
static uint64_t maybe_ours[NFAST / 64];

static inline void mark_ours(int fd, int on)
{
	if ((unsigned)fd >= NFAST)
		return;
	uint64_t bit = (uint64_t)1 << (fd & 63);
	if (on)
		__atomic_or_fetch(&maybe_ours[fd >> 6], bit, __ATOMIC_RELAXED);
	else
		__atomic_and_fetch(&maybe_ours[fd >> 6], ~bit, __ATOMIC_RELAXED);
}

/* ---- the Go core ----------------------------------------------------- */

static struct {
	int (*listen)(int, uint32_t);
	int (*connect)(int, uint32_t, uint16_t);
	int (*accept)(int, int);
	long (*recv)(int, void *, size_t, int);
	long (*send)(int, const void *, size_t, int);
	void (*kick)(void);
	void (*events)(int *, int *, unsigned *, int, int);
	int (*ready)(int *, int *, unsigned *, int, int, unsigned *, int *);
	int (*arm)(int *, int *, int *, unsigned *, int, int, int);
	int (*arm_ready)(int, unsigned, int);
	void (*disarm_ready)(int, int);
	void (*disarm)(int *, int, int, int);
	int (*irq_fd)(void);
	int (*remote_fd)(void);
	void (*take_remote)(void);
	void (*thread)(void);
	void (*resched)(void);
	long (*spin_ns)(void);
	int (*try_spin)(void);
	void (*end_spin)(void);
	void (*close)(int);
	int (*shutdown)(int, int);
	int (*setopt)(int, int, int);
	int (*addrs)(int, uint32_t *, uint16_t *, uint32_t *, uint16_t *);
	int (*sockerr)(int);
	int (*unread)(int);
	int (*tcpinfo)(int, struct onl_tcpinfo *);
	int (*handover_info)(int, uint32_t *, uint32_t *, char *, int);
	int (*handover)(int, int);
	int (*handed_over)(int);
	void (*exit)(void);
	int (*own_stack)(void);
} core;

static int core_state;	      /* 0 not loaded, 1 loaded, -1 failed */
static int after_fork;	      /* a child forked after the core loaded */
static int log_debug;	      /* ONLOAD_LOG=debug */
static long spin_ns;	      /* the profile's spin time */
static int irq_fd = -1;	      /* the stack's interrupt fd (onl_irq_fd) */
static int remote_fd = -1;    /* the stack's wake socket (onl_remote_fd) */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;	     /* the table */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER; /* loading the core */
static __thread volatile int in_core; /* this thread is in the Go core */
static __thread int in_handler; /* the program's signal handlers running on this thread */
static __thread int kick_owed; /* this thread's sends left frames for a kick */

/* Signals that come while their thread is in the core wait for it to
 * leave (see on_signal): the handlers for them, by signal, and what each
 * thread holds back. in_core and sig_held are volatile: the handler
 * writes them between any two of the thread's instructions, so leaving
 * the core (clear in_core, then look at sig_held) must keep that order. */
static struct sigaction prog_act[NSIG];
static __thread volatile uint64_t sig_held; /* bit sig-1: held */
static __thread siginfo_t sig_info[NSIG]; /* what came with each */
static void run_held(void);
static int held_sig(int sig);
static int fault_sig(int sig);

/* A thread that calls the core gets a signal stack (unless it has one):
 * the Go runtime takes it as the thread's, and the program's handlers
 * run on it (SA_ONSTACK). A handler's socket call enters Go from there,
 * and Go assumes 32 KiB of it are free below: Go's own stack for a
 * thread that has none is 32 KiB in all. */
#define ALTSTACK (256 << 10)
static __thread int t_alt;
static __thread void *t_alt_mem;
static void thread_altstack(void);
static int loading;	      /* the core is being loaded (its runtime starts) */
static void *core_base;	      /* where the core is mapped */

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...)
{
	char buf[512];
	int n = snprintf(buf, sizeof buf, "onload[%d]: ", getpid());
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = sizeof buf - 2;
	buf[n++] = '\n';
	real_write(2, buf, n);
}
#define debugf(...) do { if (log_debug) logf_(__VA_ARGS__); } while (0)

static void exit_close(void);
static void catch_ends(void);

static int load_core(void)
{
	if (core_state)
		return core_state;
	pthread_mutex_lock(&load_mu);
	if (core_state) {
		pthread_mutex_unlock(&load_mu);
		return core_state;
	}
	const char *path = getenv("ONLOAD_CORE");
	char buf[PATH_MAX];
	if (!path || !*path) {
		/* Beside this library. */
		Dl_info di;
		if (dladdr((void *)load_core, &di) && di.dli_fname) {
			snprintf(buf, sizeof buf, "%s", di.dli_fname);
			char *slash = strrchr(buf, '/');
			if (slash)
				snprintf(slash + 1, sizeof buf - (slash + 1 - buf), "libonload-core.so");
			else
				snprintf(buf, sizeof buf, "libonload-core.so");
			path = buf;
		} else {
			path = "libonload-core.so";
		}
	}
	in_core = 1;
	/* The Go runtime's threads start with the signal mask of the thread
	 * that loads it, less the signals it cannot do without (synchronous
	 * faults, its preemption signal): with the program's signals blocked
	 * here, they are delivered to the program's threads only, and never
	 * run its handlers on a thread of Go's, from which a socket call
	 * would re-enter the runtime. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	loading = 1;
	void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	loading = 0;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	int ok = lib != NULL;
#define SYM(name) do { if (ok && !(*(void **)&core.name = dlsym(lib, "onl_" #name))) ok = 0; } while (0)
	SYM(listen); SYM(connect); SYM(accept); SYM(recv); SYM(send); SYM(kick);
	SYM(events); SYM(ready); SYM(arm); SYM(arm_ready); SYM(disarm_ready); SYM(disarm); SYM(irq_fd); SYM(remote_fd); SYM(take_remote); SYM(thread); SYM(resched); SYM(spin_ns); SYM(try_spin);
	SYM(end_spin); SYM(close); SYM(shutdown);
	SYM(setopt); SYM(addrs); SYM(sockerr); SYM(unread); SYM(tcpinfo);
	SYM(handover_info); SYM(handover); SYM(handed_over); SYM(exit); SYM(own_stack);
#undef SYM
	Dl_info ci;
	if (ok && dladdr((void *)core.listen, &ci))
		core_base = ci.dli_fbase;
	in_core = 0;
	if (sig_held)
		run_held();
	if (!ok) {
		logf_("cannot load the core %s (%s): sockets use the kernel; set ONLOAD_CORE to its path",
		      path, lib ? "missing symbols" : dlerror());
		core_state = -1;
	} else {
		core_state = 1;
		atexit(exit_close);
		catch_ends();
	}
	pthread_mutex_unlock(&load_mu);
	return core_state;
}

/* t_sigstack counts the program's handlers running on the thread's
 * signal stack (on_signal). A socket call from one of them enters Go,
 * which runs it on a goroutine's stack: a signal that came in there would
 * be given its frame at the top of the signal stack again (the kernel
 * goes by where the thread is, and the thread is not on the signal stack
 * then), over the frames of the handler that is running there, which
 * then crashed as it returned. The Go runtime's own preemption signal
 * did it now and then; another signal of the program's, every time it
 * came at that moment. So such a call is made with every signal
 * blocked, and those that came meanwhile arrive as it returns, on the
 * signal stack below the handler's frames, as the kernel nests them. */
static __thread int t_sigstack;
static __thread sigset_t t_sigstack_mask; /* the mask to restore (core_leave) */

static inline void core_enter(void)
{
	if (t_sigstack) {
		/* Not the faults: one of Go's own would end the process. */
		sigset_t all;
		sigfillset(&all);
		for (int sig = 1; sig < 32; sig++)
			if (fault_sig(sig))
				sigdelset(&all, sig);
		pthread_sigmask(SIG_BLOCK, &all, &t_sigstack_mask);
	}
	if (!t_alt)
		thread_altstack();
	in_core = 1;
}

static inline void core_leave(void)
{
	in_core = 0;
	if (t_sigstack)
		pthread_sigmask(SIG_SETMASK, &t_sigstack_mask, NULL);
	if (sig_held)
		run_held();
}

/* Calls into the core mark the thread: a signal that comes meanwhile is
 * held until the call is done (on_signal), so that its handler, which
 * may touch a socket, never re-enters Go. */
#define CORE(call) ({ core_enter(); __typeof__(call) r_ = (call); core_leave(); r_; })
#define CORE_VOID(call) do { core_enter(); call; core_leave(); } while (0)

/* exit_close runs at the program's exit (atexit, so before the core's
 * library is torn down), at _exit, and at a signal that ends the process
 * (end_by_signal): on a stack of the process's own it closes the sockets
 * left open as the kernel does, and serves the stack until they have
 * delivered what was written and their FIN, for at most a second
 * (onl_exit); once the process is gone nothing else would, and a peer
 * that was not sending never learned that the connection ended. A stack
 * from onloadd is onloadd's to finish. A child forked after the core
 * loaded leaves its parent's stack alone: Go cannot run there. Only the
 * first end closes (ending); a thread that ends the process while
 * another closes waits for it (end_by_signal). */
static int ending;		   /* a thread has begun closing (exit_close) */
static __thread int t_ending;	   /* this thread did */
static void handover_at_exit(void);

static void exit_close(void)
{
	if (core_state != 1 || after_fork || in_core || __atomic_exchange_n(&ending, 1, __ATOMIC_SEQ_CST))
		return;
	t_ending = 1;
	/* A signal meanwhile would end the process half way. */
	sigset_t all, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	handover_at_exit();
	CORE_VOID(core.exit());
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* _exit ends the process at once, without the atexit handlers, but the
 * kernel still closes its sockets: so does exit_close. (exit's own call
 * of _exit is libc's, inside libc, and does not come here.) */
EXPORT void _exit(int status)
{
	exit_close();
	if (real__exit)
		real__exit(status);
	for (;;)
		syscall(SYS_exit_group, status);
}
EXPORT void _Exit(int status) __attribute__((alias("_exit")));

/* ---- the descriptor table ------------------------------------------ */

enum {
	K_NONE,	   /* not ours: libc */
	K_TCP,	   /* a TCP/IPv4 socket the core has not seen */
	K_OURS,	   /* accelerated */
	K_EPOLL,   /* an epoll instance */
};

struct ep;

struct fdent {
	uint8_t kind;
	uint8_t nonblock;   /* O_NONBLOCK as the program set it (K_OURS) */
	uint8_t listening;  /* listens (also in the kernel) */
	uint8_t tried;	    /* the core declined it */
	union {
		int h;		    /* the core's handle (K_OURS) */
		uint32_t epgen;	    /* K_EPOLL: which epoll instance (wait_block) */
	};
	uint32_t rd_eagain, wr_eagain; /* reads/writes that found nothing: EPOLLET */
	struct ep *ep;	    /* K_EPOLL */
	/* K_OURS, a connection: its names at onloadd, for a child forked
	 * after the core loaded to ask for its handover (prepare_fork). */
	uint8_t ho_ok;
	uint32_t ho_stack, ho_sock;
	/* K_TCP: made by socket() here (fresh: its options are the
	 * kernel's defaults), and whether the program set an option on it
	 * since (copy_options). */
	uint8_t fresh, opts_set;
};

static struct fdent *fdt;
static int nfdt;
static int *hrefs;	    /* by handle: descriptors naming it (dup) */
#define MAX_HANDLES (1 << 17)

static inline struct fdent *ent(int fd)
{
	return (unsigned)fd < (unsigned)nfdt ? &fdt[fd] : NULL;
}

static inline struct fdent *ours(int fd)
{
	if ((unsigned)fd < NFAST && !((__atomic_load_n(&maybe_ours[fd >> 6], __ATOMIC_RELAXED) >> (fd & 63)) & 1))
		return NULL;
	struct fdent *e = ent(fd);
	return e && e->kind == K_OURS ? e : NULL;
}

static int refuse_after_fork(void)
{
	static int logged;
	if (!logged) {
		logged = 1;
		logf_("an accelerated socket was used in a child forked after the stack loaded, "
		      "and it could not be handed over to the kernel (that needs a stack from onloadd: "
		      "run onloadd serve; ONLOAD_LOG=debug says more): the call fails with EOPNOTSUPP");
	}
	errno = EOPNOTSUPP;
	return -1;
}

/* In a child forked after the core loaded, a connection is handed over
 * to the kernel at its first use: e becomes NULL, and the call goes to
 * the kernel. */
#define CHILD_TAKES(fd, e) do { \
	if ((e) && after_fork && !(e)->listening && child_takes((fd), (e)) == 0) (e) = NULL; \
} while (0)
static int child_takes(int fd, struct fdent *e);

/* A call on an accelerated socket: the core must be usable from here. */
#define CHECK_USABLE() do { \
	if (after_fork) return refuse_after_fork(); \
	if (in_core) { errno = EINTR; return -1; } \
} while (0)

/* set_ours makes fd name handle h; nonblock is O_NONBLOCK as the program
 * set it, knb whether the kernel socket is non-blocking already (it is
 * made so otherwise: we do the waiting). */
static void set_ours(int fd, int h, int nonblock, int knb, int listening)
{
	struct fdent *e = ent(fd);
	if (!e)
		return;
	memset(e, 0, sizeof *e);
	mark_ours(fd, 1);
	e->kind = K_OURS;
	e->h = h;
	e->nonblock = nonblock;
	e->listening = listening;
	if ((unsigned)h < MAX_HANDLES)
		__atomic_add_fetch(&hrefs[h], 1, __ATOMIC_RELAXED);
	if (knb)
		return;
	int fl = real_fcntl(fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		real_fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void epoll_forget(int fd, int h);
static void ep_free(struct ep *ep);
static void kreg_forget(int fd);
static void kreg_take(int fd, struct fdent *fe);

/* drop forgets fd's entry; the core's socket closes with its last fd. */
static void drop(int fd)
{
	struct fdent *e = ent(fd);
	if (!e || e->kind == K_NONE)
		return;
	if (e->kind == K_OURS) {
		int h = e->h;
		epoll_forget(fd, h);
		e->kind = K_NONE;
		mark_ours(fd, 0);
		if (!after_fork && (unsigned)h < MAX_HANDLES &&
		    __atomic_sub_fetch(&hrefs[h], 1, __ATOMIC_RELAXED) == 0)
			CORE_VOID(core.close(h));
	} else if (e->kind == K_EPOLL) {
		ep_free(e->ep);
	} else if (e->kind == K_TCP) {
		kreg_forget(fd);
	}
	memset(e, 0, sizeof *e);
}

/* ---- handover to the kernel -------------------------------------------
 *
 * A connection the kernel has taken over (TCP_REPAIR, done by onloadd or
 * by the core: docs/ARCHITECTURE.md, "Handover") lives on the fd the
 * program holds, its kernel socket: every fd naming it becomes the
 * kernel's again (kernel_now_locked). An accelerated connection's kernel
 * socket is never connected in the kernel otherwise, so getpeername
 * succeeding on it says the handover happened: a process learns so from
 * the core's EBADF (its socket left the stack), or from its error and
 * hangup in a wait. */

static void epoll_to_kernel(int fd, int h);

/* kernel_now_locked makes every fd naming handle h the kernel's: the
 * program's O_NONBLOCK back, its epoll registrations moved to the
 * kernel's sets. Under mu. */
static void kernel_now_locked(int h)
{
	int nb = -1;
	for (int fd = 0; fd < nfdt; fd++) {
		struct fdent *e = &fdt[fd];
		if (e->kind != K_OURS || e->h != h)
			continue;
		if (nb < 0) {
			nb = e->nonblock;
			int fl = real_fcntl(fd, F_GETFL);
			if (fl >= 0 && !nb)
				real_fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
		}
		epoll_to_kernel(fd, h);
		e->kind = K_NONE;
		mark_ours(fd, 0);
		memset(e, 0, sizeof *e);
		if (!after_fork && (unsigned)h < MAX_HANDLES &&
		    __atomic_sub_fetch(&hrefs[h], 1, __ATOMIC_RELAXED) == 0)
			CORE_VOID(core.close(h));
	}
}

/* kernel_now is kernel_now_locked for entry e's handle, if e is still
 * accelerated. */
static void kernel_now(struct fdent *e)
{
	pthread_mutex_lock(&mu);
	if (e->kind == K_OURS)
		kernel_now_locked(e->h);
	pthread_mutex_unlock(&mu);
}

/* kernel_took: the core no longer has connection fd's socket; if a
 * handover took it, fd is the kernel's from then on (1). The handover
 * takes the core's socket first, then connects the kernel socket in
 * repair mode (the kernel answers TCP_REPAIR_WINDOW only then), then
 * ends repair mode: wait for that, up to 10 s. */
static int kernel_took(int fd)
{
	struct fdent *ke = ent(fd);
	int h = ke && ke->kind == K_OURS ? ke->h : 0, done = 0;
	for (int i = 0; i < 200000 && !done; i++) {
		struct sockaddr_in sa;
		socklen_t l = sizeof sa;
		char w[20];
		socklen_t wl = sizeof w;
		if (real_getpeername(fd, (struct sockaddr *)&sa, &l) == 0) {
			done = real_getsockopt(fd, IPPROTO_TCP, TCP_REPAIR_WINDOW, w, &wl) < 0; /* out of repair mode */
		} else if (h <= 0 || after_fork || core_state != 1 || !CORE(core.handed_over(h))) {
			return 0; /* not handed over: the connection is gone */
		}
		if (!done)
			usleep(50);
	}
	if (!done)
		return 0;
	pthread_mutex_lock(&mu);
	struct fdent *e = ent(fd);
	if (e && e->kind == K_OURS) {
		debugf("fd %d: the kernel has taken the connection over", fd);
		kernel_now_locked(e->h);
	}
	pthread_mutex_unlock(&mu);
	return 1;
}

/* ctl_call sends onloadd one request (msg, JSON) on control connection
 * s, with fd beside it if fd >= 0, and reads the reply into rep: 0, or
 * -1 if it failed or says why not. */
static int ctl_call(int s, const char *msg, int fd, char *rep, size_t n)
{
	struct iovec iov = {(void *)msg, strlen(msg)};
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int))];
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	if (fd >= 0) {
		memset(&u, 0, sizeof u);
		mh.msg_control = u.b;
		mh.msg_controllen = sizeof u.b;
		struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof fd);
	}
	snprintf(rep, n, "no reply");
	if (real_sendmsg(s, &mh, MSG_NOSIGNAL) < 0) {
		snprintf(rep, n, "send: %s", strerror(errno));
		return -1;
	}
	ssize_t r = real_recv(s, rep, n - 1, 0);
	if (r <= 0) {
		snprintf(rep, n, "onloadd's reply: %s", r < 0 ? strerror(errno) : "connection closed");
		return -1;
	}
	rep[r] = 0;
	return strstr(rep, "\"error\"") ? -1 : 0;
}

static char ho_path[108]; /* onloadd's control socket (prepare_fork) */
static pid_t ho_parent;	  /* the process that forked (prepare_fork) */

/* child_takes: a child forked after the core loaded (which cannot run
 * it) uses inherited connection fd: onloadd hands it over to the kernel,
 * and fd is the kernel's (0). -1 if that cannot be done: the call is
 * refused (refuse_after_fork). */
static int child_takes(int fd, struct fdent *e)
{
	/* The kernel may have it already: the parent handed it over as it
	 * exited (handover_at_exit), or onloadd did. */
	if (!e->listening && kernel_took(fd))
		return 0;
	if (!e->ho_ok || !ho_path[0] || e->listening) {
		debugf("fd %d: a child cannot hand it over: %s", fd,
		       e->listening ? "a listener" : "its parent found nowhere to ask (ONLOAD_LOG=debug in the parent says why)");
		return -1;
	}
	if (ho_path[0] == '@' && getppid() != ho_parent) {
		/* The parent served the handover of its own stack, and is gone
		 * (the service's socket, which this child inherited, would take
		 * the request and never answer). */
		logf_("fd %d: a child forked after the stack loaded could not have its inherited connection handed over to the kernel: "
		      "its parent, whose stack it was, has exited without handing it over", fd);
		return -1;
	}
	int s = real_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	/* onloadd's control socket, or "@name": the parent's own service
	 * (an abstract address) for a stack it made. */
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	snprintf(sun.sun_path, sizeof sun.sun_path, "%s", ho_path);
	socklen_t sl = sizeof sun;
	if (ho_path[0] == '@') {
		sun.sun_path[0] = 0;
		sl = offsetof(struct sockaddr_un, sun_path) + strlen(ho_path);
	}
	struct timeval tv = {30, 0};
	real_setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	real_setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	char msg[256], rep[1024];
	int ok = real_connect(s, (struct sockaddr *)&sun, sl) == 0;
	if (!ok)
		snprintf(rep, sizeof rep, "connect to %s: %s", ho_path, strerror(errno));
	if (ok) {
		snprintf(msg, sizeof msg, "{\"v\":1,\"seq\":1,\"op\":\"hello\",\"hello\":{\"program\":\"onload child %d\"}}", getpid());
		ok = ctl_call(s, msg, -1, rep, sizeof rep) == 0;
	}
	if (ok) {
		snprintf(msg, sizeof msg, "{\"v\":1,\"seq\":2,\"op\":\"handover\",\"handover\":{\"stack\":%u,\"sock\":%u}}",
			 e->ho_stack, e->ho_sock);
		ok = ctl_call(s, msg, fd, rep, sizeof rep) == 0;
	}
	real_close(s);
	if (!ok) {
		logf_("fd %d: a child forked after the stack loaded could not have its inherited connection handed over to the kernel: %s", fd, rep);
		return -1;
	}
	debugf("fd %d: handed over to the kernel, for a child forked after the stack loaded", fd);
	kernel_now(e);
	return 0;
}

/* prepare_fork runs in the parent before a fork: a child forked after
 * the core loaded hands an inherited connection over at its first use
 * (child_takes), and needs its names at onloadd, which only the core
 * knows. */
static int forked_after_core; /* prepare_fork ran with the core loaded */

static void prepare_fork(void)
{
	if (core_state != 1 || in_core || !fdt)
		return;
	forked_after_core = 1;
	if (!after_fork)
		ho_parent = getpid();
	pthread_mutex_lock(&mu);
	for (int fd = 0; fd < nfdt; fd++) {
		struct fdent *e = &fdt[fd];
		if (e->kind != K_OURS || e->listening || e->ho_ok)
			continue;
		char path[sizeof ho_path];
		if (CORE(core.handover_info(e->h, &e->ho_stack, &e->ho_sock, path, sizeof path)) == 0) {
			e->ho_ok = 1;
			memcpy(ho_path, path, sizeof ho_path);
		}
	}
	pthread_mutex_unlock(&mu);
}

/* ---- waiting ---------------------------------------------------------- */

static pthread_key_t thread_key;
static __thread int t_efd = -1;
/* The thread's own epoll set for blocking in epoll_wait (wait_block):
 * its eventfd, the stack's interrupt fd (EPOLLEXCLUSIVE) and the
 * program's epoll fd t_ep_prog of instance t_ep_gen. */
static __thread int t_ep = -1, t_ep_prog = -1;
static __thread uint32_t t_ep_gen;
static uint32_t epoll_gen; /* numbers the epoll instances (fdent.epgen) */

/* waiter_threads counts the threads that have waited on the stack, with
 * a timeout other than 0 (t_waiter): with two or more, a spinner yields
 * (SPIN_YIELD_NS). */
static int waiter_threads;
static __thread char t_waiter;

/* thread_ends registers the thread for thread_exit (once). */
static __thread char t_keyed;

static inline void thread_ends(void)
{
	if (!t_keyed) {
		t_keyed = 1;
		pthread_setspecific(thread_key, (void *)1);
	}
}

static inline void count_waiter(void)
{
	if (!t_waiter) {
		t_waiter = 1;
		__atomic_add_fetch(&waiter_threads, 1, __ATOMIC_RELAXED);
		thread_ends();
	}
}

/* owe_kick notes that this thread's send left frames for its next wait's
 * kick (flush_kicks), and that its exit must give the kick should no
 * wait come (thread_exit). */
static inline void owe_kick(void)
{
	kick_owed = 1;
	thread_ends();
}

static void thread_exit(void *p)
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
	if (t_efd >= 0)
		real_close(t_efd);
	if (t_waiter) {
		t_waiter = 0;
		__atomic_sub_fetch(&waiter_threads, 1, __ATOMIC_RELAXED);
	}
	if (t_ep >= 0)
		real_close(t_ep);
	t_efd = t_ep = t_ep_prog = -1;
	stack_t ss;
	if (t_alt_mem && sigaltstack(NULL, &ss) == 0 && ss.ss_sp == t_alt_mem && !(ss.ss_flags & SS_ONSTACK)) {
		ss.ss_flags = SS_DISABLE;
		if (sigaltstack(&ss, NULL) == 0)
			munmap(t_alt_mem, ALTSTACK);
	}
	t_alt_mem = NULL;
}

/* thread_altstack runs at a thread's first call into the core: the core
 * counts the thread (onl_thread) and the thread gets a signal stack. */
static void install_altstack(void)
{
	stack_t ss;
	if (sigaltstack(NULL, &ss) < 0 || !(ss.ss_flags & SS_DISABLE))
		return; /* the program's */
	void *m = mmap(NULL, ALTSTACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
	if (m == MAP_FAILED)
		return;
	ss = (stack_t){.ss_sp = m, .ss_size = ALTSTACK};
	if (sigaltstack(&ss, NULL) < 0) {
		munmap(m, ALTSTACK);
		return;
	}
	t_alt_mem = m;
	thread_ends();
}

static void thread_altstack(void)
{
	t_alt = 1;
	/* The stack first: the thread's first call into Go installs the
	 * runtime's own 32 KiB signal stack on a thread that has none, and
	 * this one was then never installed. */
	install_altstack();
	in_core = 1;
	core.thread();
	in_core = 0;
}

static int thread_efd(void)
{
	if (t_efd < 0) {
		t_efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		thread_ends();
	}
	return t_efd;
}

/* thread_ep is the thread's epoll set with the program's epoll fd epfd
 * in it, or -1 (the caller blocks with ppoll). The stack's interrupt fd
 * is in every thread's set with EPOLLEXCLUSIVE, so that a frame's
 * arrival wakes one of the threads blocked in epoll_wait, not all (the
 * thundering herd ppoll gives: memcached's threads woke together at
 * every frame and fought for the stack). The program's epoll fd is
 * registered again when the thread waits on another one, or on a new
 * instance under the same number (epgen). */
static int thread_ep(int epfd)
{
	struct fdent *ee = ent(epfd);
	if (!ee || ee->kind != K_EPOLL)
		return -1;
	if (t_ep < 0) {
		int efd = thread_efd();
		if (efd < 0 || (t_ep = real_epoll_create1(EPOLL_CLOEXEC)) < 0)
			return t_ep = -1;
		struct epoll_event a = {.events = EPOLLIN, .data.fd = efd};
		struct epoll_event b = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = irq_fd};
		struct epoll_event c = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.fd = remote_fd};
		if (real_epoll_ctl(t_ep, EPOLL_CTL_ADD, efd, &a) < 0 ||
		    real_epoll_ctl(t_ep, EPOLL_CTL_ADD, irq_fd, &b) < 0 ||
		    (remote_fd >= 0 && real_epoll_ctl(t_ep, EPOLL_CTL_ADD, remote_fd, &c) < 0)) {
			real_close(t_ep);
			return t_ep = -1;
		}
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

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static short to_poll(int ev)
{
	short r = 0;
	if (ev & ONL_READABLE) r |= POLLIN | POLLRDNORM;
	if (ev & ONL_WRITABLE) r |= POLLOUT | POLLWRNORM;
	if (ev & ONL_ERROR) r |= POLLERR;
	if (ev & ONL_HANGUP) r |= POLLHUP;
	if (ev & ONL_RDHUP) r |= POLLRDHUP;
	return r;
}

static int from_poll(short ev)
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
static __thread int sig_norestart;

/* t_handled counts the program's handlers run on the thread: a wait that
 * a signal interrupted tells by it whether the signal was the program's
 * (EINTR) or the Go runtime's (a wake-up like any). */
static __thread unsigned t_handled;

/*
 * A wait: spin on the stack for the profile's spin time (as many threads
 * at a time as ONLOAD_SPIN_THREADS, by default one: each poll serves
 * every socket), then arm the sockets with the thread's
 * eventfd and block in the kernel on it beside the program's own fds.
 */
struct wait {
	int64_t deadline; /* -1: none */
	int64_t spin_end;
	int64_t yield_at; /* the spin's next sched_yield (SPIN_YIELD_NS) */
	int spinning;
};

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
#define RESCHED_BUSY_NS 8000000
static __thread int64_t t_resched;

static inline void keep_p(int64_t now, int64_t every)
{
	if (now - t_resched >= every && core_state == 1 && !after_fork && !in_handler) {
		t_resched = now;
		CORE_VOID(core.resched());
	}
}

static void wait_begin(struct wait *w, int64_t timeout_ns)
{
	if (timeout_ns != 0)
		count_waiter();
	flush_kicks();
	int64_t now = now_ns();
	keep_p(now, RESCHED_BUSY_NS);
	w->deadline = timeout_ns < 0 ? -1 : now + timeout_ns;
	w->spinning = 0;
	if (timeout_ns != 0 && spin_ns > 0 && CORE(core.try_spin())) {
		w->spinning = 1;
		w->spin_end = now_ns() + spin_ns;
		w->yield_at = 0; /* at once: see SPIN_YIELD_NS */
	}
}

static void wait_end(struct wait *w)
{
	if (w->spinning)
		CORE_VOID(core.end_spin());
	w->spinning = 0;
}

/* wait_over reports, after a check that found nothing, that the time is
 * up; *now is the time, where wait_block needs it. */
static int wait_over(struct wait *w, int64_t *now)
{
	*now = w->deadline >= 0 || w->spinning ? now_ns() : 0;
	return w->deadline >= 0 && *now >= w->deadline;
}

/* log_wait_off: the stack cannot wake a thread at its ready log's next
 * entry (it is shared with other processes): epoll arms each member. */
static int log_wait_off;

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
static int wait_block(struct wait *w, int64_t now, int *hs, int *want, int *evs, unsigned *edges, int k,
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
	int efd = thread_efd();
	/* A thread that waits on listeners only (memcached's and nginx's
	 * accepting threads) leaves the interrupt to those that wait on
	 * connections, and to the Sleeper: with it, it was the thread every
	 * frame woke, to hand the frame to another. */
	int direct = irq_fd >= 0 && conns;
	/* epoll_pwait2 (glibc 2.35) takes the deadline to the nanosecond;
	 * without it, ppoll. */
	int tep = direct && epfd >= 0 && real_epoll_pwait2 ? thread_ep(epfd) : -1;
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
	if (tep >= 0) {
		struct epoll_event got[4];
		r = real_epoll_pwait2(tep, got, 4, tsp, mp);
		for (int i = 0; i < r; i++) {
			irq |= got[i].data.fd == irq_fd;
			woke |= got[i].data.fd == efd;
			remote |= got[i].data.fd == remote_fd;
			prog |= got[i].data.fd == epfd;
		}
	} else {
		int n = np;
		p[n++] = (struct pollfd){.fd = efd, .events = POLLIN};
		if (direct)
			p[n++] = (struct pollfd){.fd = irq_fd, .events = POLLIN};
		if (remote_fd >= 0)
			p[n++] = (struct pollfd){.fd = remote_fd, .events = POLLIN};
		r = real_ppoll(p, n, tsp, mp);
		woke = r > 0 && (p[np].revents & POLLIN);
		irq = direct && r > 0 && (p[np + 1].revents & POLLIN);
		remote = remote_fd >= 0 && r > 0 && (p[n - 1].revents & POLLIN);
		for (int i = 0; r > 0 && i < np; i++)
			prog |= p[i].revents != 0;
	}
	int saved = errno;
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

/*
 * wait_poll is poll() over fds where some are ours. Ours are checked
 * through the core (a listener also in the kernel: it serves clients
 * that come through loopback); the rest with the kernel. timeout_ns < 0
 * waits for ever.
 */
/* taken_over: of the k accelerated fds (fds[idx[j]]) whose core events
 * are evs[j], those whose socket the core no longer has (error and
 * hangup) may have been taken over by the kernel; 1 if any was. */
static int taken_over(const struct pollfd *fds, const int *idx, const int *evs, int k)
{
	int any = 0;
	for (int j = 0; j < k; j++)
		if ((evs[j] & (ONL_ERROR | ONL_HANGUP)) == (ONL_ERROR | ONL_HANGUP) && kernel_took(fds[idx[j]].fd))
			any = 1;
	return any;
}

static int wait_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask)
{
	int hs_buf[64], want_buf[64], ev_buf[64], idx_buf[64];
	struct pollfd tmp_buf[67]; /* and wait_block's three */
	int *hs = hs_buf, *want = want_buf, *evs = ev_buf, *idx = idx_buf;
	struct pollfd *tmp = tmp_buf;
	void *heap = NULL;
	if (n >= 64) {
		heap = malloc((n + 2) * (4 * sizeof(int) + sizeof(struct pollfd)));
		if (!heap) {
			errno = ENOMEM;
			return -1;
		}
		hs = heap; want = hs + n; evs = want + n; idx = evs + n;
		tmp = (struct pollfd *)(idx + n + 4);
	}
	int k = 0, nkernel = 0, conns = 0;
	for (nfds_t i = 0; i < n; i++) {
		tmp[i] = fds[i];
		tmp[i].revents = 0;
		struct fdent *e = ours(fds[i].fd);
		if (e) {
			conns |= !e->listening;
			hs[k] = e->h;
			want[k] = from_poll(fds[i].events);
			idx[k++] = i;
			if (!e->listening)
				tmp[i].fd = -1;
			else
				nkernel++;
		} else if (fds[i].fd >= 0) {
			nkernel++;
		}
	}
	struct wait w;
	wait_begin(&w, timeout_ns);
	int ret;
	for (;;) {
		int ready = 0;
		CORE_VOID(core.events(hs, evs, NULL, k, w.spinning));
		if (taken_over(fds, idx, evs, k)) {
			/* Those fds are the kernel's now: wait again. */
			wait_end(&w);
			free(heap);
			return wait_poll(fds, n, timeout_ns, mask);
		}
		if (nkernel > 0 && check_poll(tmp, n) < 0) {
			ret = -1;
			break;
		}
		for (nfds_t i = 0; i < n; i++)
			fds[i].revents = tmp[i].revents;
		for (int j = 0; j < k; j++) {
			struct pollfd *p = &fds[idx[j]];
			p->revents |= to_poll(evs[j]) & (p->events | POLLERR | POLLHUP);
		}
		for (nfds_t i = 0; i < n; i++)
			ready += fds[i].revents != 0;
		int64_t now;
		if (ready > 0 || wait_over(&w, &now)) {
			ret = ready;
			break;
		}
		if (wait_block(&w, now, hs, want, evs, NULL, k, NULL, tmp, n, -1, conns, mask) < 0) {
			ret = -1;
			break;
		}
		for (nfds_t i = 0; i < n; i++)
			tmp[i].revents = 0;
	}
	wait_end(&w);
	free(heap);
	return ret;
}

/* wait_one waits for fd (ours) to be ready for events; 0, or -1 with
 * errno (EINTR: a signal whose handler does not restart). */
static int wait_one(int fd, short events)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		sig_norestart = 0;
		int r = wait_poll(&p, 1, -1, NULL);
		if (r > 0)
			return 0;
		if (r < 0 && errno == EINTR && !sig_norestart)
			continue;
		return -1;
	}
}

/* blocked: a call on fd found nothing to do (EAGAIN). It counts that
 * for EPOLLET, and waits for ev unless the call must not block. 1: try
 * again; 0: the call ends, with errno (EAGAIN, EINTR) if it did nothing. */
static int blocked(struct fdent *e, int fd, int flags, short ev)
{
	if (ev == POLLIN)
		e->rd_eagain++;
	else
		e->wr_eagain++;
	if (e->nonblock || (flags & MSG_DONTWAIT)) {
		errno = EAGAIN;
		return 0;
	}
	return wait_one(fd, ev) == 0;
}

/* ---- the calls ------------------------------------------------------- */

static void child_after_fork(void);
static void prepare_fork(void);

/* adopt_inherited takes the TCP/IPv4 sockets the program inherited (from
 * the program it was exec'd from: nginx's binary upgrade passes its
 * listening sockets so; systemd's socket activation) as a socket() of its
 * own: a listener is accelerated at its first accept, poll or epoll_ctl,
 * an unconnected socket at its connect. A connected one stays the
 * kernel's: the previous program handed its accelerated connections over
 * to the kernel before the exec (handover_for_exec). */
static void adopt_inherited(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		return;
	int dfd = dirfd(d);
	struct dirent *de;
	while ((de = readdir(d))) {
		char *end;
		long fd = strtol(de->d_name, &end, 10);
		if (*end || end == de->d_name || fd == dfd)
			continue;
		struct fdent *e = ent((int)fd);
		int v;
		socklen_t l = sizeof v;
		if (!e || real_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0 || v != AF_INET)
			continue;
		l = sizeof v;
		if (real_getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) < 0 || v != SOCK_STREAM)
			continue;
		l = sizeof v;
		if (real_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) < 0 || v != IPPROTO_TCP)
			continue;
		l = sizeof v;
		int listening = real_getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) == 0 && v;
		if (!listening) {
			struct sockaddr_in sa;
			l = sizeof sa;
			if (real_getpeername(fd, (struct sockaddr *)&sa, &l) == 0 || errno != ENOTCONN)
				continue;
		}
		memset(e, 0, sizeof *e);
		e->kind = K_TCP;
		e->listening = listening;
		debugf("fd %ld: inherited %s", fd, listening ? "listening" : "unconnected");
	}
	closedir(d);
}

__attribute__((constructor)) static void init(void)
{
#define LOAD(name) *(void **)&real_##name = dlsym(RTLD_NEXT, #name)
	LOAD(socket); LOAD(listen); LOAD(accept); LOAD(accept4);
	LOAD(connect); LOAD(read); LOAD(write); LOAD(readv); LOAD(writev);
	LOAD(recv); LOAD(recvfrom); LOAD(recvmsg); LOAD(recvmmsg); LOAD(send);
	LOAD(sendto); LOAD(sendmsg); LOAD(sendmmsg); LOAD(sendfile);
	LOAD(close); LOAD(shutdown); LOAD(getsockopt); LOAD(setsockopt);
	LOAD(getsockname); LOAD(getpeername); LOAD(fcntl); LOAD(ioctl);
	LOAD(dup); LOAD(dup2); LOAD(dup3); LOAD(poll); LOAD(ppoll);
	LOAD(select); LOAD(pselect); LOAD(epoll_create); LOAD(epoll_create1);
	LOAD(epoll_ctl); LOAD(epoll_wait); LOAD(epoll_pwait); LOAD(epoll_pwait2);
	LOAD(fork); LOAD(sigaction); LOAD(execve); LOAD(execvpe); LOAD(fexecve);
	LOAD(_exit);
#undef LOAD
	/* A signal the program inherited ignored is ignored in prog_act too
	 * (on_pipe and catch_ends read it there): the Go runtime installs a
	 * handler of its own for SIGPIPE, and the program's disposition is
	 * then ours to remember. */
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction cur;
		if ((held_sig(sig) || fault_sig(sig)) && real_sigaction(sig, NULL, &cur) == 0 && cur.sa_handler == SIG_IGN)
			prog_act[sig].sa_handler = SIG_IGN;
	}
	const char *lv = getenv("ONLOAD_LOG");
	log_debug = lv && strcmp(lv, "debug") == 0;
	const char *dis = getenv("ONLOAD_DISABLE");
	if (dis && strcmp(dis, "1") == 0)
		return; /* an empty table: everything goes to libc */
	struct rlimit rl;
	nfdt = 65536;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max > (rlim_t)nfdt)
		nfdt = rl.rlim_max > (1 << 20) ? (1 << 20) : (int)rl.rlim_max;
	fdt = calloc(nfdt, sizeof *fdt);
	hrefs = calloc(MAX_HANDLES, sizeof *hrefs);
	if (!fdt || !hrefs) {
		free(fdt);
		fdt = NULL;
		nfdt = 0;
		return;
	}
	pthread_key_create(&thread_key, thread_exit);
	pthread_atfork(prepare_fork, NULL, child_after_fork);
	adopt_inherited();
}

static void uncatch_ends(void);

static void child_after_fork(void)
{
	if (core_state == 1) {
		after_fork = 1;
		uncatch_ends();
	}
	/* The parent thread's eventfd and epoll set are shared: make our own.
	 * The child has one thread, which has not blocked yet. */
	t_efd = t_ep = t_ep_prog = -1;
	t_waiter = 0;
	waiter_threads = 0;
}

/* ---- exec ------------------------------------------------------------
 *
 * A connection the program passes across exec (not close-on-exec) is
 * handed over to the kernel first: the new program, with or without the
 * shim, finds a kernel connection on the fd. If the exec fails, the
 * connections stay the kernel's, and work. */

/* hand_over gives connection fd (entry e) to the kernel, for why: 0, or
 * the core's negated errno. */
static int hand_over(int fd, struct fdent *e, const char *why)
{
	int r = CORE(core.handover(e->h, fd));
	if (r == 0) {
		debugf("fd %d: handed over to the kernel %s", fd, why);
		kernel_now(e);
	}
	return r;
}

static void handover_for_exec(void)
{
	if (!fdt || core_state != 1 || in_core)
		return;
	for (int fd = 0; fd < nfdt; fd++) {
		struct fdent *e = &fdt[fd];
		if (e->kind != K_OURS || e->listening)
			continue;
		int fl = real_fcntl(fd, F_GETFD);
		if (fl < 0 || (fl & FD_CLOEXEC))
			continue;
		if (after_fork) {
			child_takes(fd, e);
			continue;
		}
		int r = hand_over(fd, e, "for exec");
		if (r != 0)
			logf_("fd %d: its connection could not be handed over to the kernel before exec (%s): "
			      "the new program finds it unusable", fd, strerror(-r));
	}
}

/* handover_at_exit, on a stack of the process's own: a connection the
 * program left open with data still to deliver goes to the kernel, which
 * delivers it after the process is gone and then closes the connection
 * with the process's last fd on it, as it does its own sockets' (before,
 * the exit served the stack for a second at most: a peer that read
 * slowly got 3.6 MB of 4.2 and then a reset). The rest close in the
 * stack (onl_exit), which is quicker: a handover takes system calls, and
 * a connection with nothing outstanding ends within a round trip; but
 * where a child forked after the core loaded may hold them, every one
 * is handed over. */
static void handover_at_exit(void)
{
	if (!fdt || !CORE(core.own_stack()))
		return;
	/* A child forked after the core loaded may hold the connections
	 * still, and use them after we are gone: then every one goes to the
	 * kernel, on the fd the child has too (child_takes finds it there). */
	siginfo_t si;
	int child = forked_after_core && waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) == 0;
	for (int fd = 0; fd < nfdt; fd++) {
		struct fdent *e = &fdt[fd];
		struct onl_tcpinfo ti;
		if (e->kind != K_OURS || e->listening || CORE(core.tcpinfo(e->h, &ti)) < 0 ||
		    (!child && ti.unacked == 0 && ti.notsent == 0))
			continue;
		int r = hand_over(fd, e, child ? "at exit, for a child" : "at exit, with data to deliver");
		if (r != 0)
			debugf("fd %d: its connection could not be handed over to the kernel at exit (%s): it ends in the stack",
			       fd, strerror(-r));
	}
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	handover_for_exec();
	return real_execve(path, argv, envp);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	handover_for_exec();
	return real_execvpe(file, argv, envp);
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	handover_for_exec();
	return real_fexecve(fd, argv, envp);
}

extern char **environ;

EXPORT int execv(const char *path, char *const argv[]) { return execve(path, argv, environ); }
EXPORT int execvp(const char *file, char *const argv[]) { return execvpe(file, argv, environ); }

/* The list forms gather their arguments (and execle its environment). */
#define EXEC_ARGS(first, ap, argv) do { \
	size_t n_ = 1; \
	va_list c_; \
	va_copy(c_, ap); \
	while (va_arg(c_, char *)) n_++; \
	va_end(c_); \
	argv = alloca((n_ + 1) * sizeof(char *)); \
	argv[0] = (char *)(first); \
	for (size_t i_ = 1; i_ <= n_; i_++) argv[i_] = va_arg(ap, char *); \
} while (0)

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	char **argv;
	va_start(ap, arg);
	EXEC_ARGS(arg, ap, argv);
	va_end(ap);
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	char **argv;
	va_start(ap, arg);
	EXEC_ARGS(arg, ap, argv);
	va_end(ap);
	return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	char **argv;
	va_start(ap, arg);
	EXEC_ARGS(arg, ap, argv);
	char **envp = va_arg(ap, char **);
	va_end(ap);
	return execve(path, argv, envp);
}

/* vfork's child shares our memory and runs no fork handlers: a close()
 * there would close the parent's socket. Like Onload's default, it is a
 * fork (whose child handler, child_after_fork, runs: it is registered
 * with pthread_atfork, so that glibc's own forks, daemon()'s among them,
 * run it too). */
EXPORT pid_t vfork(void) { return real_fork(); }

EXPORT int socket(int domain, int type, int protocol)
{
	int fd = real_socket(domain, type, protocol);
	struct fdent *e = ent(fd);
	if (e && domain == AF_INET && (type & 0xf) == SOCK_STREAM &&
	    (protocol == 0 || protocol == IPPROTO_TCP)) {
		memset(e, 0, sizeof *e);
		e->kind = K_TCP;
		e->fresh = 1;
	}
	return fd;
}

/* The options the program set on the kernel socket before the core saw
 * it, for the engine's socket; none to read if defaults (a socket made
 * here that the program set no option on: nine getsockopt calls a
 * connection otherwise). */
static void copy_options(int fd, int h, int defaults)
{
	if (defaults)
		return;
	static const struct { int level, name, opt; } opts[] = {
		{IPPROTO_TCP, TCP_NODELAY, ONL_OPT_NODELAY},
		{IPPROTO_TCP, TCP_CORK, ONL_OPT_CORK},
		{IPPROTO_TCP, TCP_DEFER_ACCEPT, ONL_OPT_DEFER_ACCEPT},
		{SOL_SOCKET, SO_KEEPALIVE, ONL_OPT_KEEPALIVE},
		{IPPROTO_TCP, TCP_KEEPIDLE, ONL_OPT_KEEPIDLE},
		{IPPROTO_TCP, TCP_KEEPINTVL, ONL_OPT_KEEPINTVL},
		{IPPROTO_TCP, TCP_KEEPCNT, ONL_OPT_KEEPCNT},
		{IPPROTO_TCP, TCP_USER_TIMEOUT, ONL_OPT_USER_TIMEOUT},
	};
	for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
		int v = 0;
		socklen_t l = sizeof v;
		if (real_getsockopt(fd, opts[i].level, opts[i].name, &v, &l) == 0 && v)
			CORE(core.setopt(h, opts[i].opt, v));
	}
	struct linger lg;
	socklen_t l = sizeof lg;
	if (real_getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &l) == 0 && lg.l_onoff)
		CORE(core.setopt(h, ONL_OPT_LINGER, lg.l_linger));
}

static int nonblocking(int fd)
{
	int fl = real_fcntl(fd, F_GETFL);
	return fl >= 0 && (fl & O_NONBLOCK);
}

/* stack_known reads what a wait needs from the stack, once a socket is
 * accelerated (the stack exists). */
static void stack_known(void)
{
	spin_ns = CORE(core.spin_ns());
	irq_fd = CORE(core.irq_fd());
	remote_fd = CORE(core.remote_fd());
}

/* accel_listener hands a listening socket to the core, once, if it will
 * have it; the entry is K_OURS after, or not ours. */

static void accel_listener(int fd, struct fdent *e)
{
	if (e->kind != K_TCP || !e->listening || after_fork)
		return;
	pthread_mutex_lock(&mu);
	if (e->kind == K_TCP && !e->tried && load_core() == 1) {
		struct sockaddr_in sa;
		socklen_t l = sizeof sa;
		int h = 0;
		if (real_getsockname(fd, (struct sockaddr *)&sa, &l) == 0 && sa.sin_family == AF_INET)
			h = CORE(core.listen(fd, sa.sin_addr.s_addr));
		if (h > 0) {
			int nb = nonblocking(fd), defaults = e->fresh && !e->opts_set;
			set_ours(fd, h, nb, nb, 1);
			kreg_take(fd, e);
			copy_options(fd, h, defaults);
			stack_known();
			debugf("fd %d: listening, accelerated", fd);
		} else {
			kreg_forget(fd);
			e->tried = 1;
			debugf("fd %d: listening in the kernel", fd);
		}
	}
	pthread_mutex_unlock(&mu);
}

static inline struct fdent *ours_or_listener(int fd)
{
	struct fdent *e = ent(fd);
	if (e && e->kind == K_TCP && e->listening && !e->tried)
		accel_listener(fd, e);
	return e && e->kind == K_OURS ? e : NULL;
}

EXPORT int listen(int fd, int backlog)
{
	struct fdent *e = ent(fd);
	if (e && e->kind == K_OURS) {
		errno = EINVAL; /* connected */
		return -1;
	}
	int r = real_listen(fd, backlog);
	if (r == 0 && e && e->kind == K_TCP)
		e->listening = 1;
	return r;
}

EXPORT int connect(int fd, const struct sockaddr *a, socklen_t l)
{
	struct fdent *e = ent(fd);
	if (e && e->kind == K_OURS) {
		CHECK_USABLE();
		int ev;
		CORE_VOID(core.events(&e->h, &ev, NULL, 1, 0));
		errno = ev & ONL_WRITABLE ? EISCONN : EALREADY;
		return -1;
	}
	if (!e || e->kind != K_TCP || e->listening || !a || l < sizeof(struct sockaddr_in) ||
	    a->sa_family != AF_INET || after_fork || load_core() != 1)
		return real_connect(fd, a, l);
	const struct sockaddr_in *sin = (const struct sockaddr_in *)a;
	int nb = nonblocking(fd);
	int h = CORE(core.connect(fd, sin->sin_addr.s_addr, sin->sin_port));
	if (h == 0) {
		pthread_mutex_lock(&mu);
		kreg_forget(fd);
		e->kind = K_NONE;
		pthread_mutex_unlock(&mu);
		return real_connect(fd, a, l);
	}
	if (h < 0) {
		errno = -h;
		return -1;
	}
	int defaults = e->fresh && !e->opts_set;
	pthread_mutex_lock(&mu);
	set_ours(fd, h, nb, nb, 0);
	kreg_take(fd, e);
	pthread_mutex_unlock(&mu);
	copy_options(fd, h, defaults);
	stack_known();
	debugf("fd %d: connecting, accelerated", fd);
	if (nb) {
		errno = EINPROGRESS;
		return -1;
	}
	if (wait_one(fd, POLLOUT) < 0)
		return -1;
	int err = CORE(core.sockerr(h));
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

static void fill_addr(struct sockaddr *a, socklen_t *l, uint32_t ip, uint16_t port)
{
	if (!a || !l)
		return;
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = port, .sin_addr.s_addr = ip};
	memcpy(a, &sin, *l < sizeof sin ? *l : sizeof sin);
	*l = sizeof sin;
}

EXPORT int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
	struct fdent *e = ours_or_listener(fd);
	if (!e || !e->listening)
		return real_accept4(fd, a, l, flags);
	CHECK_USABLE();
	for (;;) {
		int ev;
		CORE_VOID(core.events(&e->h, &ev, NULL, 1, 0));
		if (ev & ONL_READABLE) {
			int kfd = real_socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | (flags & SOCK_CLOEXEC), 0);
			if (kfd < 0)
				return -1;
			/* The fd first: out of fds, the connection stays queued,
			 * as the kernel's does. */
			int h = CORE(core.accept(e->h, kfd));
			if (h > 0) {
				pthread_mutex_lock(&mu);
				set_ours(kfd, h, !!(flags & SOCK_NONBLOCK), 1, 0);
				pthread_mutex_unlock(&mu);
				uint32_t lip, rip;
				uint16_t lp, rp;
				if (CORE(core.addrs(h, &lip, &lp, &rip, &rp)) == 0)
					fill_addr(a, l, rip, rp);
				return kfd;
			}
			real_close(kfd);
			if (h != -EAGAIN) {
				errno = -h;
				return -1;
			}
		}
		/* Clients through loopback reach the kernel's half. */
		int k = real_accept4(fd, a, l, flags);
		if (k >= 0 || errno != EAGAIN)
			return k;
		if (!blocked(e, fd, 0, POLLIN))
			return -1;
	}
}

EXPORT int accept(int fd, struct sockaddr *a, socklen_t *l) { return accept4(fd, a, l, 0); }

static ssize_t ours_recv(struct fdent *e, int fd, void *buf, size_t n, int flags)
{
	CHILD_TAKES(fd, e);
	if (!e || e->kind != K_OURS)
		return real_recv(fd, buf, n, flags);
	CHECK_USABLE();
	if (e->listening) {
		errno = ENOTCONN;
		return -1;
	}
	size_t got = 0;
	for (;;) {
		if (e->kind != K_OURS) /* taken over while this call waited */
			return got ? (ssize_t)got : real_recv(fd, buf, n, flags);
		long r = CORE(core.recv(e->h, (char *)buf + got, n - got, flags & MSG_PEEK));
		if (r > 0) {
			got += r;
			if (!(flags & MSG_WAITALL) || got == n || (flags & MSG_PEEK))
				return got;
			continue;
		}
		if (r == 0)
			return got;
		if (r != -EAGAIN) {
			if (got)
				return got;
			if (r == -EBADF && kernel_took(fd))
				return real_recv(fd, buf, n, flags);
			errno = -r;
			return -1;
		}
		if (!blocked(e, fd, flags, POLLIN))
			return got ? (ssize_t)got : -1;
	}
}

/* ours_send queues all of buf (blocking) or what fits (non-blocking). */
static ssize_t ours_send(struct fdent *e, int fd, const void *buf, size_t n, int flags)
{
	CHILD_TAKES(fd, e);
	if (!e || e->kind != K_OURS)
		return real_send(fd, buf, n, flags);
	CHECK_USABLE();
	size_t done = 0;
	for (;;) {
		if (e->kind != K_OURS) /* taken over while this call waited */
			return done ? (ssize_t)done : real_send(fd, buf, n, flags);
		/* The frames wait for the kick that this thread's next wait
		 * gives (flush_kicks): a program answering many clients sends
		 * all its answers in one system call. */
		long r = CORE(core.send(e->h, (const char *)buf + done, n - done, 1));
		owe_kick();
		if (r > 0) {
			done += r;
			if (done == n)
				return done;
			continue;
		}
		if (r == 0 && n == 0)
			return 0;
		if (r < 0 && r != -EAGAIN) {
			if (done)
				return done;
			if (r == -EBADF && kernel_took(fd))
				return real_send(fd, buf, n, flags);
			if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
				raise(SIGPIPE); /* as the kernel does; on_pipe closes first */
			errno = -r;
			return -1;
		}
		if (!blocked(e, fd, flags, POLLOUT))
			return done ? (ssize_t)done : -1;
	}
}

EXPORT ssize_t read(int fd, void *b, size_t n)
{
	struct fdent *e = ours(fd);
	return e ? ours_recv(e, fd, b, n, 0) : real_read(fd, b, n);
}

EXPORT ssize_t write(int fd, const void *b, size_t n)
{
	struct fdent *e = ours(fd);
	return e ? ours_send(e, fd, b, n, 0) : real_write(fd, b, n);
}

EXPORT ssize_t recv(int fd, void *b, size_t n, int flags)
{
	struct fdent *e = ours(fd);
	return e ? ours_recv(e, fd, b, n, flags) : real_recv(fd, b, n, flags);
}

EXPORT ssize_t recvfrom(int fd, void *b, size_t n, int flags, struct sockaddr *a, socklen_t *l)
{
	struct fdent *e = ours(fd);
	if (!e)
		return real_recvfrom(fd, b, n, flags, a, l);
	ssize_t r = ours_recv(e, fd, b, n, flags);
	if (r >= 0 && a && l)
		*l = 0; /* TCP: no address, as the kernel */
	return r;
}

EXPORT ssize_t send(int fd, const void *b, size_t n, int flags)
{
	struct fdent *e = ours(fd);
	return e ? ours_send(e, fd, b, n, flags) : real_send(fd, b, n, flags);
}

EXPORT ssize_t sendto(int fd, const void *b, size_t n, int flags, const struct sockaddr *a, socklen_t l)
{
	struct fdent *e = ours(fd);
	return e ? ours_send(e, fd, b, n, flags) : real_sendto(fd, b, n, flags, a, l);
}

/* Small gathers go out as one send (one segment, as the kernel would
 * coalesce them); big ones an iovec at a time. */
#define GATHER 65536
static __thread char *t_gather;

static ssize_t ours_sendv(struct fdent *e, int fd, const struct iovec *iov, int cnt, int flags)
{
	size_t total = 0;
	for (int i = 0; i < cnt; i++)
		total += iov[i].iov_len;
	if (cnt == 1)
		return ours_send(e, fd, iov[0].iov_base, iov[0].iov_len, flags);
	if (total <= GATHER && (t_gather || (t_gather = malloc(GATHER)))) {
		size_t off = 0;
		for (int i = 0; i < cnt; i++) {
			memcpy(t_gather + off, iov[i].iov_base, iov[i].iov_len);
			off += iov[i].iov_len;
		}
		return ours_send(e, fd, t_gather, total, flags);
	}
	ssize_t done = 0;
	for (int i = 0; i < cnt; i++) {
		ssize_t r = ours_send(e, fd, iov[i].iov_base, iov[i].iov_len, flags);
		if (r < 0)
			return done ? done : -1;
		done += r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return done;
}

static ssize_t ours_recvv(struct fdent *e, int fd, const struct iovec *iov, int cnt, int flags)
{
	ssize_t done = 0;
	for (int i = 0; i < cnt; i++) {
		if (iov[i].iov_len == 0)
			continue;
		ssize_t r = ours_recv(e, fd, iov[i].iov_base, iov[i].iov_len, done ? flags | MSG_DONTWAIT : flags);
		if (r < 0)
			return done ? done : -1;
		done += r;
		if ((size_t)r < iov[i].iov_len)
			break;
	}
	return done;
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	struct fdent *e = ours(fd);
	return e ? ours_recvv(e, fd, iov, cnt, 0) : real_readv(fd, iov, cnt);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	struct fdent *e = ours(fd);
	return e ? ours_sendv(e, fd, iov, cnt, 0) : real_writev(fd, iov, cnt);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	struct fdent *e = ours(fd);
	if (!e)
		return real_recvmsg(fd, m, flags);
	ssize_t r = ours_recvv(e, fd, m->msg_iov, m->msg_iovlen, flags);
	if (r >= 0) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	struct fdent *e = ours(fd);
	return e ? ours_sendv(e, fd, m->msg_iov, m->msg_iovlen, flags) : real_sendmsg(fd, m, flags);
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *t)
{
	struct fdent *e = ours(fd);
	if (!e)
		return real_recvmmsg(fd, v, n, flags, t);
	unsigned int i;
	for (i = 0; i < n; i++) {
		int f = flags & ~MSG_WAITFORONE;
		if (i > 0 && (flags & MSG_WAITFORONE))
			f |= MSG_DONTWAIT;
		ssize_t r = recvmsg(fd, &v[i].msg_hdr, f);
		if (r < 0)
			return i ? (int)i : -1;
		v[i].msg_len = r;
		if (r == 0)
			return i + 1;
	}
	return i;
}

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
	struct fdent *e = ours(fd);
	if (!e)
		return real_sendmmsg(fd, v, n, flags);
	unsigned int i;
	for (i = 0; i < n; i++) {
		ssize_t r = sendmsg(fd, &v[i].msg_hdr, flags);
		if (r < 0)
			return i ? (int)i : -1;
		v[i].msg_len = r;
	}
	return i;
}

/* sendfile on an accelerated socket reads the file and sends what it
 * read. */
EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
	struct fdent *e = ours(out);
	if (!e)
		return real_sendfile(out, in, off, n);
	char buf[16384];
	size_t done = 0;
	while (done < n) {
		size_t want = n - done < sizeof buf ? n - done : sizeof buf;
		ssize_t r = off ? pread(in, buf, want, *off) : real_read(in, buf, want);
		if (r <= 0) {
			if (r < 0 && !done)
				return -1;
			break;
		}
		/* Blocking: all of it; non-blocking: what fits, and the file's
		 * offset goes back by what did not. */
		ssize_t s = ours_send(e, out, buf, r, 0);
		if (s < 0) {
			if (!off)
				lseek(in, -r, SEEK_CUR);
			if (!done)
				return -1;
			break;
		}
		done += s;
		if (off)
			*off += s;
		else if (s < r)
			lseek(in, s - r, SEEK_CUR);
		if (s < r)
			break;
	}
	return done;
}

EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t n) { return sendfile(out, in, off, n); }

/* The fortified versions (_FORTIFY_SOURCE) that programs built with it
 * call instead. */
EXPORT ssize_t __read_chk(int fd, void *b, size_t n, size_t blen)
{
	(void)blen;
	return read(fd, b, n);
}

EXPORT ssize_t __recv_chk(int fd, void *b, size_t n, size_t blen, int flags)
{
	(void)blen;
	return recv(fd, b, n, flags);
}

EXPORT ssize_t __recvfrom_chk(int fd, void *b, size_t n, size_t blen, int flags, struct sockaddr *a, socklen_t *l)
{
	(void)blen;
	return recvfrom(fd, b, n, flags, a, l);
}

EXPORT int close(int fd)
{
	struct fdent *e = ent(fd);
	if (e && e->kind != K_NONE) {
		pthread_mutex_lock(&mu);
		drop(fd);
		pthread_mutex_unlock(&mu);
	}
	return real_close(fd);
}

EXPORT int shutdown(int fd, int how)
{
	struct fdent *e = ours(fd);
	CHILD_TAKES(fd, e);
	if (!e || e->listening)
		return real_shutdown(fd, how);
	CHECK_USABLE();
	int r = CORE(core.shutdown(e->h, how));
	if (r == -EBADF && kernel_took(fd))
		return real_shutdown(fd, how);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return 0;
}

EXPORT int getsockopt(int fd, int level, int name, void *v, socklen_t *l)
{
	struct fdent *e = ours(fd);
	CHILD_TAKES(fd, e);
	if (!e || e->listening || after_fork)
		return real_getsockopt(fd, level, name, v, l);
	if (level == SOL_SOCKET && name == SO_ERROR && v && l && *l >= sizeof(int)) {
		*(int *)v = CORE(core.sockerr(e->h));
		*l = sizeof(int);
		return 0;
	}
	if (level == IPPROTO_TCP && name == TCP_INFO && v && l) {
		struct onl_tcpinfo ti;
		int r = CORE(core.tcpinfo(e->h, &ti));
		if (r < 0) {
			errno = -r;
			return -1;
		}
		struct tcp_info k;
		memset(&k, 0, sizeof k);
		k.tcpi_state = ti.state;
		k.tcpi_rto = ti.rto_us;
		k.tcpi_rtt = ti.rtt_us;
		k.tcpi_rttvar = ti.rttvar_us;
		k.tcpi_snd_mss = ti.snd_mss;
		k.tcpi_rcv_mss = ti.rcv_mss;
		k.tcpi_snd_cwnd = ti.snd_cwnd;
		k.tcpi_snd_ssthresh = ti.snd_ssthresh;
		k.tcpi_unacked = ti.unacked;
		k.tcpi_lost = ti.lost;
		k.tcpi_retrans = ti.retrans;
		k.tcpi_sacked = ti.sacked;
		k.tcpi_backoff = ti.backoff;
		k.tcpi_options = ti.options;
		k.tcpi_snd_wscale = ti.snd_wscale;
		k.tcpi_rcv_wscale = ti.rcv_wscale;
		socklen_t n = *l < sizeof k ? *l : sizeof k;
		memcpy(v, &k, n);
		*l = n;
		return 0;
	}
	/* The rest as the kernel socket has them: setsockopt sets both. */
	return real_getsockopt(fd, level, name, v, l);
}

EXPORT int setsockopt(int fd, int level, int name, const void *v, socklen_t l)
{
	struct fdent *e = ours(fd);
	CHILD_TAKES(fd, e);
	if (!e && (level == IPPROTO_TCP || level == SOL_SOCKET)) {
		struct fdent *k = ent(fd);
		if (k && k->kind == K_TCP)
			k->opts_set = 1; /* copy_options reads them */
	}
	int r = real_setsockopt(fd, level, name, v, l);
	if (!e || r < 0 || after_fork || !v || l < sizeof(int))
		return r;
	/* A listener's options are the kernel half's (copy_options took
	 * them when it was accelerated), but for the one the engine's half
	 * acts on itself. */
	if (e->listening && !(level == IPPROTO_TCP && name == TCP_DEFER_ACCEPT))
		return r;
	int opt = 0, val = *(const int *)v;
	if (level == IPPROTO_TCP) {
		switch (name) {
		case TCP_NODELAY: opt = ONL_OPT_NODELAY; break;
		case TCP_CORK: opt = ONL_OPT_CORK; break;
		case TCP_DEFER_ACCEPT: opt = ONL_OPT_DEFER_ACCEPT; break;
		case TCP_KEEPIDLE: opt = ONL_OPT_KEEPIDLE; break;
		case TCP_KEEPINTVL: opt = ONL_OPT_KEEPINTVL; break;
		case TCP_KEEPCNT: opt = ONL_OPT_KEEPCNT; break;
		case TCP_USER_TIMEOUT: opt = ONL_OPT_USER_TIMEOUT; break;
		}
	} else if (level == SOL_SOCKET) {
		switch (name) {
		case SO_KEEPALIVE: opt = ONL_OPT_KEEPALIVE; break;
		case SO_RCVBUF: opt = ONL_OPT_RCVBUF; break;
		case SO_SNDBUF: opt = ONL_OPT_SNDBUF; break;
		case SO_LINGER:
			if (l >= sizeof(struct linger)) {
				const struct linger *lg = v;
				opt = ONL_OPT_LINGER;
				val = lg->l_onoff ? lg->l_linger : -1;
			}
			break;
		}
	}
	if (opt) {
		if (opt == ONL_OPT_NODELAY || opt == ONL_OPT_CORK || opt == ONL_OPT_KEEPALIVE)
			val = !!val;
		int rr = CORE(core.setopt(e->h, opt, val));
		if (rr < 0)
			debugf("fd %d: option %d=%d not taken by the stack: %s", fd, opt, val, strerror(-rr));
	}
	return r;
}

/* name fills a with the socket's local (peer 0) or remote address. */
static int name(int fd, struct sockaddr *a, socklen_t *l, int peer)
{
	struct fdent *e = ours(fd);
	CHILD_TAKES(fd, e);
	if (!e || e->listening || after_fork)
		return peer ? real_getpeername(fd, a, l) : real_getsockname(fd, a, l);
	uint32_t ip[2];
	uint16_t port[2];
	int r = CORE(core.addrs(e->h, &ip[0], &port[0], &ip[1], &port[1]));
	if (r == -EBADF && kernel_took(fd))
		return peer ? real_getpeername(fd, a, l) : real_getsockname(fd, a, l);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	if (peer && !ip[1]) {
		errno = ENOTCONN;
		return -1;
	}
	fill_addr(a, l, ip[peer], port[peer]);
	return 0;
}

EXPORT int getsockname(int fd, struct sockaddr *a, socklen_t *l) { return name(fd, a, l, 0); }
EXPORT int getpeername(int fd, struct sockaddr *a, socklen_t *l) { return name(fd, a, l, 1); }

/* dup_to makes newfd name what oldfd names, after the kernel did. */
static void dup_to(int oldfd, int newfd)
{
	struct fdent *o = ent(oldfd), *n = ent(newfd);
	if (!o || !n || oldfd == newfd)
		return;
	pthread_mutex_lock(&mu);
	drop(newfd);
	if (o->kind == K_TCP || o->kind == K_OURS) {
		if (o->kind == K_OURS)
			mark_ours(newfd, 1);
		*n = *o;
		n->ep = NULL;
		/* An option set through one of them is not seen on the other's
		 * entry: copy_options reads them all. */
		o->fresh = n->fresh = 0;
		if (o->kind == K_OURS && (unsigned)o->h < MAX_HANDLES)
			__atomic_add_fetch(&hrefs[o->h], 1, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&mu);
}

EXPORT int dup(int fd)
{
	int r = real_dup(fd);
	if (r >= 0)
		dup_to(fd, r);
	return r;
}

EXPORT int dup2(int fd, int fd2)
{
	int r = real_dup2(fd, fd2);
	if (r >= 0)
		dup_to(fd, r);
	return r;
}

EXPORT int dup3(int fd, int fd2, int flags)
{
	int r = real_dup3(fd, fd2, flags);
	if (r >= 0)
		dup_to(fd, r);
	return r;
}

static int do_fcntl(int fd, int cmd, long arg)
{
	struct fdent *e = ours(fd);
	switch (cmd) {
	case F_DUPFD:
	case F_DUPFD_CLOEXEC: {
		int r = real_fcntl(fd, cmd, arg);
		if (r >= 0)
			dup_to(fd, r);
		return r;
	}
	case F_GETFL: {
		int r = real_fcntl(fd, cmd);
		if (e && r >= 0)
			r = e->nonblock ? r | O_NONBLOCK : r & ~O_NONBLOCK;
		return r;
	}
	case F_SETFL:
		if (e) {
			e->nonblock = !!(arg & O_NONBLOCK);
			arg |= O_NONBLOCK;
		}
		return real_fcntl(fd, cmd, arg);
	}
	return real_fcntl(fd, cmd, arg);
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	return do_fcntl(fd, cmd, arg);
}

/* With _FILE_OFFSET_BITS=64, glibc's fcntl is fcntl64. */
EXPORT int fcntl64(int fd, int cmd, ...) __attribute__((alias("fcntl")));

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	struct fdent *e = ours(fd);
	if (e && req == FIONREAD)
		CHILD_TAKES(fd, e);
	if (e && req == FIONBIO && arg) {
		e->nonblock = !!*(int *)arg;
		return 0;
	}
	if (e && req == FIONREAD && arg && !e->listening) {
		CHECK_USABLE();
		int r = CORE(core.unread(e->h));
		if (r < 0) {
			errno = -r;
			return -1;
		}
		*(int *)arg = r;
		return 0;
	}
	return real_ioctl(fd, req, arg);
}

/* ---- poll and select ----------------------------------------------- */

static int64_t ts_ns(const struct timespec *t)
{
	return t ? t->tv_sec * 1000000000LL + t->tv_nsec : -1;
}

/* ---- waits the kernel serves alone ------------------------------------
 *
 * A wait on the kernel's fds alone goes straight to libc. Once the core
 * is loaded the Go runtime handles SIGURG (its preemption signal: one
 * meant for a thread's time in Go can land just after the thread left
 * it; or one sent to the process), and the kernel then ends the wait with
 * EINTR where, the signal being at its default, it would have gone on.
 * So a wait that EINTR ends with none of the program's handlers run on
 * the thread (t_handled) goes again, for the time it has left. */
struct kwait {
	unsigned handled;
	int64_t end; /* on now_ns; -1: none, for ever */
};

static inline void kwait_begin(struct kwait *k, int64_t timeout_ns)
{
	k->handled = t_handled;
	k->end = timeout_ns < 0 ? -1 : timeout_ns > 0 && core_state == 1 ? now_ns() + timeout_ns : 0;
}

/* kwait_again reports whether the wait that returned r goes again, and
 * for how long (*left_ns; -1 for ever). */
static int kwait_again(struct kwait *k, int r, int64_t *left_ns)
{
	if (r >= 0 || errno != EINTR || core_state != 1 || t_handled != k->handled)
		return 0;
	int64_t left = k->end > 0 ? k->end - now_ns() : k->end;
	*left_ns = k->end < 0 ? -1 : left > 0 ? left : 0;
	return 1;
}

static int ns_ms(int64_t ns)
{
	return ns < 0 ? -1 : ns >= INT_MAX * 1000000LL ? INT_MAX : (int)((ns + 999999) / 1000000);
}

static struct timespec *ns_ts(int64_t ns, struct timespec *ts)
{
	if (ns < 0)
		return NULL;
	ts->tv_sec = ns / 1000000000LL;
	ts->tv_nsec = ns % 1000000000LL;
	return ts;
}

static int kernel_poll(struct pollfd *fds, nfds_t n, int timeout)
{
	struct kwait k;
	kwait_begin(&k, timeout < 0 ? -1 : timeout * 1000000LL);
	int r;
	int64_t left;
	while (kwait_again(&k, r = real_poll(fds, n, timeout), &left))
		timeout = ns_ms(left);
	return r;
}

static int kernel_ppoll(struct pollfd *fds, nfds_t n, const struct timespec *t, const sigset_t *mask)
{
	struct kwait k;
	kwait_begin(&k, ts_ns(t));
	int r;
	int64_t left;
	struct timespec ts;
	while (kwait_again(&k, r = real_ppoll(fds, n, t, mask), &left))
		t = ns_ts(left, &ts);
	return r;
}

static int any_ours(struct pollfd *fds, nfds_t n)
{
	if (!fdt)
		return 0;
	int any = 0;
	for (nfds_t i = 0; i < n; i++) {
		struct fdent *e = ours_or_listener(fds[i].fd);
		CHILD_TAKES(fds[i].fd, e);
		if (e)
			any = 1;
	}
	return any && !after_fork && !in_core;
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	if (!any_ours(fds, n))
		return kernel_poll(fds, n, timeout);
	return wait_poll(fds, n, timeout < 0 ? -1 : timeout * 1000000LL, NULL);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *t, const sigset_t *mask)
{
	if (!any_ours(fds, n))
		return kernel_ppoll(fds, n, t, mask);
	return wait_poll(fds, n, ts_ns(t), mask);
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t len)
{
	(void)len;
	return poll(fds, n, timeout);
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *t, const sigset_t *mask, size_t len)
{
	(void)len;
	return ppoll(fds, n, t, mask);
}

static int select_ours(int n, fd_set *r, fd_set *w, fd_set *x)
{
	if (!fdt || in_core)
		return 0;
	int any = 0;
	for (int fd = 0; fd < n && fd < nfdt; fd++)
		if ((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (x && FD_ISSET(fd, x))) {
			struct fdent *e = ours_or_listener(fd);
			CHILD_TAKES(fd, e);
			any |= e != NULL;
		}
	return any && !after_fork;
}

/* do_select is select() as poll() over the fds in the sets. */
static int do_select(int n, fd_set *r, fd_set *w, fd_set *x, int64_t timeout_ns, const sigset_t *mask)
{
	struct pollfd *p = malloc(sizeof *p * (n > 0 ? n : 1));
	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	int k = 0;
	for (int fd = 0; fd < n; fd++) {
		short ev = 0;
		if (r && FD_ISSET(fd, r)) ev |= POLLIN;
		if (w && FD_ISSET(fd, w)) ev |= POLLOUT;
		if (x && FD_ISSET(fd, x)) ev |= POLLPRI;
		if (ev)
			p[k++] = (struct pollfd){.fd = fd, .events = ev};
	}
	int rc = wait_poll(p, k, timeout_ns, mask);
	if (rc < 0) {
		free(p);
		return -1;
	}
	for (int i = 0; i < k; i++)
		if (p[i].revents & POLLNVAL) {
			free(p);
			errno = EBADF;
			return -1;
		}
	if (r) FD_ZERO(r);
	if (w) FD_ZERO(w);
	if (x) FD_ZERO(x);
	int count = 0;
	for (int i = 0; i < k; i++) {
		short re = p[i].revents;
		if (r && (re & (POLLIN | POLLHUP | POLLERR)) && (p[i].events & POLLIN)) { FD_SET(p[i].fd, r); count++; }
		if (w && (re & (POLLOUT | POLLERR)) && (p[i].events & POLLOUT)) { FD_SET(p[i].fd, w); count++; }
		if (x && (re & POLLPRI) && (p[i].events & POLLPRI)) { FD_SET(p[i].fd, x); count++; }
	}
	free(p);
	return count;
}

/* kernel_pselect is pselect on the kernel's fds alone (see kwait). The
 * sets are the caller's again for each try: the kernel's leaves them
 * as they were when it fails. */
static int kernel_pselect(int n, fd_set *r, fd_set *w, fd_set *x, const struct timespec *t, const sigset_t *mask)
{
	struct kwait k;
	kwait_begin(&k, ts_ns(t));
	int ret;
	int64_t left;
	struct timespec ts;
	while (kwait_again(&k, ret = real_pselect(n, r, w, x, t, mask), &left))
		t = ns_ts(left, &ts);
	return ret;
}

EXPORT int select(int n, fd_set *r, fd_set *w, fd_set *x, struct timeval *t)
{
	if (!select_ours(n, r, w, x)) {
		/* As Linux's select, the time left goes back in *t. */
		struct kwait k;
		kwait_begin(&k, t ? t->tv_sec * 1000000000LL + t->tv_usec * 1000LL : -1);
		int ret;
		int64_t left;
		while (kwait_again(&k, ret = real_select(n, r, w, x, t), &left))
			if (t)
				*t = (struct timeval){.tv_sec = left / 1000000000LL, .tv_usec = left % 1000000000LL / 1000};
		return ret;
	}
	return do_select(n, r, w, x, t ? t->tv_sec * 1000000000LL + t->tv_usec * 1000LL : -1, NULL);
}

EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *x, const struct timespec *t, const sigset_t *mask)
{
	if (!select_ours(n, r, w, x))
		return kernel_pselect(n, r, w, x, t, mask);
	return do_select(n, r, w, x, ts_ns(t), mask);
}

/* ---- epoll ------------------------------------------------------------- */

/* An epoll instance's accelerated members, which the kernel's epoll does
 * not see (a listener is in both: the kernel's half serves loopback). */
struct epi {
	int fd, h;
	uint32_t events;
	epoll_data_t data;
	uint8_t disabled;	      /* EPOLLONESHOT, reported */
	uint32_t rd_seen, wr_seen;    /* EPOLLET: the EAGAIN counts when last reported */
	uint32_t edge_seen;	      /* EPOLLET: the socket's edge count then */
	unsigned stamp;		      /* the check that last looked at it (ep.round) */
};

/*
 * An instance checks, at each epoll_wait, only the members that may be
 * ready, as the kernel's epoll keeps a ready list that its sockets'
 * wake-ups fill: those it found ready last time (level-triggered) or
 * could not report for the caller's max, those waiting for write space,
 * new and changed ones (epoll_ctl), and those the stack's ready log names
 * since it last read it (onl_ready: a segment, a timer, a connection came
 * for them). It checks every member when the log cannot say (it wrapped,
 * or another thread read it meanwhile) and before it blocks, to arm them
 * all.
 */
struct ep {
	int n, cap, next;
	unsigned ver;	  /* counts changes of the members (under mu) */
	unsigned seq;	  /* the stack's ready log, read up to here */
	uint8_t full;	  /* check every member at the next call */
	uint8_t multi;	  /* a socket is in twice (dup'd fds): check all, always */
	unsigned round;	  /* counts checks (epi.stamp) */
	int64_t kernel_at; /* when the kernel's set is due a look (ep_kernel_due) */
	int *hidx, nhidx; /* by handle: its member's index + 1 (0: none) */
	int *pend, npend; /* handles to check at the next call; room for cap */
	struct epi items[];
};

/* EP_LOG_WAIT: an instance of this many members or more blocks until the
 * stack's ready log moves (any socket of the stack may have turned ready:
 * onl_arm_ready) instead of arming each member, which costs more than the
 * wake-ups for sockets not in it that the log's wait may bring. */
#define EP_LOG_WAIT 128

/* ep_log_room is how many of the ready log's entries a check takes: more
 * and it checks every member instead. */
static int ep_log_room(const struct ep *ep)
{
	int r = 2 * ep->n + 64;
	return r < 2048 ? r : 2048;
}

/* ep_kernel_due says whether a check that found accelerated members ready,
 * or one of a spin, also looks at the kernel's set (a system call): at
 * most every EP_KERNEL_NS, as Onload's EF_POLL_NONBLOCK_FAST_USEC, so that
 * a busy server's loop, or a spin, is not a system call a turn, and its
 * kernel fds (a listener's kernel half, a pipe) wait that long at most.
 * Near the caller's deadline it always looks, and so does a check that
 * is not spinning and found nothing. */
#define EP_KERNEL_NS 100000
static int ep_kernel_due(struct ep *ep, int64_t deadline) /* under mu */
{
	int64_t now = now_ns();
	if (now < ep->kernel_at && (deadline < 0 || deadline - now > EP_KERNEL_NS))
		return 0;
	ep->kernel_at = now + EP_KERNEL_NS;
	return 1;
}

static struct ep *ep_of(int epfd)
{
	struct fdent *e = ent(epfd);
	if (!e)
		return NULL;
	if (e->kind != K_EPOLL) {
		memset(e, 0, sizeof *e);
		e->kind = K_EPOLL;
	}
	return e->ep;
}

static void ep_free(struct ep *ep)
{
	if (ep) {
		free(ep->hidx);
		free(ep->pend);
		free(ep);
	}
}

/* ep_pend asks for member h to be checked at the next call. */
static void ep_pend(struct ep *ep, int h)
{
	if (ep->npend < ep->cap)
		ep->pend[ep->npend++] = h;
	else
		ep->full = 1;
}

/* ep_remove takes member i out; the last takes its place. */
static void ep_remove(struct ep *ep, int i)
{
	int h = ep->items[i].h;
	if ((unsigned)h < (unsigned)ep->nhidx && ep->hidx[h] == i + 1)
		ep->hidx[h] = 0;
	ep->items[i] = ep->items[--ep->n];
	int m = ep->items[i].h;
	if (i < ep->n && (unsigned)m < (unsigned)ep->nhidx && ep->hidx[m] == ep->n + 1)
		ep->hidx[m] = i + 1;
	ep->ver++;
}

/* epfds are the epoll instances that have a list of accelerated members
 * (ep), so that a close looks through them and not the whole fd table
 * (65536 entries and more: a close of a connection spent a tenth of a
 * proxy's time there). An entry whose fd no longer names such an
 * instance is dropped where it is found. Under mu. */
static int *epfds, nepfds, capepfds;

static int epfds_add(int fd)
{
	for (int i = 0; i < nepfds; i++)
		if (epfds[i] == fd)
			return 0;
	if (nepfds == capepfds) {
		int cap = capepfds ? 2 * capepfds : 16;
		int *n = realloc(epfds, cap * sizeof(int));
		if (!n) {
			errno = ENOMEM;
			return -1;
		}
		epfds = n;
		capepfds = cap;
	}
	epfds[nepfds++] = fd;
	return 0;
}

/* ep_next_live returns the instance of epfds[*i] and its fd, dropping
 * stale entries; NULL after the last. */
static struct ep *ep_next_live(int *i, int *epfd)
{
	while (*i < nepfds) {
		int fd = epfds[*i];
		struct fdent *e = ent(fd);
		if (e && e->kind == K_EPOLL && e->ep) {
			*epfd = fd;
			return e->ep;
		}
		epfds[*i] = epfds[--nepfds];
	}
	return NULL;
}

/* ep_find is the index of fd, whose handle is h, among ep's members; -1
 * if it is none. Without dup'd members (multi) each handle's member is
 * indexed (hidx). */
static int ep_find(const struct ep *ep, int fd, int h)
{
	if (!ep)
		return -1;
	if (!ep->multi) {
		if ((unsigned)h >= (unsigned)ep->nhidx || !ep->hidx[h])
			return -1;
		int i = ep->hidx[h] - 1;
		return i < ep->n && ep->items[i].fd == fd ? i : -1;
	}
	for (int i = 0; i < ep->n; i++)
		if (ep->items[i].fd == fd)
			return i;
	return -1;
}

/* epoll_forget removes fd (handle h) from every instance's list. */
static void epoll_forget(int fd, int h)
{
	int epfd;
	for (int i = 0; i < nepfds; i++) {
		struct ep *ep = ep_next_live(&i, &epfd);
		int j = ep_find(ep, fd, h);
		if (j >= 0)
			ep_remove(ep, j);
	}
}

/* epoll_to_kernel moves fd's registrations in the instances' lists of
 * accelerated members into the kernel's sets (fd is the kernel's now). */
static void epoll_to_kernel(int fd, int h)
{
	int epfd;
	for (int i = 0; i < nepfds; i++) {
		struct ep *ep = ep_next_live(&i, &epfd);
		int j = ep_find(ep, fd, h);
		if (j < 0)
			continue;
		struct epoll_event ev = {.events = ep->items[j].events, .data = ep->items[j].data};
		if (real_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && errno != EEXIST)
			debugf("fd %d: into epoll %d: %s", fd, epfd, strerror(errno));
		ep_remove(ep, j);
	}
}

static int note_epoll(int r)
{
	struct fdent *e = ent(r);
	if (e) {
		pthread_mutex_lock(&mu);
		memset(e, 0, sizeof *e);
		e->kind = K_EPOLL;
		e->epgen = ++epoll_gen;
		pthread_mutex_unlock(&mu);
	}
	return r;
}

EXPORT int epoll_create(int size) { return note_epoll(real_epoll_create(size)); }
EXPORT int epoll_create1(int flags) { return note_epoll(real_epoll_create1(flags)); }

/* ep_grow makes room in ee's instance for one more member, and for handle
 * h in its index; NULL (errno set) if memory runs out. */
static struct ep *ep_grow(struct fdent *ee, struct ep *ep, int h)
{
	if (!ep && epfds_add(ee - fdt) < 0)
		return NULL;
	if (!ep || ep->n == ep->cap) {
		int cap = ep ? ep->cap * 2 : 8;
		int *pend = realloc(ep ? ep->pend : NULL, cap * sizeof(int));
		if (!pend) {
			errno = ENOMEM;
			return NULL;
		}
		struct ep *n = realloc(ep, sizeof *ep + cap * sizeof(struct epi));
		if (!n) {
			if (!ep)
				free(pend);
			else
				ep->pend = pend;
			errno = ENOMEM;
			return NULL;
		}
		if (!ep) {
			memset(n, 0, sizeof *n);
			n->full = 1; /* the first check starts the log */
		}
		n->pend = pend;
		n->cap = cap;
		ee->ep = ep = n;
	}
	if ((unsigned)h >= (unsigned)ep->nhidx) {
		int nh = ep->nhidx ? ep->nhidx : 64;
		while (nh <= h)
			nh *= 2;
		int *hidx = realloc(ep->hidx, nh * sizeof(int));
		if (!hidx) {
			errno = ENOMEM;
			return NULL;
		}
		memset(hidx + ep->nhidx, 0, (nh - ep->nhidx) * sizeof(int));
		ep->hidx = hidx;
		ep->nhidx = nh;
	}
	return ep;
}

/* ---- registrations made while the kernel had the socket -------------
 *
 * A TCP socket the core has not seen (K_TCP) is the kernel's, and so are
 * its epoll registrations. A program may register it before it connects
 * (nginx adds an upstream connection with EPOLLIN|EPOLLOUT|EPOLLRDHUP|
 * EPOLLET, then connects) or before it listens. Once the core has the
 * socket, the kernel socket under it never turns readable: those
 * registrations move to the instances' lists of accelerated members
 * (kreg_take). kregs keeps them meanwhile, under mu: a few at a time,
 * each gone at its socket's connect, listen or close. */
struct kreg {
	int fd, epfd;
	uint32_t epgen; /* the instance's (fdent.epgen): epfd may be reused */
	struct epoll_event ev;
};
static struct kreg *kregs;
static int nkregs, capkregs;

static int ep_ctl_locked(struct fdent *ee, int epfd, int op, int fd, struct fdent *fe, struct epoll_event *ev);

/* kreg_ctl is epoll_ctl on a descriptor that is not accelerated: the
 * kernel's, noted if it is a TCP socket the core may take yet. */
static int kreg_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	int r = real_epoll_ctl(epfd, op, fd, ev);
	struct fdent *e = ent(fd), *ee = ent(epfd);
	if (r < 0 || !e || !ee || e->kind != K_TCP || e->tried)
		return r;
	pthread_mutex_lock(&mu);
	ep_of(epfd); /* an instance the shim did not see made (inherited) */
	int i = 0;
	while (i < nkregs && (kregs[i].fd != fd || kregs[i].epfd != epfd))
		i++;
	if (op == EPOLL_CTL_DEL || !ev) {
		if (i < nkregs)
			kregs[i] = kregs[--nkregs];
	} else {
		if (i == nkregs && nkregs == capkregs) {
			int cap = capkregs ? 2 * capkregs : 16;
			struct kreg *k = realloc(kregs, cap * sizeof *k);
			if (k) {
				kregs = k;
				capkregs = cap;
			}
		}
		if (i < capkregs) {
			if (i == nkregs)
				nkregs++;
			kregs[i] = (struct kreg){.fd = fd, .epfd = epfd, .epgen = ee->epgen, .ev = *ev};
		} else {
			debugf("fd %d: out of memory to note its registration in epoll %d: "
			       "it stays the kernel's if the socket is accelerated", fd, epfd);
		}
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* kreg_take moves fd's noted registrations into the instances' lists,
 * now that fd is accelerated (entry fe). A listener's stay in the kernel
 * too, for its kernel half (epoll_ctl). Under mu. */
static void kreg_take(int fd, struct fdent *fe)
{
	for (int i = 0; i < nkregs;) {
		struct kreg k = kregs[i];
		if (k.fd != fd) {
			i++;
			continue;
		}
		kregs[i] = kregs[--nkregs];
		struct fdent *ee = ent(k.epfd);
		if (!ee || ee->kind != K_EPOLL || ee->epgen != k.epgen)
			continue; /* that instance is closed */
		if (!fe->listening)
			real_epoll_ctl(k.epfd, EPOLL_CTL_DEL, fd, NULL);
		if (ep_ctl_locked(ee, k.epfd, EPOLL_CTL_ADD, fd, fe, &k.ev) < 0)
			debugf("fd %d: into epoll %d as accelerated: %s", fd, k.epfd, strerror(errno));
	}
}

/* kreg_forget drops fd's noted registrations: it is closed, or the
 * kernel keeps it. Under mu. */
static void kreg_forget(int fd)
{
	for (int i = 0; i < nkregs;)
		if (kregs[i].fd == fd)
			kregs[i] = kregs[--nkregs];
		else
			i++;
}

/* ep_ctl_locked is epoll_ctl for an accelerated member fd (entry fe) of
 * the instance epfd (entry ee), in the instance's list; under mu. */
static int ep_ctl_locked(struct fdent *ee, int epfd, int op, int fd, struct fdent *fe, struct epoll_event *ev)
{
	struct ep *ep = ep_of(epfd);
	int i = ep_find(ep, fd, fe->h);
	int found = i >= 0;
	int r = 0;
	switch (op) {
	case EPOLL_CTL_ADD:
		if (found) {
			errno = EEXIST;
			r = -1;
			break;
		}
		if (!(ep = ep_grow(ee, ep, fe->h))) {
			r = -1;
			break;
		}
		if (ep->hidx[fe->h])
			ep->multi = 1;
		i = ep->n++;
		/* fallthrough */
	case EPOLL_CTL_MOD:
		if (!found && op == EPOLL_CTL_MOD) {
			errno = ENOENT;
			r = -1;
			break;
		}
		if (!ev) {
			errno = EFAULT;
			r = -1;
			if (op == EPOLL_CTL_ADD)
				ep->n--;
			break;
		}
		ep->items[i] = (struct epi){
			.fd = fd, .h = fe->h, .events = ev->events, .data = ev->data,
			.rd_seen = fe->rd_eagain - 1, .wr_seen = fe->wr_eagain - 1,
		};
		if ((unsigned)fe->h < (unsigned)ep->nhidx)
			ep->hidx[fe->h] = i + 1;
		else
			ep->multi = 1; /* not indexed: always check all */
		ep_pend(ep, fe->h);
		break;
	case EPOLL_CTL_DEL:
		if (!found) {
			errno = ENOENT;
			r = -1;
			break;
		}
		ep_remove(ep, i);
		break;
	default:
		errno = EINVAL;
		r = -1;
	}
	if (r == 0)
		ep->ver++;
	return r;
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct fdent *fe = ours_or_listener(fd);
	struct fdent *ee = ent(epfd);
	CHILD_TAKES(fd, fe);
	if (!fe && ee && !after_fork)
		return kreg_ctl(epfd, op, fd, ev);
	if (!fe || !ee || after_fork)
		return real_epoll_ctl(epfd, op, fd, ev);
	if (fe->listening) {
		/* The kernel's half too. */
		int r = real_epoll_ctl(epfd, op, fd, ev);
		if (r < 0)
			return r;
	}
	pthread_mutex_lock(&mu);
	int r = ep_ctl_locked(ee, epfd, op, fd, fe, ev);
	pthread_mutex_unlock(&mu);
	return r;
}

/* epoll's bits are poll's. */
_Static_assert(EPOLLIN == POLLIN && EPOLLOUT == POLLOUT && EPOLLERR == POLLERR && EPOLLHUP == POLLHUP &&
	       EPOLLRDHUP == POLLRDHUP && EPOLLRDNORM == POLLRDNORM && EPOLLWRNORM == POLLWRNORM,
	       "epoll and poll bits differ");
#define to_epoll(ev) ((uint32_t)(uint16_t)to_poll(ev))
#define from_epoll(ev) from_poll((short)((ev) & 0xffff))

/* ep_members lists an instance's accelerated members for the core (their
 * handles in hs, 0 for a disabled one, and the events each wants), and
 * says whether any is a connection (not a listener). */
static int ep_members(struct ep *ep, int *hs, int *want)
{
	int conns = 0;
	for (int j = 0; j < ep->n; j++) {
		hs[j] = ep->items[j].disabled ? 0 : ep->items[j].h;
		want[j] = hs[j] ? from_epoll(ep->items[j].events) : 0;
		if (hs[j] && !conns) {
			struct fdent *fe = ent(ep->items[j].fd);
			conns = fe && !fe->listening;
		}
	}
	return conns;
}

/* ep_collect reports ready members into out, up to max, from the events
 * the core gave for hs[0..m): every member in order if full (ep_members),
 * else the handles of those to check, some perhaps twice or no longer
 * members. For a full check it sets what each member would wait for in
 * want: its events, or, for an edge-triggered member whose readiness was
 * reported already, its next change (ONL_EDGE from the edge count in
 * edges). It refills the list of those to check at the next call: the
 * ones it could not report for max first, then the level-triggered ones
 * ready and those waiting for write space (later is scratch for them). */
static int ep_collect(struct ep *ep, int full, struct epoll_event *out, int max, const int *hs, const int *evs,
		      int *want, const unsigned *edges, int m, int *later)
{
	unsigned round = ++ep->round;
	int k = 0, first = 0, nlater = 0;
	for (int c = 0; c < m; c++) {
		int j = full ? (ep->next + c) % m : c;
		struct epi *it;
		if (full) {
			it = &ep->items[j];
		} else {
			int h = hs[j];
			if ((unsigned)h >= (unsigned)ep->nhidx || !ep->hidx[h])
				continue;
			it = &ep->items[ep->hidx[h] - 1];
			if (it->stamp == round)
				continue;
		}
		it->stamp = round;
		if (it->disabled)
			continue;
		if (k == max) {
			ep->pend[first++] = it->h;
			continue;
		}
		uint32_t ready = to_epoll(evs[j]) & (it->events | EPOLLERR | EPOLLHUP);
		uint32_t got = ready;
		if (it->events & EPOLLET) {
			struct fdent *fe = ent(it->fd);
			if (got && full) /* reported now or before: wait for the next edge */
				want[j] = ONL_EDGE;
			/* An edge, as the kernel's: the socket's edge count moved
			 * (new data, a connection, a state change, an error) since
			 * it was last reported, or the program found it empty (or
			 * full) since. */
			int moved = edges[j] != it->edge_seen;
			if (fe && !moved && fe->rd_eagain == it->rd_seen)
				got &= ~(EPOLLIN | EPOLLRDNORM | EPOLLRDHUP);
			if (fe && !moved && fe->wr_eagain == it->wr_seen)
				got &= ~(EPOLLOUT | EPOLLWRNORM);
			if (got)
				it->edge_seen = edges[j];
			if (fe && (got & (EPOLLIN | EPOLLRDNORM | EPOLLRDHUP)))
				it->rd_seen = fe->rd_eagain;
			if (fe && (got & (EPOLLOUT | EPOLLWRNORM)))
				it->wr_seen = fe->wr_eagain;
		} else if (ready || ((it->events & EPOLLOUT) && !(evs[j] & ONL_WRITABLE))) {
			later[nlater++] = it->h;
		}
		if (!got)
			continue;
		out[k].events = got;
		out[k].data = it->data;
		k++;
		if (it->events & EPOLLONESHOT)
			it->disabled = 1;
	}
	memcpy(ep->pend + first, later, nlater * sizeof(int));
	ep->npend = first + nlater;
	if (full)
		ep->next = m ? (ep->next + 1) % m : 0;
	return k;
}

/* ep_taken_over is taken_over for an epoll instance's members (hs as
 * ep_members listed them). */
static int ep_taken_over(struct fdent *ee, const int *hs, const int *evs, int n)
{
	int any = 0;
	for (int j = 0; j < n; j++) {
		if ((evs[j] & (ONL_ERROR | ONL_HANGUP)) != (ONL_ERROR | ONL_HANGUP) || hs[j] <= 0)
			continue;
		int fd = -1;
		pthread_mutex_lock(&mu);
		struct ep *ep = ee->kind == K_EPOLL ? ee->ep : NULL;
		for (int i = 0; ep && i < ep->n; i++)
			if (ep->items[i].h == hs[j])
				fd = ep->items[i].fd;
		pthread_mutex_unlock(&mu);
		if (fd >= 0 && kernel_took(fd))
			any = 1;
	}
	return any;
}

static int do_epoll_wait(int epfd, struct epoll_event *out, int max, int64_t timeout_ns, const sigset_t *mask)
{
	struct fdent *ee = ent(epfd);
	struct ep *ep;
	if (max <= 0) {
		errno = EINVAL;
		return -1;
	}
	/* The first check kicks what sends left and polls (unless another
	 * thread is in the stack), in the one call into the core a busy
	 * server's epoll_wait makes; only if it finds nothing does the
	 * thread claim a spin slot and spin (wait_begin's work, put off). */
	if (timeout_ns != 0)
		count_waiter();
	int64_t now0 = now_ns();
	keep_p(now0, RESCHED_BUSY_NS);
	struct wait w = {.deadline = timeout_ns < 0 ? -1 : now0 + timeout_ns};
	int spin_tried = timeout_ns == 0 || spin_ns <= 0, spin_try = 0;
	int ret;
	/* Scratch for the members' handles, events, wants and edge counts:
	 * grown, not allocated again for every check of a spin. */
	int *hs = NULL, room = 0;
	int blocking = 0; /* the spin is over: check all, to arm them */
	/* A check that finds nothing looks at the kernel's set only in a
	 * call that does not wait, or after a block that the program's
	 * epoll fd ended (wait_block's 1). Otherwise the call goes on to
	 * spin, whose looks ep_kernel_due spaces, or to block, in a set that
	 * holds the program's epoll fd: a kernel fd ready ends the block at
	 * once. memcached's threads made two or three such system calls a
	 * wait, one after every wake-up for a frame of the other thread's. */
	int kernel_woke = timeout_ns == 0;
	for (;;) {
		pthread_mutex_lock(&mu);
		ep = ee->ep;
		int full = !ep || ep->full || ep->multi || blocking;
		int logroom = full ? -1 : ep_log_room(ep);
		int len = !ep ? 0 : full ? ep->n : ep->npend + logroom;
		if (len + 1 > room) {
			int *grown = realloc(hs, sizeof(int) * 5 * (len + 1));
			if (!grown) {
				pthread_mutex_unlock(&mu);
				errno = ENOMEM;
				ret = -1;
				break;
			}
			hs = grown;
			room = len + 1;
		}
		int *evs = hs + room, *want = evs + room, *later = want + room;
		unsigned *edges = (unsigned *)(later + room);
		int conns = 0, k0 = 0, nmembers = ep ? ep->n : 0;
		if (full && ep) {
			conns = ep_members(ep, hs, want);
			k0 = ep->n;
		} else if (ep) {
			memcpy(hs, ep->pend, ep->npend * sizeof(int));
			k0 = ep->npend;
		}
		unsigned ver = ep ? ep->ver : 0, seq0 = ep ? ep->seq : 0, seq = seq0;
		pthread_mutex_unlock(&mu);
		/* The core is asked without the table's lock: it takes the stack
		 * lock, may poll and kick, and the other threads' waits (each on
		 * its own instance) need the table meanwhile. What the members
		 * were is checked after: a change since (epoll_ctl, close) asks
		 * again, and reads the log again from where it was. */
		int fl = w.spinning ? ONL_READY_POLL : ONL_READY_TRY_POLL;
		if (kick_owed) {
			kick_owed = 0;
			fl |= ONL_READY_KICK;
		}
		if (spin_try)
			fl |= ONL_READY_TRY_SPIN;
		int m = CORE(core.ready(hs, evs, edges, k0, logroom, &seq, &fl));
		if (spin_try) {
			spin_try = 0;
			spin_tried = 1;
			if (fl & ONL_READY_SPINNING) {
				w.spinning = 1;
				w.spin_end = now_ns() + spin_ns;
				w.yield_at = 0;
			}
		}
		if (m < 0) {
			pthread_mutex_lock(&mu);
			if (ee->ep == ep && ep)
				ep->full = 1;
			pthread_mutex_unlock(&mu);
			continue;
		}
		if (ep_taken_over(ee, hs, evs, m))
			continue; /* those members are the kernel set's now */
		pthread_mutex_lock(&mu);
		if (ee->ep != ep || (ep && ep->ver != ver)) {
			pthread_mutex_unlock(&mu);
			continue;
		}
		int k = 0, kernel = 1;
		if (ep) {
			k = ep_collect(ep, full, out, max, hs, evs, want, edges, m, later);
			kernel = k < max && ((k == 0 && kernel_woke && !blocking && !w.spinning) || ep_kernel_due(ep, w.deadline));
			/* Another thread waiting on the instance read the log
			 * meanwhile: what it took is not in this check. */
			if (ep->seq != seq0)
				ep->full = 1;
			else if (full)
				ep->full = 0;
			ep->seq = seq;
		}
		pthread_mutex_unlock(&mu);
		if (kernel && k < max) {
			int r;
			while ((r = real_epoll_wait(epfd, out + k, max - k, 0)) < 0 && errno == EINTR)
				;
			if (r < 0) {
				ret = -1;
				break;
			}
			/* A listener's two halves report once. */
			for (int a = k; a < k + r; a++) {
				int dup = -1;
				for (int b = 0; b < k; b++)
					if (out[b].data.u64 == out[a].data.u64)
						dup = b;
				if (dup >= 0) {
					out[dup].events |= out[a].events;
					out[a--] = out[k + --r];
				}
			}
			k += r;
		}
		int64_t now;
		if (k > 0 || wait_over(&w, &now)) {
			ret = k;
			break;
		}
		if (!spin_tried) {
			spin_try = 1;
			continue;
		}
		struct pollfd p[4] = {{.fd = epfd, .events = POLLIN}};
		if (!full && !(w.spinning && now < w.spin_end)) {
			/* A set of many: wait for the stack's ready log to move
			 * past this check, instead of arming every member. */
			if (nmembers >= EP_LOG_WAIT && !log_wait_off) {
				if ((kernel_woke = wait_block(&w, now, NULL, NULL, NULL, NULL, 0, &seq, p, 1, epfd, 1, mask)) < 0) {
					ret = -1;
					break;
				}
				continue;
			}
			blocking = 1; /* check all before blocking, to arm them */
			continue;
		}
		blocking = 0;
		if ((kernel_woke = wait_block(&w, now, hs, want, evs, edges, k0, NULL, p, 1, epfd, conns, mask)) < 0) {
			ret = -1;
			break;
		}
	}
	wait_end(&w);
	free(hs);
	return ret;
}

static int ep_has_ours(int epfd)
{
	struct fdent *e = ent(epfd);
	if (e && e->kind == K_EPOLL && e->ep && after_fork) {
		/* A child's inherited set: its connections go to the kernel
		 * (and into the kernel's set). */
		for (int i = e->ep->n - 1; i >= 0; i--) {
			int fd = e->ep->items[i].fd;
			struct fdent *m = ours(fd);
			CHILD_TAKES(fd, m);
		}
		return 0;
	}
	return e && e->kind == K_EPOLL && e->ep && e->ep->n > 0 && !in_core;
}

/* kernel_epoll_pwait is epoll_wait (pwait 0) or epoll_pwait on an
 * instance of the kernel's fds alone (see kwait). */
static int kernel_epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout, const sigset_t *mask, int pwait)
{
	struct kwait k;
	kwait_begin(&k, timeout < 0 ? -1 : timeout * 1000000LL);
	int r;
	int64_t left;
	while (kwait_again(&k, r = pwait ? real_epoll_pwait(epfd, ev, max, timeout, mask) : real_epoll_wait(epfd, ev, max, timeout), &left))
		timeout = ns_ms(left);
	return r;
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	if (!ep_has_ours(epfd))
		return kernel_epoll_pwait(epfd, ev, max, timeout, NULL, 0);
	return do_epoll_wait(epfd, ev, max, timeout < 0 ? -1 : timeout * 1000000LL, NULL);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout, const sigset_t *mask)
{
	if (!ep_has_ours(epfd))
		return kernel_epoll_pwait(epfd, ev, max, timeout, mask, 1);
	return do_epoll_wait(epfd, ev, max, timeout < 0 ? -1 : timeout * 1000000LL, mask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max, const struct timespec *t, const sigset_t *mask)
{
	if (!ep_has_ours(epfd)) {
		struct kwait k;
		kwait_begin(&k, ts_ns(t));
		int r;
		int64_t left;
		struct timespec ts;
		while (kwait_again(&k, r = real_epoll_pwait2(epfd, ev, max, t, mask), &left))
			t = ns_ts(left, &ts);
		return r;
	}
	return do_epoll_wait(epfd, ev, max, ts_ns(t), mask);
}

/* ---- signals ------------------------------------------------------------ */

/* Synchronous signals (a fault of the thread's own) run their handlers
 * at once; any other the program handles goes through on_signal. */
static int held_sig(int sig)
{
	return sig > 0 && sig < NSIG && sig <= 64 && sig != SIGSEGV && sig != SIGBUS && sig != SIGFPE &&
	       sig != SIGILL && sig != SIGTRAP && sig != SIGSYS;
}

/* runtime_handler: act is the Go runtime's own (its SIGURG, SIGPIPE),
 * set through libc by the core: it must see every signal at once, with
 * its context. */
static int runtime_handler(const struct sigaction *act)
{
	if (loading)
		return 1;
	Dl_info di;
	return core_base && dladdr((void *)act->sa_handler, &di) && di.dli_fbase == core_base;
}

static void end_by_signal(int sig);
static void close_at_end(int sig);
static void set_default(int sig);
static int ends_process(int sig);
static int catching_ends(void);

static void call_handler(int sig, siginfo_t *si, void *uc)
{
	const struct sigaction *a = &prog_act[sig];
	if (a->sa_handler == SIG_DFL && ends_process(sig)) {
		end_by_signal(sig);
		return;
	}
	struct sigaction once;
	if (a->sa_flags & SA_RESETHAND && a->sa_handler != SIG_IGN && ends_process(sig) && catching_ends()) {
		/* The kernel left the reset to us (handler_act). */
		once = *a;
		a = &once;
		memset(&prog_act[sig], 0, sizeof prog_act[sig]);
	}
	if (!(a->sa_flags & SA_RESTART))
		sig_norestart = 1;
	t_handled++;
	in_handler++;
	if (a->sa_flags & SA_SIGINFO)
		a->sa_sigaction(sig, si, uc);
	else if (a->sa_handler != SIG_DFL && a->sa_handler != SIG_IGN)
		a->sa_handler(sig);
	in_handler--;
}

/* on_signal stands in for the program's handlers (Onload defers its
 * signals the same way): on a thread in the core it only notes the
 * signal, and the thread runs the handler when it leaves (run_held), as
 * if the signal had come a moment later; elsewhere it runs it at once. */
static void on_signal(int sig, siginfo_t *si, void *uc)
{
	if (in_core) {
		sig_info[sig] = *si;
		sig_held |= 1ull << (sig - 1);
		return;
	}
	stack_t ss;
	int onstack = sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK);
	t_sigstack += onstack;
	call_handler(sig, si, uc);
	t_sigstack -= onstack;
}

/* run_held runs the handlers of the signals held while the thread was in
 * the core, each with the mask it asked for, as the kernel would have. */
static void run_held(void)
{
	int saved = errno;
	while (sig_held) {
		int sig = __builtin_ctzll(sig_held) + 1;
		sig_held &= ~(1ull << (sig - 1));
		sigset_t m = prog_act[sig].sa_mask, old;
		if (!(prog_act[sig].sa_flags & SA_NODEFER))
			sigaddset(&m, sig);
		pthread_sigmask(SIG_BLOCK, &m, &old);
		siginfo_t si = sig_info[sig];
		call_handler(sig, &si, NULL);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
	}
	errno = saved;
}

/* ---- signals that end the process ------------------------------------
 *
 * A signal whose default action ends the process closes its sockets on
 * the kernel. On a stack of the process's own the shim catches those of
 * them the program leaves at the default (from the core's load on) and
 * closes its connections as exit does (exit_close), then ends the
 * process by the same signal, at its default: the parent sees the same
 * status, and SIGQUIT still dumps core. The program reads back the
 * default (sigaction). Through on_signal, a signal that comes while its
 * thread is in the core waits for it to leave, as the program's own
 * handlers do. SIGPIPE (on_pipe) and the faults (on_fault) have catches
 * of their own, below. SIGPROF (the Go runtime's when it profiles) and
 * SIGKILL end the process unattended: onloadd is the answer there (a
 * stack from onloadd outlives its process). */

/* forward calls the handler next stands for (the Go runtime's), and
 * reports whether there was one. */
static int forward(const struct sigaction *next, int sig, siginfo_t *si, void *uc)
{
	if (next->sa_handler == SIG_DFL || next->sa_handler == SIG_IGN)
		return 0;
	if (next->sa_flags & SA_SIGINFO)
		next->sa_sigaction(sig, si, uc);
	else
		next->sa_handler(sig);
	return 1;
}

/* ---- SIGPIPE -------------------------------------------------------------
 *
 * The Go runtime installs its own handler for SIGPIPE: a write of Go's
 * to a socket or pipe with no reader fails with EPIPE and goes on. For a
 * write of the program's at the default it ends the process, unattended.
 * Where the program leaves SIGPIPE at its default, on_pipe stands in
 * front of the runtime's handler (stood): the SIGPIPE of a thread
 * outside the core (the program's write to a kernel fd with no reader,
 * or the shim's own for a connection that can send no more) closes the
 * connections first (close_at_end) and ends the process by it; one on a
 * thread inside the core (the core's own write, to onloadd's socket
 * say) goes on to the runtime's handler, as before. A default the
 * program sets later puts on_pipe back: with the real default there,
 * the core's own writes would end the process. */
static struct sigaction stood[NSIG]; /* what stood before on_fault or on_pipe */

static void on_pipe(int sig, siginfo_t *si, void *uc)
{
	if (in_core || prog_act[sig].sa_handler != SIG_DFL) {
		if (forward(&stood[sig], sig, si, uc))
			return;
	} else {
		close_at_end(sig);
	}
	set_default(sig);
	raise(sig); /* it ends the process as the handler returns */
}

static void pipe_act(struct sigaction *a)
{
	memset(a, 0, sizeof *a);
	a->sa_sigaction = on_pipe;
	a->sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigfillset(&a->sa_mask);
}

static int is_on_pipe(const struct sigaction *a)
{
	return (a->sa_flags & SA_SIGINFO) && a->sa_sigaction == on_pipe;
}

static int ends_process(int sig)
{
	switch (sig) {
	case SIGHUP: case SIGINT: case SIGQUIT: case SIGTERM: case SIGUSR1: case SIGUSR2:
	case SIGALRM: case SIGVTALRM: case SIGXCPU: case SIGXFSZ: case SIGIO: case SIGPWR:
	case SIGSTKFLT: case SIGABRT:
		return 1;
	}
	/* The real-time signals the program may use (not glibc's own,
	 * below SIGRTMIN) end it too at their default. */
	return sig >= SIGRTMIN && sig <= SIGRTMAX;
}

static int catching_ends(void)
{
	return core_state == 1 && !after_fork;
}

static void end_act(struct sigaction *a)
{
	memset(a, 0, sizeof *a);
	a->sa_sigaction = on_signal;
	a->sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigfillset(&a->sa_mask);
}

/* handler_act is the real action for the program's handler act:
 * on_signal, on the thread's alternate stack where there is one, with
 * the siginfo it keeps. A one-shot handler (SA_RESETHAND) of a signal
 * that ends the process is reset by call_handler, not the kernel, so
 * that the default it leaves is the catch: a handler that tidies and
 * raises the signal again (node's, for SIGTERM and SIGINT) ends the
 * process there. */
static void handler_act(int sig, const struct sigaction *act, struct sigaction *a)
{
	*a = *act;
	a->sa_flags |= SA_ONSTACK | SA_SIGINFO;
	a->sa_sigaction = on_signal;
	if (ends_process(sig) && catching_ends())
		a->sa_flags &= ~SA_RESETHAND;
}

static int is_on_signal(const struct sigaction *a)
{
	return (a->sa_flags & SA_SIGINFO) && a->sa_sigaction == on_signal;
}

/* ---- faults ------------------------------------------------------------
 *
 * A fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) or abort()'s
 * SIGABRT ends the process, and on the kernel its sockets close: the
 * peers read the end at once. Where the program leaves the fault at its
 * default, on_fault stands in front of what was there (the Go runtime's
 * handler, for SIGSEGV, SIGBUS and SIGFPE, which it needs for Go's own
 * panics): a fault in the program's code closes the connections first
 * (close_at_end), then takes the default, so that the process ends by
 * the same signal and dumps the same core (a fault comes again as the
 * handler returns; a signal sent, as raise sends it, is raised again). A
 * fault in the core or in the interposer, or on a thread inside the
 * core, goes on to the runtime's handler untouched: the stack may be
 * half way through a change there, and no close is tried. SIGABRT, which
 * no fault sends, is caught as the other signals that end the process
 * are (ends_process). */
static int fault_sig(int sig)
{
	return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP || sig == SIGSYS;
}

static uintptr_t core_text[2], shim_text[2]; /* [lo, hi): the core's and our mappings */

struct text_find {
	uintptr_t at, *r;
};

/* text_each is dl_iterate_phdr's callback: the span of info's loaded
 * segments, if it holds f->at. */
static int text_each(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	struct text_find *f = data;
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD)
			continue;
		uintptr_t a = info->dlpi_addr + ph->p_vaddr;
		lo = a < lo ? a : lo;
		hi = a + ph->p_memsz > hi ? a + ph->p_memsz : hi;
	}
	if (f->at < lo || f->at >= hi)
		return 0;
	f->r[0] = lo, f->r[1] = hi;
	return 1;
}

/* text_range finds the mapping of the object that holds fn (read once,
 * outside any handler: dl_iterate_phdr takes the loader's lock). */
static void text_range(void *fn, uintptr_t *r)
{
	struct text_find f = {(uintptr_t)fn, r};
	dl_iterate_phdr(text_each, &f);
}

static int in_text(const uintptr_t *r, uintptr_t pc)
{
	return pc >= r[0] && pc < r[1];
}

static uintptr_t fault_pc(void *uc)
{
#if defined(__x86_64__)
	return uc ? (uintptr_t)((ucontext_t *)uc)->uc_mcontext.gregs[REG_RIP] : 0;
#elif defined(__aarch64__)
	return uc ? (uintptr_t)((ucontext_t *)uc)->uc_mcontext.pc : 0;
#else
	return 0;
#endif
}

/* on_fault: see "faults" above. */
static void on_fault(int sig, siginfo_t *si, void *uc)
{
	uintptr_t pc = fault_pc(uc);
	const struct sigaction *next = &stood[sig];
	if (in_core || in_text(core_text, pc) || in_text(shim_text, pc)) {
		if (si->si_code <= 0 && syscall(SYS_gettid) != getpid()) {
			/* Sent (kill), not a fault, and to a thread that cannot
			 * close: one of the Go runtime's, or one inside the core.
			 * The main thread takes it, now or once it unblocks it
			 * (redis's crash report resets the default and sends the
			 * signal to the process from its handler). A main thread
			 * that blocks it for good keeps the process alive, where
			 * the kernel's choice of thread might have ended it. */
			syscall(SYS_tgkill, getpid(), getpid(), sig);
			return;
		}
		if (forward(next, sig, si, uc))
			return;
	} else {
		close_at_end(sig);
	}
	set_default(sig);
	if (si->si_code <= 0)
		raise(sig); /* sent, not a fault: it ends the process as the handler returns */
}

static void fault_act(struct sigaction *a)
{
	memset(a, 0, sizeof *a);
	a->sa_sigaction = on_fault;
	a->sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigfillset(&a->sa_mask);
}

static int is_on_fault(const struct sigaction *a)
{
	return (a->sa_flags & SA_SIGINFO) && a->sa_sigaction == on_fault;
}

/* in_front: sig has a catch that stands in front of what stood there
 * (stood): on_pipe for SIGPIPE, on_fault for the faults. */
static int in_front(int sig)
{
	return sig == SIGPIPE || fault_sig(sig);
}

static void front_act(int sig, struct sigaction *a)
{
	if (sig == SIGPIPE)
		pipe_act(a);
	else
		fault_act(a);
}

/* catch_ends runs once the core has loaded; uncatch_ends, in a child
 * forked after that, gives back the defaults and the kernel's resets:
 * Go cannot run there, and the parent's connections are the parent's. */
static void catch_ends(void)
{
	text_range((void *)core.listen, core_text);
	text_range((void *)on_fault, shim_text);
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction cur, a;
		if (in_front(sig)) {
			/* The Go runtime's handler stands where the program left
			 * the default (SIGPIPE, SIGSEGV, SIGBUS, SIGFPE), or the
			 * default. */
			if (prog_act[sig].sa_handler == SIG_DFL && real_sigaction(sig, NULL, &cur) == 0 &&
			    (cur.sa_handler == SIG_DFL || runtime_handler(&cur))) {
				stood[sig] = cur;
				front_act(sig, &a);
				real_sigaction(sig, &a, NULL);
			}
			continue;
		}
		if (!ends_process(sig) || real_sigaction(sig, NULL, &cur) < 0)
			continue;
		if (cur.sa_handler == SIG_DFL)
			end_act(&a);
		else if (is_on_signal(&cur) && prog_act[sig].sa_flags & SA_RESETHAND)
			handler_act(sig, &prog_act[sig], &a);
		else
			continue;
		real_sigaction(sig, &a, NULL);
	}
}

static void uncatch_ends(void)
{
	for (int sig = 1; sig < NSIG; sig++) {
		struct sigaction cur, a;
		if (in_front(sig) && real_sigaction(sig, NULL, &cur) == 0 && (is_on_fault(&cur) || is_on_pipe(&cur))) {
			real_sigaction(sig, &stood[sig], NULL);
			continue;
		}
		if (!ends_process(sig) || real_sigaction(sig, NULL, &cur) < 0 || !is_on_signal(&cur))
			continue;
		if (prog_act[sig].sa_handler == SIG_DFL) {
			set_default(sig);
		} else if (prog_act[sig].sa_flags & SA_RESETHAND) {
			handler_act(sig, &prog_act[sig], &a);
			real_sigaction(sig, &a, NULL);
		}
	}
}

/* close_at_end closes the connections as sig ends the process
 * (exit_close; if another thread is at it, waits up to 3 s for that
 * thread to end the process). Its caller has every signal blocked. */
static void close_at_end(int sig)
{
	if (!catching_ends() || t_ending)
		return;
	debugf("signal %d ends the process: its connections close first", sig);
	/* The close runs Go from a signal handler. Should it ever hang, the
	 * process still ends: SIGKILL from a timer in 3 s. */
	struct sigevent sev;
	memset(&sev, 0, sizeof sev);
	sev.sigev_notify = SIGEV_SIGNAL;
	sev.sigev_signo = SIGKILL;
	int timer;
	struct itimerspec at = {.it_value = {3, 0}};
	if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &sev, &timer) == 0)
		syscall(SYS_timer_settime, timer, 0, &at, NULL);
	exit_close();
	struct timespec ms = {0, 1000000};
	for (int i = 0; i < 3000 && !t_ending; i++)
		nanosleep(&ms, NULL);
}

static void set_default(int sig)
{
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	real_sigaction(sig, &dfl, NULL);
}

/* end_by_signal closes the connections (close_at_end), then raises sig
 * again at its default, which ends the process. */
static void end_by_signal(int sig)
{
	sigset_t all, one, old;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	close_at_end(sig);
	set_default(sig);
	raise(sig);
	sigemptyset(&one);
	sigaddset(&one, sig);
	pthread_sigmask(SIG_UNBLOCK, &one, NULL); /* the process ends here */
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* set_prog_act records act (if any) as the program's disposition of sig
 * and installs use in its place; old gets the program's own, not ours
 * (stands_in) nor the Go runtime's (its SIGPIPE, SIGSEGV, ...). */
static int set_prog_act(int sig, const struct sigaction *act, const struct sigaction *use, struct sigaction *old,
			int (*stands_in)(const struct sigaction *))
{
	struct sigaction before = prog_act[sig], prev;
	if (act)
		prog_act[sig] = *act;
	if (real_sigaction(sig, use, &prev) < 0) {
		prog_act[sig] = before;
		return -1;
	}
	if (old) {
		*old = prev;
		if (stands_in(&prev) || (!loading && runtime_handler(&prev)))
			*old = before;
	}
	return 0;
}

static int held_stand_in(const struct sigaction *a)
{
	return is_on_signal(a) || is_on_pipe(a);
}

/* fault_sigaction is the program's sigaction of a fault signal (not the
 * Go runtime's, which installs its own handler for some): its
 * disposition is kept, for catch_ends, and read back; once the core has
 * loaded, the default is on_fault's. */
static int fault_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	struct sigaction a;
	const struct sigaction *use = act;
	if (act && act->sa_handler == SIG_DFL && catching_ends()) {
		fault_act(&a);
		use = &a;
	}
	return set_prog_act(sig, act, use, old, is_on_fault);
}

/* sigaction: the program's handlers are called through on_signal, on the
 * thread's alternate stack where there is one (a thread in the Go core
 * has Go's), which notes for our blocking calls whether they restart
 * interrupted calls. The program reads back its own handlers. */
EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (held_sig(sig) && loading && act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN &&
	    act->sa_handler == prog_act[sig].sa_handler) {
		/* The Go runtime, starting, puts back a handler of the
		 * program's that lacks SA_ONSTACK with it (setsigstack), from
		 * what it read here: it stays on_signal, which runs on the
		 * alternate stack already. */
		if (old)
			*old = prog_act[sig];
		return 0;
	}
	if (fault_sig(sig) && !loading && !in_text(core_text, (uintptr_t)__builtin_return_address(0)))
		return fault_sigaction(sig, act, old);
	if (!held_sig(sig) || (act && runtime_handler(act)))
		return real_sigaction(sig, act, old);
	struct sigaction a;
	const struct sigaction *use = act;
	if (act && act->sa_handler != SIG_DFL && act->sa_handler != SIG_IGN) {
		handler_act(sig, act, &a);
		use = &a;
	} else if (act && act->sa_handler == SIG_DFL && ends_process(sig) && catching_ends()) {
		end_act(&a);
		use = &a;
	} else if (act && act->sa_handler == SIG_DFL && sig == SIGPIPE && catching_ends()) {
		pipe_act(&a);
		use = &a;
	}
	return set_prog_act(sig, act, use, old, held_stand_in);
}

/* signal: glibc's, BSD semantics (SA_RESTART), through ours. */
EXPORT sighandler_t signal(int sig, sighandler_t h)
{
	struct sigaction a, old;
	memset(&a, 0, sizeof a);
	a.sa_handler = h;
	a.sa_flags = SA_RESTART;
	sigemptyset(&a.sa_mask);
	sigaddset(&a.sa_mask, sig);
	if (sigaction(sig, &a, &old) < 0)
		return SIG_ERR;
	return old.sa_handler;
}
