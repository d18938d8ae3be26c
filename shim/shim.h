/*
 * libonload.so: the LD_PRELOAD interposer. `onloadd run -- CMD` preloads
 * it into an unmodified program.
 *
 * It keeps a table of the program's file descriptors that are TCP sockets
 * (IPv4, or IPv6 reaching IPv4: fdent.v6). Every call on any other
 * descriptor goes straight to libc (its function found once with
 * dlsym(RTLD_NEXT)) after one table lookup.
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
 * the child and in the parent; close() closes only the child's fd. An
 * inherited listener's port goes to its kernel socket, which the two
 * share, at the child's first accept or wait on it. A
 * connection passed across exec is handed over before it.
 *
 * The program's signal handlers run through on_signal, which holds a
 * signal that finds its thread in the core until the thread leaves. On a
 * stack of the process's own, its end closes its connections as the
 * kernel's would: exit (atexit), _exit, the signals it leaves at a
 * default that ends it (caught, then raised again at the default), and
 * a fault in its own code (on_fault).
 */
#ifndef ONLOAD_SHIM_INTERNAL_H
#define ONLOAD_SHIM_INTERNAL_H

#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <netinet/in.h>
#include <net/if.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <sched.h>
#include <signal.h>
#include <alloca.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <spawn.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/auxv.h>
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

/* Every name the files define is the library's own (hidden), whatever
 * the compiler's flags, but the calls marked EXPORT: a program's
 * function or variable of the same name must not bind to ours. */
#pragma GCC visibility push(hidden)
#define EXPORT __attribute__((visibility("default")))

/* libc's functions, found once with dlsym(RTLD_NEXT) at load (init, in
 * process.c, or a call before it: resolve_libc in core.c): real_NAME is
 * libc's NAME. */
#define LIBC(X) \
	X(int, socket, int, int, int) \
	X(int, listen, int, int) \
	X(int, accept, int, struct sockaddr *, socklen_t *) \
	X(int, accept4, int, struct sockaddr *, socklen_t *, int) \
	X(int, connect, int, const struct sockaddr *, socklen_t) \
	X(ssize_t, read, int, void *, size_t) \
	X(ssize_t, write, int, const void *, size_t) \
	X(ssize_t, readv, int, const struct iovec *, int) \
	X(ssize_t, writev, int, const struct iovec *, int) \
	X(ssize_t, recv, int, void *, size_t, int) \
	X(ssize_t, recvfrom, int, void *, size_t, int, struct sockaddr *, socklen_t *) \
	X(ssize_t, recvmsg, int, struct msghdr *, int) \
	X(int, recvmmsg, int, struct mmsghdr *, unsigned int, int, struct timespec *) \
	X(ssize_t, send, int, const void *, size_t, int) \
	X(ssize_t, sendto, int, const void *, size_t, int, const struct sockaddr *, socklen_t) \
	X(ssize_t, sendmsg, int, const struct msghdr *, int) \
	X(int, sendmmsg, int, struct mmsghdr *, unsigned int, int) \
	X(ssize_t, sendfile, int, int, off_t *, size_t) \
	X(ssize_t, splice, int, loff_t *, int, loff_t *, size_t, unsigned int) \
	X(int, close, int) \
	X(int, shutdown, int, int) \
	X(int, getsockopt, int, int, int, void *, socklen_t *) \
	X(int, setsockopt, int, int, int, const void *, socklen_t) \
	X(int, getsockname, int, struct sockaddr *, socklen_t *) \
	X(int, getpeername, int, struct sockaddr *, socklen_t *) \
	X(int, fcntl, int, int, ...) \
	X(int, ioctl, int, unsigned long, ...) \
	X(int, dup, int) \
	X(int, dup2, int, int) \
	X(int, dup3, int, int, int) \
	X(int, poll, struct pollfd *, nfds_t, int) \
	X(int, ppoll, struct pollfd *, nfds_t, const struct timespec *, const sigset_t *) \
	X(int, select, int, fd_set *, fd_set *, fd_set *, struct timeval *) \
	X(int, pselect, int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *) \
	X(int, epoll_create, int) \
	X(int, epoll_create1, int) \
	X(int, epoll_ctl, int, int, int, struct epoll_event *) \
	X(int, epoll_wait, int, struct epoll_event *, int, int) \
	X(int, epoll_pwait, int, struct epoll_event *, int, int, const sigset_t *) \
	X(int, epoll_pwait2, int, struct epoll_event *, int, const struct timespec *, const sigset_t *) \
	X(pid_t, fork, void) \
	X(int, execve, const char *, char *const[], char *const[]) \
	X(int, execvpe, const char *, char *const[], char *const[]) \
	X(int, fexecve, int, char *const[], char *const[]) \
	X(int, posix_spawn, pid_t *, const char *, const posix_spawn_file_actions_t *, \
	  const posix_spawnattr_t *, char *const[], char *const[]) \
	X(int, posix_spawnp, pid_t *, const char *, const posix_spawn_file_actions_t *, \
	  const posix_spawnattr_t *, char *const[], char *const[]) \
	X(int, posix_spawn_file_actions_adddup2, posix_spawn_file_actions_t *, int, int) \
	X(int, system, const char *) \
	X(FILE *, popen, const char *, const char *) \
	X(FILE *, fdopen, int, const char *) \
	X(int, vdprintf, int, const char *, va_list) \
	X(int, sigaction, int, const struct sigaction *, struct sigaction *) \
	X(int, sigaltstack, const stack_t *, stack_t *) \
	X(void, siglongjmp, struct __jmp_buf_tag *, int) \
	X(void, longjmp, struct __jmp_buf_tag *, int) \
	X(void, _longjmp, struct __jmp_buf_tag *, int) \
	X(void, __longjmp_chk, struct __jmp_buf_tag *, int) \
	X(int, nanosleep, const struct timespec *, struct timespec *) \
	X(int, clock_nanosleep, clockid_t, int, const struct timespec *, struct timespec *) \
	X(int, pause, void) \
	X(int, sigsuspend, const sigset_t *) \
	X(int, sigtimedwait, const sigset_t *, siginfo_t *, const struct timespec *) \
	X(void, _exit, int) \
	X(int, pthread_create, pthread_t *, const pthread_attr_t *, void *(*)(void *), void *) \
	X(int, setrlimit, __rlimit_resource_t, const struct rlimit *) \
	X(int, getrlimit, __rlimit_resource_t, struct rlimit *) \
	X(int, prlimit, pid_t, __rlimit_resource_t, const struct rlimit *, struct rlimit *)
