/* process.c: the shim's start (init), inherited sockets, fork and exec
 * (see shim.h). */
#include "shim.h"

/* ---- the start ------------------------------------------------------- */

static void child_after_fork(void);

/* tcp_socket reports whether fd is a TCP socket of IPv4 or IPv6 (v6)
 * that listens, or is neither connected nor listening: one the shim may
 * take as a socket() of its own (adopt_socket); 0 for anything else. */
static int tcp_socket(int fd, int *listening, int *v6)
{
	int v;
	socklen_t l = sizeof v;
	if (real_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) < 0 || (v != AF_INET && v != AF_INET6))
		return 0;
	*v6 = v == AF_INET6;
	l = sizeof v;
	if (real_getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) < 0 || v != SOCK_STREAM)
		return 0;
	l = sizeof v;
	if (real_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) < 0 || v != IPPROTO_TCP)
		return 0;
	l = sizeof v;
	*listening = real_getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) == 0 && v;
	if (!*listening) {
		struct sockaddr_storage sa;
		l = sizeof sa;
		if (real_getpeername(fd, (struct sockaddr *)&sa, &l) == 0 || errno != ENOTCONN)
			return 0;
	}
	return 1;
}

/* adopt_socket makes entry e (fd's) a K_TCP socket the program did not
 * make here: a listener is accelerated at its first accept, poll or
 * epoll_ctl (accel_listener, which shares the kernel's socket with the
 * process it came from), an unconnected socket at its connect. */
static void adopt_socket(struct fdent *e, int listening, int v6)
{
	memset(e, 0, sizeof *e);
	set_kind(e, K_TCP);
	e->listening = listening;
	e->timeo = 1; /* its options are unknown */
	e->v6 = v6;
}

/* adopt_inherited takes the TCP/IPv4 sockets the program inherited (from
 * the program it was exec'd from: nginx's binary upgrade passes its
 * listening sockets so; systemd's socket activation) as a socket() of its
 * own (adopt_socket). A connected one stays the kernel's: the previous
 * program handed its accelerated connections over to the kernel before
 * the exec (handover_for_exec). */
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
		int listening, v6;
		if (!e || !tcp_socket((int)fd, &listening, &v6))
			continue;
		adopt_socket(e, listening, v6);
		debugf("fd %ld: inherited %s", fd, listening ? "listening" : "unconnected");
	}
	closedir(d);
}

/* each_passed_fd calls fn for every fd message m passes (SCM_RIGHTS), in
 * order; m and its control buffer are readable. */
void each_passed_fd(const struct msghdr *m, void (*fn)(int fd))
{
	for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR((struct msghdr *)m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
			continue;
		int n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (int i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
			fn(fd);
		}
	}
}

/* adopt_received_fd takes fd, received, as inherited if it is a TCP
 * listener (adopt_received). */
static void adopt_received_fd(int fd)
{
	int listening, v6;
	struct fdent *e = ent(fd);
	if (!e || !tcp_socket(fd, &listening, &v6) || !listening)
		return;
	table_lock();
	if (e->kind == K_NONE) {
		adopt_socket(e, 1, v6);
		debugf("fd %d: a listener received from another process (SCM_RIGHTS)", fd);
	}
	table_unlock();
}

/* adopt_received takes the TCP listeners message m brought (SCM_RIGHTS,
 * on a Unix socket: haproxy's seamless reload, a process handing its
 * listeners to its successor) as inherited ones: the first accept, poll
 * or epoll_ctl accelerates each, its port coming to this process's stack
 * from the sender's, which gave it up as it sent it (pass_listener). A
 * connection stays the kernel's: the sender handed it over first
 * (pass_rights). */
void adopt_received(const struct msghdr *m)
{
	if (fdt && m->msg_control && m->msg_controllen)
		each_passed_fd(m, adopt_received_fd);
}

