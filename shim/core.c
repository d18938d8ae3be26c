/* core.c: libc's functions, the Go core's loading, the calls into it,
 * and the process's end (see shim.h). */
#include "shim.h"

/* ---- libc's functions ---------------------------------------------- */

/* resolve_libc finds them all (init calls it at load). A call that
 * comes before, from another library's constructor that the loader runs
 * before ours (sshd's libcap-ng reads a /proc file from its own), finds
 * real_NAME pointing at early_NAME, which resolves them and goes on to
 * libc's NAME with the caller's arguments as they were. Before, such a
 * call jumped to address 0 (TestShimEarlyCalls). */
void resolve_libc(void)
{
#define LOAD(ret, name, ...) *(void **)&real_##name = dlsym(RTLD_NEXT, #name);
	LIBC(LOAD)
#undef LOAD
}

#if defined(__x86_64__)
/* early_NAME keeps the argument registers (and %al, a variadic call's
 * vector count) across resolve_libc, then jumps to libc's NAME. */
#define EARLY(ret, name, ...)                                                            \
	__asm__(".text\n.p2align 4\n.type early_" #name ",@function\nearly_" #name ":\n" \
		"endbr64\npush %rbp\nmov %rsp,%rbp\npush %rdi\npush %rsi\npush %rdx\n"     \
		"push %rcx\npush %r8\npush %r9\npush %rax\nsub $8,%rsp\n"                    \
		"call resolve_libc\n"                                                           \
		"add $8,%rsp\npop %rax\npop %r9\npop %r8\npop %rcx\npop %rdx\npop %rsi\n"   \
		"pop %rdi\npop %rbp\njmp *real_" #name "(%rip)\n"                             \
		".size early_" #name ", .-early_" #name "\n");                                  \
	void early_##name(void);
LIBC(EARLY)
#define REAL_DEF(ret, name, ...) ret (*real_##name)(__VA_ARGS__) = (ret(*)(__VA_ARGS__))early_##name;
#else
/* Elsewhere a call before init finds NULL. */
#define REAL_DEF(ret, name, ...) ret (*real_##name)(__VA_ARGS__);
#endif
LIBC(REAL_DEF)

uint64_t maybe_ours[NFAST / 64]; /* see shim.h */
uint64_t fdt_used[(1 << 20) / FDT_BLOCK / 64]; /* see shim.h */

/* ---- the Go core ----------------------------------------------------- */

struct core_fns core;

int core_state;		/* 0 not loaded, 1 loaded, -1 failed */
int after_fork;		/* a child forked after the core loaded */
int log_debug;		/* ONLOAD_LOG=debug */
int secure_mode;	/* AT_SECURE: the dynamic loader's secure mode (trusted_core) */
const char *log_file;	/* ONLOAD_LOG_FILE, or NULL: standard error */
long spin_ns;		/* the profile's spin time */
int blocked_limit;	/* ONLOAD_BLOCKED_THREADS (wait.c, lone_to_kernel) */
int irq_fd = -1;	/* the stack's interrupt fd (onl_irq_fd) */
int remote_fd = -1;	/* the stack's wake socket (onl_remote_fd) */
pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER; /* the table */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER; /* loading the core */
__thread volatile int in_core; /* this thread is in the Go core */
__thread volatile int t_locks; /* the shim's locks it holds (locks_taking) */
__thread int in_handler; /* the program's signal handlers running on this thread */
__thread int kick_owed; /* this thread's sends left frames for a kick */

/* Signals that come while their thread is in the core wait for it to
 * leave (see on_signal): the handlers for them, by signal, and what each
 * thread holds back. in_core and sig_held are volatile: the handler
 * writes them between any two of the thread's instructions, so leaving
 * the core (clear in_core, then look at sig_held) must keep that order. */
struct sigaction prog_act[NSIG];
__thread volatile uint64_t sig_held; /* bit sig-1: held */
__thread siginfo_t sig_info[NSIG]; /* what came with each */

__thread int t_alt;
__thread void *t_alt_mem;
int loading;		/* the core is being loaded (its runtime starts) */
void *core_base;	/* where the core is mapped */
uintptr_t core_end;	/* and where its mapping ends (core_span) */

/* core_span finds the end of the core's loaded segments, from its
 * program headers: runtime_handler tells the runtime's handlers by
 * address, where dladdr searched the symbols of the object an address
 * is in (the core's tens of thousands, or the program's) at each
 * sigaction, which a backend of PostgreSQL calls dozens of times as it
 * starts (12% of its CPU). */
static int core_span(struct dl_phdr_info *info, size_t size, void *unused)
{
	(void)size;
	(void)unused;
	if ((void *)info->dlpi_addr != core_base)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t end = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
		if (ph->p_type == PT_LOAD && end > core_end)
			core_end = end;
	}
	return 1;
}