#define REAL_DECL(ret, name, ...) extern ret (*real_##name)(__VA_ARGS__);
LIBC(REAL_DECL)
void resolve_libc(void);

/* The Go core's functions (onl_NAME in libonload-core.so), found at its
 * load (load_core). */
struct core_fns {
	int (*listen)(int, uint32_t, int);
	int (*connect)(int, uint32_t, uint16_t, int, int); /* the last two: IP_TOS, IP_TTL, -1 for none */
	int (*accept)(int, int);
	long (*recv)(int, void *, size_t, int, int *); /* the last: set if the next wait owes a kick */
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
	void (*forget_efd)(int);
	void (*thread)(void (*)(const char *, int)); /* the log's writer, or NULL */
	void (*thread_gone)(void);
	void (*resched)(void);
	int (*retire_listener)(int);
	int (*child_served)(int); /* 1: the connection's listener went to the kernel now */
	long (*spin_ns)(void);
	int (*blocked_threads)(void);
	int (*try_spin)(void);
	void (*end_spin)(void);
	void (*close)(int);
	int (*shutdown)(int, int);
	int (*setopt)(int, int, int);
	int (*getopt)(int, int); /* a value >= 0, or -errno */
	int (*addrs)(int, uint32_t *, uint16_t *, uint32_t *, uint16_t *);
	int (*sockerr)(int);
	int (*unread)(int);
	int (*tcpinfo)(int, struct onl_tcpinfo *);
	int (*handover_info)(int, uint32_t *, uint32_t *, char *, int);
	int (*handover)(int, int);
	int (*handed_over)(int);
	void (*exit)(void);
	int (*own_stack)(void);
	int (*ifindex)(void);
	void (*init)(int, void (*)(int, int));
};
extern struct core_fns core;

/* ---- types and constants the files share ------------------------- */