__attribute__((constructor)) static void init(void)
{
	resolve_libc();
	as_from_env();
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
	secure_mode = getauxval(AT_SECURE) != 0;
	const char *lf = getenv("ONLOAD_LOG_FILE");
	if (lf && *lf && secure_mode)
		/* A less privileged user's environment names no file for a
		 * set-user-ID program to write (trusted_core). */
		logf_("ONLOAD_LOG_FILE=%s is ignored in the dynamic loader's secure mode (a set-user-ID program, or one "
		      "exec'd with its users apart): the log goes to standard error", lf);
	else if (lf && *lf)
		log_file = strdup(lf);
	const char *dis = getenv("ONLOAD_DISABLE");
	if (dis && strcmp(dis, "1") == 0)
		return; /* an empty table: everything goes to libc */
	struct rlimit rl;
	nfdt = 65536;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY && rl.rlim_max > (rlim_t)nfdt)
		nfdt = rl.rlim_max > (1 << 20) ? (1 << 20) : (int)rl.rlim_max;
	fdt = calloc(nfdt, sizeof *fdt);
	hrefs = calloc(MAX_HANDLES, sizeof *hrefs);
	hfds = calloc(MAX_HANDLES, sizeof *hfds);
	htimeo = calloc(MAX_HANDLES, sizeof *htimeo);
	hlowat = calloc(MAX_HANDLES, sizeof *hlowat);
	fdgen = calloc(nfdt, sizeof *fdgen);
	if (!fdt || !hrefs || !hfds || !htimeo || !hlowat || !fdgen) {
		free(fdt);
		free(hrefs);
		free(hfds);
		free(htimeo);
		free(hlowat);
		free(fdgen);
		hrefs = NULL;
		hfds = NULL;
		htimeo = NULL;
		hlowat = NULL;
		fdgen = NULL;
		fdt = NULL;
		nfdt = 0;
		return;
	}
	pthread_key_create(&thread_key, thread_exit);
	pthread_atfork(prepare_fork, parent_after_fork, child_after_fork);
	adopt_inherited();
	log_keep_open();
}

