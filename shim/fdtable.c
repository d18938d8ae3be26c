/* fdtable.c: the descriptor table, and handing connections over to the
 * kernel (see shim.h). */
#include "shim.h"

/* ---- the descriptor table ------------------------------------------ */

struct fdent *fdt;
int nfdt;
int *hrefs;		/* by handle: descriptors naming it (dup), and calls holding it (ccall_hold) */
int *hfds;		/* by handle: descriptors naming it, under mu */
uint8_t *htimeo;	/* by handle: its kernel socket may have SO_RCVTIMEO or SO_SNDTIMEO */
uint32_t *hlowat;	/* by handle: its SO_RCVLOWAT if more than 1, else 0 (read_target) */
uint32_t *fdgen;	/* by fd: how many times it was dropped (closed), for a call that waited */

int refuse_after_fork(void)
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

/* set_ours makes fd name handle h; nonblock is O_NONBLOCK as the program
 * set it, knb whether the kernel socket is non-blocking already (it is
 * made so otherwise: we do the waiting), timeo whether the kernel socket
 * may carry SO_RCVTIMEO or SO_SNDTIMEO (htimeo, for a new socket). */
void set_ours(int fd, int h, int nonblock, int knb, int listening, int timeo)
{
	struct fdent *e = ent(fd);
	if (!e)
		return;
	memset(e, 0, sizeof *e);
	mark_ours(fd, 1);
	set_kind(e, K_OURS);
	e->h = h;
	e->nonblock = nonblock;
	e->listening = listening;
	if ((unsigned)h < MAX_HANDLES && __atomic_add_fetch(&hrefs[h], 1, __ATOMIC_RELAXED) == 1) {
		htimeo[h] = timeo; /* a new socket */
		hlowat[h] = 0;
	}
	if ((unsigned)h < MAX_HANDLES)
		hfds[h]++;
	if (knb)
		return;
	int fl = real_fcntl(fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		real_fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* drop forgets fd's entry; the core's socket closes with its last fd. */
void drop(int fd)
{
	struct fdent *e = ent(fd);
	if (!e || e->kind == K_NONE)
		return;
	__atomic_add_fetch(&fdgen[fd], 1, __ATOMIC_RELAXED);
	if (e->kind == K_OURS) {
		int h = e->h;
		/* The registrations go with the socket's last descriptor (not
		 * its last hold: a call in progress must not leave one behind
		 * it). A child after fork does not count: each close is the
		 * socket's last there. */
		epoll_forget(fd, h, after_fork || (unsigned)h >= MAX_HANDLES || --hfds[h] <= 0);
		e->kind = K_NONE;
		mark_ours(fd, 0);
		if (!after_fork && (unsigned)h < MAX_HANDLES &&
		    __atomic_sub_fetch(&hrefs[h], 1, __ATOMIC_RELAXED) == 0)
			CORE_VOID(core.close(h));
	} else if (e->kind == K_EPOLL) {
		ep_free(e->ep);
		if (e->wake_fd1)
			real_close(e->wake_fd1 - 1); /* its wake-up (epoll.c) */
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

/* kernel_now_locked makes every fd naming handle h the kernel's: the
 * program's O_NONBLOCK back, its epoll registrations moved to the
 * kernel's sets. Under mu. */
static void kernel_now_locked(int h)
{
	int nb = -1;
	FDT_EACH(fd) {
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
		if ((unsigned)h < MAX_HANDLES)
			hfds[h]--;
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
void kernel_now(struct fdent *e)
{
	table_lock();
	if (e->kind == K_OURS)
		kernel_now_locked(e->h);
	table_unlock();
}

/* kernel_took: the core no longer has connection fd's socket; if a
 * handover took it, fd is the kernel's from then on (1). The handover
 * takes the core's socket first, then connects the kernel socket in
 * repair mode (the kernel answers TCP_REPAIR_WINDOW only then), then
 * ends repair mode: wait for that, up to 10 s. */
int kernel_took(int fd)
{
	struct fdent *ke = ent(fd);
	int h = ke && ke->kind == K_OURS ? ke->h : 0, done = 0;
	for (int i = 0; i < 200000 && !done; i++) {
		struct sockaddr_storage sa;
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
	table_lock();
	struct fdent *e = ent(fd);
	if (e && e->kind == K_OURS) {
		debugf("fd %d: the kernel has taken the connection over", fd);
		kernel_now_locked(e->h);
	}
	table_unlock();
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
 * and fd is the kernel's (0). For a listener, the listener's port goes
 * to its kernel socket, which the child shares with its parent (onloadd's
 * retireForChild), and fd is that socket. -1 if that cannot be done: the
 * call is refused (refuse_after_fork). */
int child_takes(int fd, struct fdent *e)
{
	/* The kernel may have it already: the parent handed it over as it
	 * exited (handover_at_exit), or onloadd did. */
	if (!e->listening && kernel_took(fd))
		return 0;
	if (!e->ho_ok || !ho_path[0]) {
		debugf("fd %d: a child cannot hand it over: its parent found nowhere to ask (ONLOAD_LOG=debug in the parent says why)", fd);
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
	if (!ok && kernel_took(fd)) {
		/* The parent handed it over meanwhile (handover_for_close: it
		 * closed its copy as the child began, as sshd and inetd do). */
		debugf("fd %d: the kernel took the connection over as the child asked", fd);
		return 0;
	}
	if (!ok) {
		logf_("fd %d: a child forked after the stack loaded could not have its inherited %s to the kernel: %s", fd,
		      e->listening ? "listener's port given" : "connection handed over", rep);
		return -1;
	}
	debugf("fd %d: %s, for a child forked after the stack loaded", fd,
	       e->listening ? "a listener whose port went to its kernel socket" : "handed over to the kernel");
	kernel_now(e);
	return 0;
}

/* prepare_fork runs in the parent before a fork: a child forked after
 * the core loaded hands an inherited connection (or listener) over at
 * its first use (child_takes), and needs its names at onloadd, which
 * only the core knows. It holds the table's lock across the fork
 * (parent_after_fork and child_after_fork let it go): a child forked
 * while another thread held it started with it held for ever, and hung
 * at its first socket call. */
int forked_after_core; /* prepare_fork ran with the core loaded */
static __thread int t_fork_locked; /* prepare_fork holds the table's lock */

void prepare_fork(void)
{
	if (in_core || !fdt)
		return;
	table_lock();
	t_fork_locked = 1;
	if (core_state != 1)
		return;
	forked_after_core = 1;
	if (!after_fork)
		ho_parent = getpid();
	FDT_EACH(fd) {
		struct fdent *e = &fdt[fd];
		if (e->kind != K_OURS || e->ho_ok)
			continue;
		char path[sizeof ho_path];
		if (CORE(core.handover_info(e->h, &e->ho_stack, &e->ho_sock, path, sizeof path)) == 0) {
			e->ho_ok = 1;
			memcpy(ho_path, path, sizeof ho_path);
		}
	}
}

void parent_after_fork(void)
{
	if (t_fork_locked) {
		t_fork_locked = 0;
		table_unlock();
	}
}

/* fork_unlock_child lets the table's lock go in a child: its one thread
 * is the one that took it, and what the parent's signal handlers held
 * back is not the child's (the kernel gives it no pending signals). */
void fork_unlock_child(void)
{
	sig_held = 0;
	parent_after_fork();
}