/* maybe_ours has a bit for each fd below NFAST that is accelerated: set
 * before the fd's entry becomes K_OURS, cleared when it stops. A call on
 * any other fd reads one word here, beside libc's function pointers, and
 * never the fd table: where every system call flushes the TLB (page-table
 * isolation without PCID, as on the machine the shim was measured on),
 * each page an interposed call touches costs a page walk. */
#define NFAST 8192

/* A thread that calls the core gets a signal stack, in place of any the
 * program gave it (which may be small, or shared between threads, as
 * varnish's is: wait.c's install_altstack): the Go runtime takes it as
 * the thread's, and the program's handlers
 * run on it (SA_ONSTACK). A handler's socket call enters Go from there,
 * and Go assumes 32 KiB of it are free below: Go's own stack for a
 * thread that has none is 32 KiB in all. */
#define ALTSTACK (256 << 10)

#define debugf(...) do { if (log_debug) logf_(__VA_ARGS__); } while (0)

/* Calls into the core mark the thread: a signal that comes meanwhile is
 * held until the call is done (on_signal), so that its handler, which
 * may touch a socket, never re-enters Go. */
#define CORE(call) ({ core_enter(); __typeof__(call) r_ = (call); core_leave(); r_; })

#define CORE_VOID(call) do { core_enter(); call; core_leave(); } while (0)

enum {
	K_NONE,	   /* not ours: libc */
	K_TCP,	   /* a TCP socket (IPv4, or IPv6: v6) the core has not seen */
	K_OURS,	   /* accelerated */
	K_EPOLL,   /* an epoll instance */
	K_CORE,	   /* the stack's own (core.c, "the core's own descriptors") */
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
	union {
		/* K_OURS: reads/writes that found nothing: EPOLLET */
		struct {
			uint32_t rd_eagain, wr_eagain;
		};
		/* K_EPOLL: the threads in a wait on it, and its wake
		 * eventfd + 1 (0: none yet): ep_wake. */
		struct {
			uint32_t waiters;
			int wake_fd1;
		};
	};
	struct ep *ep;	    /* K_EPOLL */
	/* K_OURS, a connection: its names at onloadd, for a child forked
	 * after the core loaded to ask for its handover (prepare_fork). */
	uint8_t ho_ok;
	uint32_t ho_stack, ho_sock;
	/* K_OURS: CONN_PENDING, its connect has not told the program how it
	 * ended (it returned EINPROGRESS or EINTR): the next connect does,
	 * as the kernel's; CONN_FAILED, it told a failure: the next connect
	 * starts anew (connect_again). */
	uint8_t connecting;
	/* K_TCP: made by socket() here (fresh: its options are the
	 * kernel's defaults), and whether the program set an option on it
	 * since (copy_options). */
	uint8_t fresh, opts_set;
	/* K_TCP: the program set TCP_CONGESTION on it (its kernel socket's
	 * is the program's choice, not the namespace's default). */
	uint8_t cc_set;
	/* K_TCP: the program may have set SO_RCVTIMEO or SO_SNDTIMEO on it
	 * (or it came across exec): htimeo's flag once it is ours. */
	uint8_t timeo;
	/* K_TCP, K_OURS: the program's socket is IPv6 (AF_INET6), reaching
	 * IPv4 peers through IPv4-mapped addresses (::ffff:a.b.c.d): its
	 * names are given as such (fill_addr). */
	uint8_t v6;
	/* K_EPOLL: made readable in the kernel for a set that holds it
	 * (ep_poke), not yet drained. */
	uint8_t poked;
	/* K_TCP, listening: the process that called listen() on it, or 0
	 * (it came across exec). Another process's listener is shared by
	 * inheritance (a pre-fork server's workers): accel_listener says so
	 * to the core, which a cluster's stacks share it by. Last, in the
	 * padding after v6: the entry stays 48 bytes. */
	pid_t lpid;
};
_Static_assert(sizeof(struct fdent) == 48, "a table entry grew");

#define MAX_HANDLES (1 << 17)
#define CONN_PENDING 1
#define CONN_FAILED 2

/* In a child forked after the core loaded, a connection is handed over
 * to the kernel at its first use: e becomes NULL, and the call goes to
 * the kernel. */