static void child_after_fork(void)
{
	fork_unlock_child();
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
	FDT_EACH(fd) {
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

/* handover_for_close: a connection the program closes that a child
 * forked after the core loaded may still hold (it was open at the fork,
 * prepare_fork's ho_ok, and a child lives) goes to the kernel rather
 * than ending in the stack: the kernel keeps it while the child holds its
 * fd, and closes it after its data when nobody does, as it does any
 * socket two processes share. inetd, and servers like it, hand a
 * connection to a program they fork and exec and close their own copy at
 * once: closed in the stack, the connection was gone before the child
 * could use it (calls.c, TestShimCalls). Called before the kernel's fd
 * goes (close, dup2 and dup3 over it). */
void handover_for_close(int fd, struct fdent *e)
{
	if (!forked_after_core || after_fork || in_core || core_state != 1 || e->kind != K_OURS || e->listening ||
	    !e->ho_ok || (unsigned)e->h >= MAX_HANDLES || __atomic_load_n(&hrefs[e->h], __ATOMIC_RELAXED) != 1)
		return; /* not shared with a child, or another fd here names it still */
	siginfo_t si;
	if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
		return; /* no child */
	/* A server of a process a connection does this at each: after a
	 * few, its listener's port goes to the kernel (onl_child_served). */
	if (CORE(core.child_served(e->h)) == 1)
		debugf("fd %d: a connection served by a forked child, unused here, as were those before it from its "
		       "listener: the listener's port goes to the kernel, whose connections the children use as they "
		       "are (ONLOAD_CHILD_SERVED)", fd);
	int r = hand_over(fd, e, "at close, for a child that may hold it");
	if (r != 0)
		debugf("fd %d: its connection could not be handed over to the kernel at close (%s): it ends in the stack",
		       fd, strerror(-r));
}

/* to_kernel hands connection fd over to the kernel where the program
 * asks of it what only the kernel's socket does (why: signal-driven I/O,
 * passing it to another process). 0: the fd is the kernel's now (or was
 * not ours); -1: it stays ours (a listener, or the handover failed:
 * logged). */
int to_kernel(int fd, struct fdent *e, const char *why)
{
	if (!e || e->kind != K_OURS)
		return 0;
	if (e->listening) {
		logf_("fd %d: a listener cannot go to the kernel %s: it stays accelerated", fd, why);
		return -1;
	}
	if (after_fork)
		return child_takes(fd, e);
	int r = hand_over(fd, e, why);
	if (r != 0) {
		logf_("fd %d: its connection could not be handed over to the kernel %s (%s)", fd, why, strerror(-r));
		return -1;
	}
	return 0;
}

/* listener_to_kernel gives listener fd's port (entry e) to its kernel
 * socket, which every process holding it shares (onl_retire_listener; in
 * a child forked after the core loaded, asked of onloadd or the parent:
 * child_takes): 0, or a negated errno, the port still the stack's. */
int listener_to_kernel(int fd, struct fdent *e)
{
	if (after_fork)
		return child_takes(fd, e) == 0 ? 0 : -ENOTSUP;
	return CORE(core.retire_listener(e->h));
}

/* left_stack: the process left the stack (leave_stack), for left_why:
 * its listeners' ports went to their kernel sockets, its connections
 * went (or go, each as its thread asks), and its new sockets stay the
 * kernel's (accel_listener, connect; accept hands over what the stack
 * had queued). */
int left_stack;
const char *left_why;

/* leave_stack sends the process's sockets to the kernel, once, for why
 * (as to_kernel takes it: "for ..."): its listeners' ports go to their
 * kernel sockets, its connections are handed over if conns (else each
 * goes as its user asks: wait.c's lone_to_kernel), and its new sockets
 * stay the kernel's. what says what happened and hint what the user can
 * do, for the log, at debug level unless loud. 1 if it did so now, 0 if
 * the process had left before (or has no stack). A connection a thread is
 * blocked on goes too: the handover wakes the thread, whose call goes on
 * in the kernel (ccall_check). */
int leave_stack(const char *why, const char *what, const char *hint, int loud, int conns)
{
	if (core_state != 1 || !fdt || __atomic_exchange_n(&left_stack, 1, __ATOMIC_ACQ_REL))
		return 0;
	__atomic_store_n(&left_why, why, __ATOMIC_RELEASE);
	int handed = 0, listeners = 0, kept = 0, later = 0;
	FDT_EACH(fd) {
		struct fdent *e = &fdt[fd];
		if (__atomic_load_n(&e->kind, __ATOMIC_RELAXED) != K_OURS)
			continue;
		if (!e->listening) {
			if (!conns)
				later++;
			else if (to_kernel(fd, e, why) == 0)
				handed++;
			else
				kept++;
			continue;
		}
		int r = listener_to_kernel(fd, e);
		if (r == 0) {
			listeners++;
		} else {
			kept++;
			logf_("fd %d: a listener whose port could not go to its kernel socket %s (%s): it stays accelerated",
			      fd, why, strerror(-r));
		}
	}
	if (!loud && !log_debug)
		return 1;
	if (conns)
		logf_("%s: the process's sockets go to the kernel (connections handed over: %d; listeners whose ports went "
		      "to their kernel sockets: %d; left accelerated: %d), and so do its new ones (%s)",
		      what, handed, listeners, kept, hint);
	else
		logf_("%s: the process's sockets go to the kernel (listeners whose ports went to their kernel sockets: %d; "
		      "left accelerated: %d; connections that go as their threads next wait on them: %d), and so do its "
		      "new ones (%s)",
		      what, listeners, kept, later, hint);
	return 1;
}

static int *names_of(int h);
static void release_at_exit(const int *names);

/* handover_at_exit, on a stack of the process's own: a connection the
 * program left open with data still to deliver goes to the kernel, which
 * delivers it after the process is gone and then closes the connection
 * with the process's last fd on it, as it does its own sockets' (before,
 * the exit served the stack for a second at most: a peer that read
 * slowly got 3.6 MB of 4.2 and then a reset). The rest close in the
 * stack (onl_exit), which is quicker: a handover takes system calls, and
 * a connection with nothing outstanding ends within a round trip; but
 * where a child forked after the core loaded may hold them, every one
 * is handed over.
 *
 * A connection handed over here, with no child to hold it, is let go at
 * once (release_at_exit), as the kernel closes a process's sockets at its
 * exit. Left to the process's end, its FIN followed the data by 18-41 ms
 * (exitfin.c, TestShimExitFIN; 0.1 ms on the kernel): the end closed the
 * stack's AF_XDP socket first, and that waits for an RCU grace period
 * (xsk_release, synchronize_rcu). */
void handover_at_exit(void)
{
	if (!fdt || !CORE(core.own_stack()))
		return;
	/* A child forked after the core loaded may hold the connections
	 * still, and use them after we are gone: then every one goes to the
	 * kernel, on the fd the child has too (child_takes finds it there). */
	siginfo_t si;
	int child = forked_after_core && waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT) == 0;
	FDT_EACH(fd) {
		struct fdent *e = &fdt[fd];
		struct onl_tcpinfo ti;
		if (e->kind != K_OURS || e->listening || CORE(core.tcpinfo(e->h, &ti)) < 0 ||
		    (!child && ti.unacked == 0 && ti.notsent == 0))
			continue;
		int h = e->h, *names = child ? NULL : names_of(h);
		int r = hand_over(fd, e, child ? "at exit, for a child" : "at exit, with data to deliver");
		if (r != 0)
			debugf("fd %d: its connection could not be handed over to the kernel at exit (%s): it ends in the stack",
			       fd, strerror(-r));
		else if (names)
			release_at_exit(names);
		free(names);
	}
}

/* names_of lists the fds that name handle h, ending in -1 (NULL if
 * memory is short). */
static int *names_of(int h)
{
	table_lock();
	int n = 0;
	FDT_EACH(fd)
		n += fdt[fd].kind == K_OURS && fdt[fd].h == h;
	int *names = malloc((n + 1) * sizeof(int)), k = 0;
	if (names)
		FDT_EACH(fd)
			if (fdt[fd].kind == K_OURS && fdt[fd].h == h)
				names[k++] = fd;
	if (names)
		names[k] = -1;
	table_unlock();
	return names;
}

/* release_at_exit lets go of the fds names (a connection the kernel now
 * has): each becomes /dev/null, so that the kernel closes the connection
 * now, after its data, while the number stays taken and no file the
 * process's other threads open meanwhile gets it. */
static void release_at_exit(const int *names)
{
	static int null_fd = -2;
	if (null_fd == -2)
		null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	for (int i = 0; null_fd >= 0 && names[i] >= 0; i++)
		real_dup2(null_fd, names[i]);
}

/* preloads says whether the LD_PRELOAD list pre (separated by spaces or
 * colons) names name, without a path. */
static int preloads(const char *pre, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = pre; *p;) {
		size_t l = strcspn(p, " :");
		if (l == n && !strncmp(p, name, n))
			return 1;
		p += l;
		p += strspn(p, " :");
	}
	return 0;
}