/* ---- the log ----------------------------------------------------------
 *
 * Lines go to standard error, or to the file ONLOAD_LOG_FILE names
 * (log_file), appended to (O_APPEND: whole lines, in order, from each of
 * the program's processes), the interposer's and the core's alike (the
 * core writes through log_write, onl_thread). The file is opened as the
 * process starts (log_keep_open), above the base and marked the shim's
 * own (K_CORE), so that a daemon closing every fd goes round it and a
 * process that has taken another user since (varnish's manager, nginx's
 * workers, squid's) still writes where root opened; a process that has
 * lost it (a child that closed it) opens the file for each line. A line
 * that neither takes goes to standard error, the first with why. */

static int base_fd(void);

static int log_keep = -1; /* the file, opened as the process started */
static dev_t log_dev;
static ino_t log_ino;

static int open_log(void) { return open(log_file, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644); }

void log_keep_open(void)
{
	if (!log_file)
		return;
	int fd = open_log();
	if (fd < 0)
		return; /* log_write says why, at the first line */
	int b = base_fd(), hi = b > 0 ? real_fcntl(fd, F_DUPFD_CLOEXEC, b) : -1;
	if (hi >= 0) {
		real_close(fd);
		fd = hi;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		real_close(fd);
		return;
	}
	log_dev = st.st_dev;
	log_ino = st.st_ino;
	log_keep = fd;
	if (fdt && fd < nfdt)
		set_kind(&fdt[fd], K_CORE);
}

void log_write(const char *buf, int n)
{
	if (log_file) {
		struct stat st;
		if (log_keep >= 0 && fstat(log_keep, &st) == 0 && st.st_dev == log_dev && st.st_ino == log_ino &&
		    real_write(log_keep, buf, n) == n)
			return;
		int fd = open_log();
		if (fd >= 0) {
			ssize_t w = real_write(fd, buf, n);
			int e = errno;
			real_close(fd);
			if (w == n)
				return;
			errno = w < 0 ? e : EIO;
		}
		static int told;
		if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED)) {
			char why[320];
			int m = snprintf(why, sizeof why, "onload[%d]: ONLOAD_LOG_FILE=%s: %s; the log goes to standard error\n",
					 getpid(), log_file, strerror(errno));
			real_write(2, why, m < (int)sizeof why ? m : (int)sizeof why - 1);
		}
	}
	real_write(2, buf, n);
}

void logf_(const char *fmt, ...)
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
	log_write(buf, n);
}

/* ---- the core's own fds ----------------------------------------------- */

/* The core's own fds (its BPF objects, the UMEM, the AF_XDP socket, its
 * eventfds, timers and epoll sets: some thirty, made with the stack) and
 * the interposer's (a thread's eventfd and epoll set) stay out of the
 * program's way, at fd_base and above. A program's fds come from the
 * lowest numbers free, as the kernel gives them, and some programs size
 * their tables by the fds they expect to open: wrk's event loop holds
 * 10 + 3 x its connections, and refused its first connection, on fd 34.
 * The base is 1024, past select's reach, where the limit allows room
 * there; else the last FD_ROOM below the limit; 0 (none) where the
 * limit leaves too few. */