#define CHILD_TAKES(fd, e) do { \
	if ((e) && after_fork && !(e)->listening && child_takes((fd), (e)) == 0) (e) = NULL; \
} while (0)

/* CHILD_TAKES, and a listener's port goes to its kernel socket, at a use
 * that takes or waits for its connections (accept, poll, select, epoll).
 * A listener's names and options the child reads from its kernel socket
 * as it is: a child that only looks at it (getsockname) leaves the port
 * on the stack. */
#define CHILD_TAKES_ANY(fd, e) do { \
	if ((e) && after_fork && child_takes((fd), (e)) == 0) (e) = NULL; \
} while (0)

/* A call on an accelerated socket: the core must be usable from here. */
#define CHECK_USABLE() do { \
	if (after_fork) return refuse_after_fork(); \
	if (in_core) { errno = EINTR; return -1; } \
} while (0)

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

/* keep_p's period for a thread that does not block (wait.c). */
#define RESCHED_BUSY_NS 8000000

/* A wait on the kernel's fds alone goes straight to libc. Once the core
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

/* EP_NOFD is a member's fd once the fd that made it is closed while
 * another names its socket (epoll_forget). */
#define EP_NOFD (-1)

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

/* EP_KERNEL_ONLY: an instance whose last this many waits ended with
 * events of the kernel's set alone (its members that are not accelerated:
 * pipes, a listener's kernel half, connections that came through the
 * kernel), none of the stack's, blocks at once instead of spinning: the
 * spin sees the kernel's set every EP_KERNEL_NS only, and takes the
 * processor from the peers that make those fds ready. haproxy after a
 * seamless reload, serving the connections its clients made while its
 * listener was the kernel's: 0.55-0.60 of the requests a second it served
 * on the kernel, spinning, and as many with no spin. A wait that gets an
 * event of the stack's spins again. A thread's poll and select count so
 * too (t_kernel_only), over whatever sets it waits on. */
#define EP_KERNEL_ONLY 8

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
	unsigned kernel_only; /* waits in a row that got the kernel's events only (EP_KERNEL_ONLY) */
	int *hidx, nhidx; /* by handle: its member's index + 1 (0: none) */
	int *pend, npend; /* handles to check at the next call; room for cap */
	struct epi items[];
};

/* ---- what each file defines for the others ----------------------- */

/* core.c */
extern uint64_t maybe_ours[NFAST / 64];
/* fdt_used has a bit for each FDT_BLOCK entries of the table of which
 * one may have had a kind (set_kind): close_range looks at those only. */
#define FDT_BLOCK 512
extern uint64_t fdt_used[(1 << 20) / FDT_BLOCK / 64];
extern int core_state;
extern int after_fork;
extern int log_debug;
extern int secure_mode;
extern const char *log_file;
extern long spin_ns;
extern int blocked_limit;
extern int irq_fd;
extern int remote_fd;
extern pthread_mutex_t mu;
extern __thread volatile int in_core;
extern __thread volatile int t_locks;
extern __thread int t_go; /* a thread the Go runtime made (signals.c) */
extern __thread int in_handler;
extern __thread int kick_owed;
extern struct sigaction prog_act[NSIG];
extern __thread volatile uint64_t sig_held;
extern __thread siginfo_t sig_info[NSIG];
extern __thread int t_alt;
extern __thread void *t_alt_mem;
extern int loading;
extern void *core_base;
extern uintptr_t core_end;
void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* log_write writes a whole line (with its newline) where the log goes;
 * log_keep_open opens ONLOAD_LOG_FILE as the process starts (core.c). */
void log_write(const char *buf, int n);
void log_keep_open(void);
void exit_close(void);
int load_core(void);
/* The shim installed set-user-ID where the dynamic loader's secure mode
 * takes it from (core.c): trusted_dir says whether dir (without a
 * trailing slash) is one of the loader's system directories. */
int trusted_dir(const char *dir, size_t n);

/* RLIMIT_AS beside the core (limits.c): as_room says whether the core may
 * load under the limit (load_core asks); as_for_exec and as_exec_failed
 * give the program's own limit to the program it execs. */