/* setuid_installed says whether the shim at path (its name base) is one
 * the loader's secure mode preloads by name: set-user-ID, root's, in one
 * of its system directories. */
static int setuid_installed(const char *path, const char *base)
{
	struct stat st;
	return trusted_dir(path, (size_t)(base - 1 - path)) && stat(path, &st) == 0 && (st.st_mode & S_ISUID) &&
	       st.st_uid == 0;
}

/* An exec in the dynamic loader's secure mode (the new program's real
 * and effective user or group differ: squid's master, root in effect and
 * its user in name, execs its worker so; or a set-user-ID file) ignores
 * an LD_PRELOAD entry with a path, as `onloadd run` writes ours unless
 * the shim is installed set-user-ID (make install-shim), and one without
 * a path unless the library it names is set-user-ID in a system
 * directory (ld.so(8)): the new program then runs without the shim, its
 * sockets the kernel's. say_secure_exec
 * says so, as the run command says it of a set-user-ID program: an error
 * where the configuration asks for acceleration in so many words
 * (ONLOAD_DAEMON=require, ONLOAD_INTERFACE), else at debug. path is the
 * file (NULL, or without a slash: a search of PATH, whose file we do not
 * look at), or fd for fexecve (-1: none). */
static void say_secure_exec(const char *path, int fd, char *const envp[])
{
	uid_t ru, eu, su;
	gid_t rg, eg, sg;
	if (getresuid(&ru, &eu, &su) || getresgid(&rg, &eg, &sg))
		return;
	struct stat st;
	int file = fd >= 0 ? fstat(fd, &st) == 0 : path && strchr(path, '/') && stat(path, &st) == 0;
	if (file && (st.st_mode & S_ISUID))
		eu = st.st_uid;
	if (file && (st.st_mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP))
		eg = st.st_gid;
	if (eu == ru && eg == rg)
		return;
	Dl_info di;
	const char *pre = NULL;
	for (int i = 0; envp && envp[i]; i++)
		if (!strncmp(envp[i], "LD_PRELOAD=", 11))
			pre = envp[i] + 11;
	if (!pre || !dladdr((void *)say_secure_exec, &di) || !di.dli_fname || !strchr(di.dli_fname, '/'))
		return;
	const char *base = strrchr(di.dli_fname, '/') + 1;
	int by_name = preloads(pre, base);
	if (!by_name && !strstr(pre, di.dli_fname))
		return; /* the shim is not preloaded there */
	if (by_name && setuid_installed(di.dli_fname, base))
		return; /* the loader takes it in secure mode too */
	const char *d = getenv("ONLOAD_DAEMON"), *itf = getenv("ONLOAD_INTERFACE");
	int asked = (d && !strcmp(d, "require")) || (itf && *itf);
	if (!asked && !log_debug)
		return;
	char name[32];
	if (!path)
		snprintf(name, sizeof name, "fd %d", fd);
	logf_("exec %s: the new program runs in the dynamic loader's secure mode (real uid %u, effective %u; real gid %u, "
	      "effective %u), which ignores LD_PRELOAD=%s: it runs without the shim, its sockets the kernel's (make "
	      "install-shim installs the shim set-user-ID where that mode takes it from, and onloadd run then preloads it)",
	      path ? path : name, (unsigned)ru, (unsigned)eu, (unsigned)rg, (unsigned)eg, by_name ? base : di.dli_fname);
}