#define FD_ROOM 128
static int fd_base = -1;

static int base_fd(void)
{
	if (fd_base < 0) {
		struct rlimit rl;
		int b = 0;
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
			if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= 1024 + FD_ROOM)
				b = 1024;
			else if (rl.rlim_cur >= 2 * FD_ROOM)
				b = (int)rl.rlim_cur - FD_ROOM;
		}
		fd_base = b;
	}
	return fd_base;
}

int fd_high(int fd)
{
	int b = base_fd();
	if (fd < 0 || fd >= b)
		return fd;
	int h = real_fcntl(fd, F_DUPFD_CLOEXEC, b);
	if (h < 0)
		return fd; /* no room up there: it stays where it is */
	real_close(fd);
	return h;
}

/* hold_low fills every free fd below the base with a placeholder while
 * the core loads and makes the stack, so that the fds it opens, in Go
 * where no call of theirs comes here, land at the base or above;
 * release_low frees the numbers again. A thread of the program that
 * opens an fd meanwhile gets one up there too. */
struct low_hold {
	int *fd;
	int n;
};

static void hold_low(struct low_hold *h)
{
	*h = (struct low_hold){0};
	int b = base_fd();
	int anchor = b > 0 ? eventfd(0, EFD_CLOEXEC) : -1;
	if (anchor < 0)
		return;
	if (anchor >= b || !(h->fd = malloc(b * sizeof(int)))) {
		real_close(anchor);
		return;
	}
	h->fd[h->n++] = anchor;
	while (h->n < b) {
		int fd = real_fcntl(anchor, F_DUPFD_CLOEXEC, 0);
		if (fd < 0)
			break;
		if (fd >= b) {
			real_close(fd);
			break;
		}
		h->fd[h->n++] = fd;
	}
}

static void release_low(struct low_hold *h)
{
	for (int i = 0; i < h->n; i++)
		real_close(h->fd[i]);
	free(h->fd);
}

/* ---- the core's own descriptors ---------------------------------------
 *
 * The stack's fds (its AF_XDP socket, the UMEM, the BPF objects, the Go
 * runtime's epoll and eventfd, its wake sockets) are the process's too,
 * and a program that closes every fd it does not know of (close_range
 * or closefrom over the whole table, a loop of close, as a daemon does)
 * took them from under the stack: the Go runtime ended the process
 * ("netpollBreak write failed"). They are marked K_CORE: those that
 * came as the core loaded (the fds open after it and not before, of the
 * kinds the core makes), and those the stack opens later (fdbase's note,
 * core_fd_note). close refuses them as the kernel refuses an fd that is
 * not open (EBADF), close_range and closefrom go round them, and dup2
 * onto one is refused with a message. In a child forked after the core
 * loaded they are the child's to close. A thread of the program that
 * makes an eventfd or a socket with a call not interposed here, in the
 * few milliseconds the core takes to load, may have it taken for the
 * stack's: its close then fails as well (the number stays open). */

/* open_fds returns a bit for each fd below nfdt that is open, or NULL. */
static uint8_t *open_fds(void)
{
	uint8_t *bits = calloc(((size_t)nfdt + 7) / 8, 1);
	DIR *d = bits ? opendir("/proc/self/fd") : NULL;
	if (!d) {
		free(bits);
		return NULL;
	}
	int self = dirfd(d);
	struct dirent *de;
	while ((de = readdir(d))) {
		char *end;
		long fd = strtol(de->d_name, &end, 10);
		if (end != de->d_name && !*end && fd >= 0 && fd < nfdt && fd != self)
			bits[fd / 8] |= 1 << (fd % 8);
	}
	closedir(d);
	return bits;
}

/* core_made says whether fd is of a kind the core opens. */
static int core_made(int fd)
{
	char path[64], link[64];
	snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n <= 0)
		return 0;
	link[n] = 0;
	return !strncmp(link, "anon_inode:", 11) || !strncmp(link, "socket:", 7) ||
	       !strncmp(link, "/memfd:onload-", 14);
}