int as_room(void);
void as_for_exec(void);
void as_exec_failed(void);
void as_for_spawned(pid_t pid);
char **as_spawn_env(char *const envp[]);
void as_environ_enter(void);
void as_environ_leave(void);
void as_from_env(void);

/* io_uring instances (uring.c): uring_keeps_kernel says whether a ring
 * among the open fds (a bit an fd) keeps the process's sockets in the
 * kernel (load_core asks); a ring the program makes after the core loaded
 * makes it leave the stack (leave_stack). */
int uring_keeps_kernel(const uint8_t *open);
int fd_high(int fd);
extern __thread int t_sigstack;
extern __thread sigset_t t_sigstack_mask;
extern __thread int t_ending;

/* fdtable.c */
extern struct fdent *fdt;
extern int nfdt;
extern int *hrefs;
extern int *hfds;
extern uint8_t *htimeo;
extern uint32_t *hlowat;
extern uint32_t *fdgen;
int refuse_after_fork(void);
int core_fd_refused(int fd, const char *call);
int core_fd_live(int fd, struct fdent *e);
int child_takes(int fd, struct fdent *e);
void set_ours(int fd, int h, int nonblock, int knb, int listening, int timeo);
void drop(int fd);
void kernel_now(struct fdent *e);
int kernel_took(int fd);
extern int forked_after_core;
void prepare_fork(void);
void parent_after_fork(void);
void fork_unlock_child(void);

/* wait.c */
void thread_altstack(void);
extern pthread_key_t thread_key;
extern __thread int t_efd;
extern __thread int t_ep;
extern __thread int t_ep_prog;
extern uint32_t epoll_gen;
extern int waiter_threads;
extern __thread char t_waiter;
extern __thread char t_keyed;
void thread_exit(void *p);
int64_t now_ns(void);
short to_poll(int ev);
int from_poll(short ev);
extern __thread int sig_norestart;
extern __thread unsigned t_handled;
void wait_end(struct wait *w);
int wait_over(struct wait *w, int64_t *now);
extern int log_wait_off;
int wait_block(struct wait *w, int64_t now, int *hs, int *want, int *evs, unsigned *edges, int k,
		      const unsigned *logseq, struct pollfd *p, int np, int epfd, int conns, const sigset_t *mask);
int wait_poll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask);
int wait_poll_sel(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask, int sel);
int wait_one(int fd, short events, int64_t deadline);
void keep_p(int64_t now, int64_t every);
/* A blocking call's deadline before its first wait reads it
 * (ccall_blocked). */
#define DL_UNREAD (-2)
int64_t sock_deadline(const struct fdent *e, int fd, short ev);
/* Thread cancellation (pthread_cancel). A call of the program's on an
 * accelerated socket is a cancellation point where the kernel's is (a
 * blocking recv, accept, connect, poll, select, epoll_wait), and only
 * there: the shim's own work runs with cancellation off (cancel_off,
 * cancel_on, nesting), and the one system call a call blocks in is
 * made a cancellation point again (CANCEL_POINT), with what the call
 * holds (a socket, the stack's arms, an instance's waiter count) noted
 * on the thread's undo list (undo_push, undo_pop: last in, first out),
 * which a cancellation runs as the thread unwinds. Before, a thread
 * cancelled in a blocking recv kept its hold on the socket: the
 * program's close of it sent no FIN until the process ended. */
struct undo {
	void (*fn)(void *);
	void *arg;
	struct undo *next;
};
extern __thread struct undo *t_undo;
extern __thread int t_coff, t_cancel_was;
static inline void cancel_off(void)
{
	if (t_coff++ == 0)
		pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &t_cancel_was);
}
static inline void cancel_on(void)
{
	if (--t_coff == 0)
		pthread_setcancelstate(t_cancel_was, NULL);
}
static inline void undo_push(struct undo *u, void (*fn)(void *), void *arg)
{
	u->fn = fn;
	u->arg = arg;
	u->next = t_undo;
	t_undo = u;
}
static inline void undo_pop(struct undo *u) { t_undo = u->next; }
void run_undo(void *unused);
/* CANCEL_POINT runs stmt, a blocking system call, as a cancellation point
 * if the program's thread had cancellation on (as its outermost call
 * into the shim found it). A cancellation there runs the whole undo
 * list: a signal handler's call blocked there unwinds through the call
 * it interrupted too. errno is kept. */