/* before_exec readies the process for an exec (see the section's
 * comment, limits.c's as_for_exec and say_secure_exec): path or fd as
 * say_secure_exec takes them. as_exec_failed undoes it if the exec
 * fails. before_spawn does the same for a child the C library makes
 * and execs past the shim's execve (posix_spawn, system, popen), but
 * for RLIMIT_AS, which the child gets from the environment (limits.c:
 * as_spawn_env for posix_spawn, as_environ_enter for system and popen). */
static void before_spawn(const char *path, char *const envp[])
{
	handover_for_exec();
	say_secure_exec(path, -1, envp);
}

static void before_exec(const char *path, int fd, char *const envp[])
{
	handover_for_exec(); /* under the raised limit: it runs the core */
	as_for_exec();
	say_secure_exec(path, fd, envp);
}

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	before_exec(path, -1, envp);
	int r = real_execve(path, argv, envp);
	as_exec_failed();
	return r;
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	before_exec(file, -1, envp);
	int r = real_execvpe(file, argv, envp);
	as_exec_failed();
	return r;
}

EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	before_exec(NULL, fd, envp);
	int r = real_fexecve(fd, argv, envp);
	as_exec_failed();
	return r;
}

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

/* spawned finishes a posix_spawn that returned r, its child's process
 * id child: frees the environment as_spawn_env made, gives the child the
 * program's RLIMIT_AS (as_for_spawned) and the caller its id. */
static int spawned(int r, pid_t child, pid_t *pid, char **env)
{
	free(env);
	if (r == 0) {
		as_for_spawned(child);
		if (pid)
			*pid = child;
	}
	return r;
}

/* posix_spawn's child, and system's and popen's (posix_spawn inside
 * libc), execs past the shim's execve: the connections it inherits go to
 * the kernel first, here in the parent, as those an exec passes on do
 * (the parent's fds go on working, the kernel's now). Before, the child
 * found an unconnected socket (calls.c, TestShimCalls). posix_spawn's
 * child gets the program's own RLIMIT_AS (as_spawn_env, as_for_spawned). */
EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	pid_t child;
	before_spawn(path, envp);
	char **env = as_spawn_env(envp);
	return spawned(real_posix_spawn(&child, path, fa, attr, argv, env ? env : envp), child, pid, env);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *attr, char *const argv[], char *const envp[])
{
	pid_t child;
	before_spawn(file, envp);
	char **env = as_spawn_env(envp);
	return spawned(real_posix_spawnp(&child, file, fa, attr, argv, env ? env : envp), child, pid, env);
}

/* system's and popen's shell gets the program's RLIMIT_AS through the
 * process's environment (as_environ_enter). */
EXPORT int system(const char *cmd)
{
	before_spawn("/bin/sh", environ);
	as_environ_enter();
	int r = real_system(cmd);
	as_environ_leave();
	return r;
}

EXPORT FILE *popen(const char *cmd, const char *mode)
{
	before_spawn("/bin/sh", environ);
	as_environ_enter();
	FILE *f = real_popen(cmd, mode);
	as_environ_leave();
	return f;
}

/* A spawn's dup2 action passes a connection on whether or not it is
 * close-on-exec: it goes to the kernel as the program asks for it. */
EXPORT int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa, int fd, int newfd)
{
	struct fdent *e = ours(fd);
	if (e && !e->listening)
		to_kernel(fd, e, "for a program posix_spawn runs on it");
	return real_posix_spawn_file_actions_adddup2(fa, fd, newfd);
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
	int stream = (type & 0xf) == SOCK_STREAM && (protocol == 0 || protocol == IPPROTO_TCP);
	if (e && (domain == AF_INET || domain == AF_INET6) && stream) {
		/* An IPv6 socket is accelerated where it reaches IPv4 (a
		 * listener on :: that is not IPV6_V6ONLY, a connect to
		 * ::ffff:a.b.c.d): v4_of decides at listen and connect. */
		memset(e, 0, sizeof *e);
		set_kind(e, K_TCP);
		e->fresh = 1;
		e->v6 = domain == AF_INET6;
	} else if (fd >= 0 && (domain == AF_INET || domain == AF_INET6) && !after_fork) {
		/* Where something is not accelerated, the debug log says so. */
		debugf("fd %d: %s%s socket: the kernel's (the stack does TCP only)", fd,
		       domain == AF_INET6 ? "an IPv6 " : "an IPv4 ",
		       (type & 0xf) == SOCK_DGRAM ? "UDP" : "non-TCP");
	}
	return fd;
}