/* mark_core_fds marks K_CORE the fds open now and not in before
 * (open_fds), that the table does not know and the core may have made. */
static void mark_core_fds(const uint8_t *before)
{
	uint8_t *after = before ? open_fds() : NULL;
	if (!after)
		return;
	/* Without the table's lock, which the caller may hold (a listener's
	 * first accept loads the core): the entries are of numbers the
	 * kernel gave as the core loaded. */
	int n = 0;
	for (int fd = 0; fd < nfdt; fd++) {
		uint8_t bit = 1 << (fd % 8);
		if ((after[fd / 8] & bit) && !(before[fd / 8] & bit) &&
		    __atomic_load_n(&fdt[fd].kind, __ATOMIC_RELAXED) == K_NONE && core_made(fd)) {
			/* Close-on-exec, as the rest of the stack's: the netlink
			 * sockets of its route and link watch and a BPF ring
			 * buffer's map were not, and every program the process
			 * exec'd inherited them. */
			int fl = real_fcntl(fd, F_GETFD);
			if (fl >= 0 && !(fl & FD_CLOEXEC))
				real_fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
			set_kind(&fdt[fd], K_CORE);
			n++;
		}
	}
	free(after);
	debugf("the stack's own fds: %d as the core loaded", n);
}

/* core_fd_note hears from the core (onl_init) of an fd the stack opened
 * (open) or closed. Without the table's lock: the thread may hold it
 * (a close that closes the core's socket), and the entry of a number the
 * kernel just gave the core, or took back from it, is nobody else's. */
static void core_fd_note(int fd, int open)
{
	struct fdent *e = ent(fd);
	if (!e)
		return;
	uint8_t want = open ? K_NONE : K_CORE;
	if (__atomic_load_n(&e->kind, __ATOMIC_RELAXED) == want) {
		if (open)
			set_kind(e, K_CORE);
		else
			__atomic_store_n(&e->kind, K_NONE, __ATOMIC_RELAXED);
	}
}

/* core_fd_live says whether fd, marked K_CORE (entry e), is the stack's
 * still: open, and close-on-exec, as every fd the core opens is. A mark
 * the core did not take back as it closed the fd (core_fd_note) would
 * otherwise refuse the program's close of the number's next holder: an
 * fd open without close-on-exec is not the stack's, and its mark goes. */