#define CANCEL_POINT(stmt)                                                     \
	do {                                                                   \
		int cp_ = t_coff > 0 && t_cancel_was == PTHREAD_CANCEL_ENABLE; \
		pthread_cleanup_push(run_undo, NULL);                          \
		if (cp_)                                                       \
			pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);   \
		stmt;                                                          \
		if (cp_) {                                                     \
			int e_ = errno;                                        \
			pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, NULL);  \
			errno = e_;                                            \
		}                                                              \
		pthread_cleanup_pop(0);                                        \
	} while (0)

/* A call on an accelerated socket (wait.c: recv, send, accept and a
 * blocking connect). */
struct ccall {
	struct fdent *e;
	int fd, h, nonblock, held;
	int coff; /* cancellation off (cancel_off) since its first block */
	uint32_t gen;
	struct undo undo; /* while held */
};
#define CC_OK 0
#define CC_CLOSED 1
#define CC_KERNEL 2
struct ccall ccall_begin(struct fdent *e, int fd);
int ccall_check(const struct ccall *c);
int ccall_gone(const struct ccall *c);
int ccall_taken(const struct ccall *c);
int ccall_blocked(struct ccall *c, int flags, short ev, int64_t *deadline);
void ccall_end(struct ccall *c);
void ccall_done(struct ccall *c);
void ccall_to_kernel(struct ccall *c);
int timeo_opt(int level, int name);

/* process.c */
void handover_at_exit(void);
void handover_for_close(int fd, struct fdent *e);
int to_kernel(int fd, struct fdent *e, const char *why);
int listener_to_kernel(int fd, struct fdent *e);
/* leave_stack: the process's sockets go to the kernel, once, for why
 * (process.c); left_stack says that they went (or go, as their users ask
 * of them), and that new ones stay the kernel's, left_why why. */
int leave_stack(const char *why, const char *what, const char *hint, int loud, int conns);
extern int left_stack;
extern const char *left_why;
void adopt_received(const struct msghdr *m);
void each_passed_fd(const struct msghdr *m, void (*fn)(int fd));

/* calls.c */
extern __thread int t_tee[2];
void accel_listener(int fd, struct fdent *e);

/* poll.c */
int64_t ts_ns(const struct timespec *t);
int kwait_again(struct kwait *k, int r, int64_t *left_ns);
int ns_ms(int64_t ns);
struct timespec *ns_ts(int64_t ns, struct timespec *ts);

/* epoll.c */
void epoll_forget(int fd, int h, int last);
void ep_free(struct ep *ep);
/* An instance that a poll or select holds (epoll.c, ep_peek): what to arm
 * for its accelerated members while the wait blocks. */
struct arms {
	int *hs, *want, *evs;
	unsigned *edges;
	int n, cap;
};
int arms_room(struct arms *a, int n);
int arms_append(struct arms *a, const int *hs, const int *want, const unsigned *edges, int k);
int ep_peek(int epfd, struct arms *a, int spinning);
void kreg_forget(int fd);
void kreg_take(int fd, struct fdent *fe);
void epoll_to_kernel(int fd, int h);

/* signals.c */
void run_held(void);
int held_sig(int sig);
int fault_sig(int sig);
void catch_ends(void);
void uncatch_ends(void);

/* ---- small helpers, inline on the hot paths ----------------------- */

/* mark_ours sets or clears fd's bit in maybe_ours. */
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
	if (sig_held && !t_locks)
		run_held();
}

/* locks_taking and locks_gone count the shim's locks (the table's, the
 * core's load) a thread takes and lets go. While it holds one its
 * signals wait, as in the core (on_signal), and run as the last goes: a
 * handler run there that called the shim (epoll_create, close, a fork
 * whose child does) took the lock again, and hung the thread, or the
 * child, which starts with the lock held. postgres 15's postmaster
 * forks its children from its SIGCHLD handler. */
/* A lock is held with cancellation off: a cancellation point of the C
 * library's under it (a close) would end the thread with it held. */
static inline void locks_taking(void)
{
	cancel_off();
	t_locks++;
}

static inline void locks_gone(void)
{
	if (--t_locks == 0 && !in_core && sig_held)
		run_held();
	cancel_on();
}

/* table_lock and table_unlock take and let go the table's lock, mu. */
static inline void table_lock(void)
{
	locks_taking();
	pthread_mutex_lock(&mu);
}

static inline void table_unlock(void)
{
	pthread_mutex_unlock(&mu);
	locks_gone();
}

/* ent is fd's entry in the table; ours, the entry of an accelerated
 * fd (NULL for any other, after one word of maybe_ours). */
static inline struct fdent *ent(int fd)
{
	return (unsigned)fd < (unsigned)nfdt ? &fdt[fd] : NULL;
}

/* ep_has_members says whether fd is an epoll instance with accelerated
 * members (a hint, without the table's lock: ep_peek takes it). */
extern int ep_lists; /* an instance ever had accelerated members */
static inline int ep_has_members(int fd)
{
	if (!__atomic_load_n(&ep_lists, __ATOMIC_RELAXED))
		return 0; /* a poll of the kernel's fds alone reads no entry */
	struct fdent *e = ent(fd);
	return e && e->kind == K_EPOLL && e->ep && e->ep->n;
}

/* block_used says whether an entry of fd's block (fdt_used) may have
 * had a kind; a loop over the table skips the others. */
static inline int block_used(unsigned fd)
{
	unsigned b = fd / FDT_BLOCK;
	return (__atomic_load_n(&fdt_used[b / 64], __ATOMIC_RELAXED) >> (b % 64)) & 1;
}

/* FDT_EACH runs fd over the table's entries in the blocks that may have
 * a kind (fdt_next): a fork, a handover or an exec looks at a few
 * blocks, where it read the whole table (3 MiB of it at 65,536 fds). */
static inline int fdt_next(int fd)
{
	while (fd < nfdt && !block_used((unsigned)fd))
		fd = (fd / FDT_BLOCK + 1) * FDT_BLOCK;
	return fd;
}
#define FDT_EACH(fd) for (int fd = fdt_next(0); fd < nfdt; fd = fdt_next(fd + 1))

/* set_kind gives entry e its kind k, and notes its block (fdt_used). */
static inline void set_kind(struct fdent *e, uint8_t k)
{
	size_t b = (size_t)(e - fdt) / FDT_BLOCK;
	if (!block_used((unsigned)(e - fdt)))
		__atomic_or_fetch(&fdt_used[b / 64], 1ull << (b % 64), __ATOMIC_RELAXED);
	__atomic_store_n(&e->kind, k, __ATOMIC_RELAXED);
}

static inline struct fdent *ours(int fd)
{
	if ((unsigned)fd < NFAST && !((__atomic_load_n(&maybe_ours[fd >> 6], __ATOMIC_RELAXED) >> (fd & 63)) & 1))
		return NULL;
	struct fdent *e = ent(fd);
	return e && e->kind == K_OURS ? e : NULL;
}

/* thread_ends registers the thread for thread_exit (once). */
static inline void thread_ends(void)
{
	if (!t_keyed) {
		t_keyed = 1;
		pthread_setspecific(thread_key, (void *)1);
	}
}

/* count_waiter counts the thread among waiter_threads (once). */
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

/* ours_or_listener is ours(), after handing a listening socket the
 * core has not seen to it (accel_listener). */
static inline struct fdent *ours_or_listener(int fd)
{
	struct fdent *e = ent(fd);
	if (e && e->kind == K_TCP && e->listening && !e->tried)
		accel_listener(fd, e);
	return e && e->kind == K_OURS ? e : NULL;
}

/* core_signal_only reports whether a call that failed with err (an
 * errno) and began when t_handled read handled ended only for a signal
 * of the core's (struct kwait): it goes on, as on the kernel. */
static inline int core_signal_only(int err, unsigned handled)
{
	return err == EINTR && core_state == 1 && t_handled == handled;
}

/* kwait_begin starts a wait on the kernel's fds alone (struct kwait). */
static inline void kwait_begin(struct kwait *k, int64_t timeout_ns)
{
	k->handled = t_handled;
	k->end = timeout_ns < 0 ? -1 : timeout_ns > 0 && core_state == 1 ? now_ns() + timeout_ns : 0;
}

#endif