int core_fd_live(int fd, struct fdent *e)
{
	int fl = real_fcntl(fd, F_GETFD);
	if (fl >= 0 && (fl & FD_CLOEXEC))
		return 1;
	uint8_t k = K_CORE;
	__atomic_compare_exchange_n(&e->kind, &k, K_NONE, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
	return 0;
}

/* core_fd_refused refuses call on fd, one of the stack's own (EBADF). */
int core_fd_refused(int fd, const char *call)
{
	debugf("fd %d is the stack's own: the program's %s of it is refused (EBADF)", fd, call);
	errno = EBADF;
	return -1;
}

/* The dynamic loader's system directories: where its secure mode takes
 * a preloaded library named without a path from, if the library is
 * set-user-ID (ld.so(8)). */
static const char *const system_dirs[] = {
#if defined(__x86_64__)
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
#elif defined(__aarch64__)
	"/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
#endif
	"/lib64", "/usr/lib64", "/lib", "/usr/lib", NULL,
};

int trusted_dir(const char *dir, size_t n)
{
	for (int i = 0; system_dirs[i]; i++)
		if (strlen(system_dirs[i]) == n && !strncmp(system_dirs[i], dir, n))
			return 1;
	return 0;
}

/* root_only: st is root's and nobody else may write it. */
static int root_only(const struct stat *st) { return st->st_uid == 0 && !(st->st_mode & (S_IWGRP | S_IWOTH)); }

/* trusted_core says whether a process in the dynamic loader's secure mode
 * (a set-user-ID program, or one exec'd with its users apart; secure_mode)
 * may load the core at path: its environment is a less privileged
 * user's, so ONLOAD_CORE is not read (load_core), and the core beside
 * this library is loaded only from a system directory, a regular file of
 * root's in a directory of root's that nobody else may write (make
 * install-shim puts it there). Said when not. */
static int trusted_core(const char *path)
{
	const char *slash = strrchr(path, '/');
	struct stat st, dt;
	char dir[PATH_MAX];
	int n = slash ? (int)(slash - path) : 0;
	if (slash && n < (int)sizeof dir) {
		memcpy(dir, path, n);
		dir[n] = 0;
	}
	if (!slash || n >= (int)sizeof dir || !trusted_dir(path, n) || stat(path, &st) < 0 || !S_ISREG(st.st_mode) ||
	    !root_only(&st) || stat(dir, &dt) < 0 || !root_only(&dt)) {
		logf_("the program runs in the dynamic loader's secure mode, and the stack's core %s is not root's in a system "
		      "library directory that only root writes: sockets use the kernel (make install-shim installs it so)",
		      path);
		return 0;
	}
	const char *env = getenv("ONLOAD_CORE");
	if (env && *env && strcmp(env, path))
		debugf("ONLOAD_CORE=%s is ignored in the dynamic loader's secure mode: the core is %s", env, path);
	return 1;
}

int load_core(void)
{
	if (core_state)
		return core_state;
	locks_taking();
	pthread_mutex_lock(&load_mu);
	if (core_state) {
		pthread_mutex_unlock(&load_mu);
		locks_gone();
		return core_state;
	}
	const char *path = secure_mode ? NULL : getenv("ONLOAD_CORE");
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
	if (secure_mode && !trusted_core(path)) {
		core_state = -1;
		pthread_mutex_unlock(&load_mu);
		locks_gone();
		return core_state;
	}
	struct low_hold low;
	hold_low(&low);
	uint8_t *before = open_fds();
	if (uring_keeps_kernel(before) || !as_room()) {
		free(before);
		release_low(&low);
		core_state = -1;
		pthread_mutex_unlock(&load_mu);
		locks_gone();
		return core_state;
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
	SYM(events); SYM(ready); SYM(arm); SYM(arm_ready); SYM(disarm_ready); SYM(disarm); SYM(irq_fd); SYM(remote_fd); SYM(take_remote); SYM(forget_efd); SYM(thread); SYM(thread_gone); SYM(resched); SYM(spin_ns); SYM(blocked_threads); SYM(try_spin);
	SYM(end_spin); SYM(close); SYM(shutdown); SYM(retire_listener); SYM(child_served);
	SYM(setopt); SYM(getopt); SYM(addrs); SYM(sockerr); SYM(unread); SYM(tcpinfo);
	SYM(handover_info); SYM(handover); SYM(handed_over); SYM(exit); SYM(own_stack); SYM(ifindex); SYM(init);
#undef SYM
	Dl_info ci;
	if (ok && dladdr((void *)core.listen, &ci)) {
		core_base = ci.dli_fbase;
		dl_iterate_phdr(core_span, NULL);
	}
	in_core = 0; /* the signals that came meanwhile run as load_mu goes */
	if (!ok) {
		logf_("cannot load the core %s (%s): sockets use the kernel; set ONLOAD_CORE to its path",
		      path, lib ? "missing symbols" : dlerror());
		core_state = -1;
	} else {
		core_state = 1;
		atexit(exit_close);
		catch_ends();
		/* The stack now, while the numbers below the base are held. */
		CORE_VOID(core.init(base_fd(), core_fd_note));
		mark_core_fds(before);
	}
	free(before);
	release_low(&low);
	pthread_mutex_unlock(&load_mu);
	locks_gone();
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
__thread int t_sigstack;
__thread sigset_t t_sigstack_mask; /* the mask to restore (core_leave) */

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
__thread int t_ending;		   /* this thread did */

void exit_close(void)
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

