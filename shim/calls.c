/* calls.c: the socket calls on accelerated descriptors (see shim.h). */
#include "shim.h"

/* The options the stack keeps (package stack's Option), by their names
 * at the socket: setsockopt gives the stack what the program sets, and
 * those copied are read from the kernel socket as the core takes a
 * socket over (copy_options; the buffers are not: the stack sizes its
 * own). */
static const struct { int level, name, opt, copied; } stack_opts[] = {
	{IPPROTO_TCP, TCP_NODELAY, ONL_OPT_NODELAY, 1},
	{IPPROTO_TCP, TCP_CORK, ONL_OPT_CORK, 1},
	{IPPROTO_TCP, TCP_DEFER_ACCEPT, ONL_OPT_DEFER_ACCEPT, 1},
	{SOL_SOCKET, SO_KEEPALIVE, ONL_OPT_KEEPALIVE, 1},
	{IPPROTO_TCP, TCP_KEEPIDLE, ONL_OPT_KEEPIDLE, 1},
	{IPPROTO_TCP, TCP_KEEPINTVL, ONL_OPT_KEEPINTVL, 1},
	{IPPROTO_TCP, TCP_KEEPCNT, ONL_OPT_KEEPCNT, 1},
	{IPPROTO_TCP, TCP_USER_TIMEOUT, ONL_OPT_USER_TIMEOUT, 1},
	{IPPROTO_IP, IP_TOS, ONL_OPT_TOS, 1},
	{IPPROTO_IP, IP_TTL, ONL_OPT_TTL, 1},
	{SOL_SOCKET, SO_RCVBUF, ONL_OPT_RCVBUF, 0},
	{SOL_SOCKET, SO_SNDBUF, ONL_OPT_SNDBUF, 0},
	{IPPROTO_TCP, TCP_QUICKACK, ONL_OPT_QUICKACK, 0}, /* a moment's state, not a setting */
	{SOL_SOCKET, SO_RCVLOWAT, ONL_OPT_RCVLOWAT, 1},
	{IPPROTO_TCP, TCP_NOTSENT_LOWAT, ONL_OPT_NOTSENT_LOWAT, 1},
};
enum { N_STACK_OPTS = sizeof stack_opts / sizeof stack_opts[0] };

/* stack_opt is the stack's option for level and name (SO_LINGER aside),
 * or 0. */
static int stack_opt(int level, int name)
{
	for (int i = 0; i < N_STACK_OPTS; i++)
		if (stack_opts[i].level == level && stack_opts[i].name == name)
			return stack_opts[i].opt;
	return 0;
}

#define CC_NAME_MAX 16

/* TCP_CONGESTION: the stack has CUBIC and NewReno (stack.Congestion*),
 * by Linux's names, of at most CC_NAME_MAX bytes (the kernel's
 * TCP_CA_NAME_MAX). cc_algo is the stack's value for the name in v (l
 * bytes, NUL-terminated or not), or -1. */
static const char *const cc_names[] = {"cubic", "reno"};
enum { N_CC = sizeof cc_names / sizeof cc_names[0] };

static int cc_algo(const char *v, socklen_t l)
{
	for (int i = 0; i < N_CC; i++) {
		size_t n = strlen(cc_names[i]);
		if (l >= n && !memcmp(v, cc_names[i], n) && (l == n || !v[n]))
			return i;
	}
	return -1;
}

/* chosen_cc is the congestion control the program chose for fd (entry
 * e) before the core saw it: the stack's value, -1 for another (or one
 * unreadable; its name in name), CC_NONE if it chose none (cc_set: the
 * kernel socket's is then the namespace's default). */
#define CC_NONE (-2)
static int chosen_cc(int fd, const struct fdent *e, char name[CC_NAME_MAX + 1])
{
	socklen_t l = CC_NAME_MAX;
	memset(name, 0, CC_NAME_MAX + 1);
	if (!e->cc_set)
		return CC_NONE;
	if (real_getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &l) < 0)
		return -1;
	return cc_algo(name, l);
}

/* The options the program set on the kernel socket before the core saw
 * it, for the engine's socket; none to read if defaults (a socket made
 * here that the program set no option on: eleven getsockopt calls a
 * connection otherwise), IP_TOS and IP_TTL only if ip (a connect gave
 * the core those with its SYN), and the stack's congestion control cc
 * (chosen_cc) if the program chose one of the stack's. */
static void copy_options(int fd, int h, int defaults, int ip, int cc)
{
	if (defaults)
		return;
	for (int i = 0; i < N_STACK_OPTS; i++) {
		int v = 0;
		socklen_t l = sizeof v;
		if (!stack_opts[i].copied || (stack_opts[i].level == IPPROTO_IP && !ip))
			continue;
		if (real_getsockopt(fd, stack_opts[i].level, stack_opts[i].name, &v, &l) == 0 && v)
			CORE(core.setopt(h, stack_opts[i].opt, v));
		if (stack_opts[i].opt == ONL_OPT_RCVLOWAT && (unsigned)h < MAX_HANDLES)
			hlowat[h] = v > 1 ? (uint32_t)v : 0;
	}
	struct linger lg;
	socklen_t l = sizeof lg;
	if (real_getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &l) == 0 && lg.l_onoff)
		CORE(core.setopt(h, ONL_OPT_LINGER, lg.l_linger));
	if (cc >= 0)
		CORE(core.setopt(h, ONL_OPT_CONGESTION, cc));
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
	blocked_limit = CORE(core.blocked_threads());
	irq_fd = CORE(core.irq_fd());
	remote_fd = CORE(core.remote_fd());
}

/* v4_of reads the IPv4 address and port (network order) that address a
 * (of length l) names for socket fd: an IPv4 address, or on an IPv6
 * socket an IPv4-mapped one (::ffff:a.b.c.d), or, where wild is set
 * (a listener's own name), the IPv6 wildcard of a socket that is not
 * IPV6_V6ONLY, which takes IPv4 too (0.0.0.0). 0: an address the
 * stack does not serve (IPv6, or a family not the socket's). */
static int v4_of(int fd, const struct fdent *e, const struct sockaddr *a, socklen_t l, int wild,
		 uint32_t *ip, uint16_t *port)
{
	if (!a)
		return 0;
	if (!e->v6) {
		if (a->sa_family != AF_INET || l < sizeof(struct sockaddr_in))
			return 0;
		const struct sockaddr_in *sin = (const struct sockaddr_in *)a;
		*ip = sin->sin_addr.s_addr;
		*port = sin->sin_port;
		return 1;
	}
	if (a->sa_family != AF_INET6 || l < sizeof(struct sockaddr_in6))
		return 0;
	const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)a;
	/* The kernel makes a socket bound to an IPv6 address (not the
	 * wildcard, not IPv4-mapped) IPV6_V6ONLY too (inet6_bind). */
	int v6only = 0;
	socklen_t vl = sizeof v6only;
	if (real_getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &vl) < 0 || v6only)
		return 0;
	if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr))
		memcpy(ip, &s6->sin6_addr.s6_addr[12], 4);
	else if (wild && IN6_IS_ADDR_UNSPECIFIED(&s6->sin6_addr))
		*ip = 0;
	else
		return 0;
	*port = s6->sin6_port;
	return 1;
}

/* loopback: ip (network order) is in 127.0.0.0/8, which no interface's
 * stack serves: a socket there is the kernel's, and needs no core. A
 * process whose only sockets are on loopback (varnish's manager, whose
 * command line listens on 127.0.0.1) loaded the core and took a stack
 * for them from onloadd (a queue, and the named stack its workers, of
 * another user, could then not join) to hear it did not serve them. */
static int loopback(uint32_t ip) { return (ntohl(ip) >> 24) == 127; }

/* lopt_gen counts the changes of listeners' options (lopts_of). */
static uint32_t lopt_gen;

/* other_congestion: the program chose, for fd, a congestion control the
 * stack does not have (cc -1 from chosen_cc, named name: bbr, dctcp):
 * the connection is the kernel's, as it asked. */
static int other_congestion(int fd, int cc, const char *name, const char *what)
{
	if (cc != -1)
		return 0;
	debugf("fd %d: %s with TCP_CONGESTION %s, which the stack has not (cubic, reno): the kernel's", fd, what, name);
	return 1;
}

/* other_device: fd is bound to an interface (SO_BINDTODEVICE) that is
 * not the stack's, so its traffic goes where the kernel sends it, as the
 * program asked (a host with two networks). Read only from a socket the
 * program set an option on (not defaults). The core is loaded. */
static int other_device(int fd, int defaults, const char *what)
{
	int dev = 0;
	socklen_t l = sizeof dev;
	if (defaults || real_getsockopt(fd, SOL_SOCKET, SO_BINDTOIFINDEX, &dev, &l) < 0 || !dev)
		return 0;
	int ours = CORE(core.ifindex());
	if (dev == ours)
		return 0;
	char name[IF_NAMESIZE] = "?";
	socklen_t nl = sizeof name;
	real_getsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, name, &nl);
	debugf("fd %d: %s on interface %s (SO_BINDTODEVICE), not the stack's: the kernel's", fd, what, name);
	return 1;
}

/* reuseport_twin is the handle of an accelerated listener of this
 * process's on fd's address (ip, port) with which fd, bound with
 * SO_REUSEPORT, is in the kernel's SO_REUSEPORT group; 0 if none. A
 * server with a listener a thread (each bound with SO_REUSEPORT) had the
 * first take the port and the others listen in the kernel, where no
 * connection reached them: every connection went to the first thread.
 * Now they share its queue (as dup'd fds do: the handle is counted), and
 * each thread accepts what it can take, as Onload's listeners of one
 * group within a stack. Under mu. */
static int reuseport_twin(int fd, struct fdent *e, uint32_t ip, uint16_t port)
{
	int on = 0;
	socklen_t l = sizeof on;
	if (real_getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &on, &l) < 0 || !on)
		return 0;
	for (int o = 0; o < nfdt; o++) {
		if (!block_used((unsigned)o)) {
			o = (o / FDT_BLOCK + 1) * FDT_BLOCK - 1;
			continue;
		}
		struct fdent *x = &fdt[o];
		if (o == fd || x->kind != K_OURS || !x->listening || x->v6 != e->v6)
			continue;
		struct sockaddr_storage sa;
		socklen_t sl = sizeof sa;
		uint32_t xip;
		uint16_t xport;
		on = 0;
		l = sizeof on;
		if (real_getsockname(o, (struct sockaddr *)&sa, &sl) == 0 &&
		    v4_of(o, x, (struct sockaddr *)&sa, sl, 1, &xip, &xport) && xip == ip && xport == port &&
		    real_getsockopt(o, SOL_SOCKET, SO_REUSEPORT, &on, &l) == 0 && on) {
			debugf("fd %d: listening, accelerated, on fd %d's queue (SO_REUSEPORT)", fd, o);
			return x->h;
		}
	}
	return 0;
}

/* accel_listener hands a listening socket to the core, once, if it will
 * have it; the entry is K_OURS after, or not ours. */

void accel_listener(int fd, struct fdent *e)
{
	if (e->kind != K_TCP || !e->listening || after_fork || left_stack)
		return;
	table_lock();
	/* Its name before the core: a loopback listener needs none. */
	struct sockaddr_storage sa;
	socklen_t l = sizeof sa;
	uint32_t ip;
	uint16_t port;
	int named = e->kind == K_TCP && !e->tried && real_getsockname(fd, (struct sockaddr *)&sa, &l) == 0 &&
		    v4_of(fd, e, (struct sockaddr *)&sa, l, 1, &ip, &port);
	if (named && loopback(ip)) {
		e->tried = 1;
		debugf("fd %d: listening in the kernel (a loopback address)", fd);
	}
	if (e->kind == K_TCP && !e->tried && load_core() == 1) {
		int h = 0, v6 = e->v6;
		int twin = 0;
		char ccn[CC_NAME_MAX + 1];
		int cc = chosen_cc(fd, e, ccn);
		if (other_device(fd, e->fresh && !e->opts_set, "listening") || other_congestion(fd, cc, ccn, "listening"))
			;
		else if (named)
			h = (twin = reuseport_twin(fd, e, ip, port)) ? twin : CORE(core.listen(fd, ip, e->lpid != getpid()));
		else if (v6)
			debugf("fd %d: an IPv6 listener on an IPv6 address, or IPV6_V6ONLY: the kernel's", fd);
		if (h > 0) {
			int nb = nonblocking(fd), defaults = e->fresh && !e->opts_set, timeo = e->timeo;
			set_ours(fd, h, nb, nb, 1, timeo);
			/* What an earlier listener on this number left (lopts_of)
			 * does not stand: its close may not have counted (fdgen),
			 * if the kernel had it by then. */
			__atomic_add_fetch(&lopt_gen, 1, __ATOMIC_RELEASE);
			e->v6 = v6;
			kreg_take(fd, e);
			if (!twin) /* a twin's options are its group's first's */
				copy_options(fd, h, defaults, 1, cc);
			stack_known();
			debugf("fd %d: listening, accelerated", fd);
		} else {
			kreg_forget(fd);
			e->tried = 1;
			debugf("fd %d: listening in the kernel", fd);
		}
	}
	table_unlock();
}

EXPORT int listen(int fd, int backlog)
{
	struct fdent *e = ent(fd);
	if (e && e->kind == K_OURS) {
		errno = EINVAL; /* connected */
		return -1;
	}
	int r = real_listen(fd, backlog);
	if (r == 0 && e && e->kind == K_TCP) {
		e->listening = 1;
		e->lpid = getpid();
	}
	return r;
}

/* connect_ended tells the program how the connect of call c ended: 0, or
 * -1 with the connection's error, ECONNABORTED if the program took it
 * already (SO_ERROR), as the kernel's. The fd's entry keeps the end,
 * unless the fd was closed while the connect waited. */
static int connect_ended(struct ccall *c)
{
	int gone = ccall_gone(c);
	if (!gone)
		c->e->connecting = 0;
	struct onl_tcpinfo ti;
	if (CORE(core.tcpinfo(c->h, &ti)) == 0 && ti.state != TCP_CLOSE)
		return 0;
	if (!gone)
		c->e->connecting = CONN_FAILED;
	int err = CORE(core.sockerr(c->h));
	errno = err ? err : ECONNABORTED;
	return -1;
}

/* kernel_connect_ended is connect_call's end when a handover gave the
 * connecting socket to the kernel: its connect's end, as the kernel tells
 * it. */
static int kernel_connect_ended(int fd)
{
	if (wait_one(fd, POLLOUT, -1) < 0)
		return -1;
	int err = 0;
	socklen_t l = sizeof err;
	if (real_getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
		return -1;
	if (err) {
		errno = err;
		return -1;
	}
	return 0;
}

/* connect_call waits for the end of the connect of call c, on a
 * blocking socket. As a read does (ccall): another thread's close of the
 * fd while the connect blocks lets go of the number, and the connect goes
 * on, as the kernel's does (it holds the file), and returns how it ended;
 * the connection closes then. SO_SNDTIMEO ends the wait with
 * EINPROGRESS, the connect going on, as the kernel's. */
static int connect_call(struct ccall *c)
{
	int64_t dl = DL_UNREAD;
	for (;;) {
		switch (ccall_check(c)) {
		case CC_CLOSED:
			return -1;
		case CC_KERNEL:
			ccall_to_kernel(c);
			return kernel_connect_ended(c->fd);
		}
		int ev;
		CORE_VOID(core.events(&c->h, &ev, NULL, 1, 0));
		if (ev & (ONL_WRITABLE | ONL_ERROR | ONL_HANGUP))
			return connect_ended(c);
		if (!ccall_blocked(c, 0, POLLOUT, &dl)) {
			if (errno == EAGAIN)
				errno = EINPROGRESS;
			return -1;
		}
	}
}

/* connect_again is connect on a socket that is ours already. As the
 * kernel's: one whose connect ended without the program told (the
 * non-blocking connect's EINPROGRESS) gets the end, once: 0 or its
 * error; EALREADY while it goes on (a blocking socket waits for it, as
 * for a first connect); then EISCONN, as for one connected. One whose
 * connect failed, and told so, connects anew (a program that retries
 * until its server is up): in the kernel, which its socket goes back
 * to. */
static int connect_again(struct fdent *e, int fd, const struct sockaddr *a, socklen_t l)
{
	if (e->connecting == CONN_FAILED) {
		debugf("fd %d: connecting again after a failed connect: in the kernel", fd);
		kernel_now(e);
		return real_connect(fd, a, l);
	}
	if (!e->connecting) {
		errno = EISCONN;
		return -1;
	}
	struct ccall c = ccall_begin(e, fd);
	int ev, r;
	CORE_VOID(core.events(&e->h, &ev, NULL, 1, 0));
	if (ev & (ONL_WRITABLE | ONL_ERROR | ONL_HANGUP)) {
		r = connect_ended(&c);
	} else if (e->nonblock) {
		errno = EALREADY;
		r = -1;
	} else if ((r = connect_call(&c)) < 0 && errno == EINPROGRESS) {
		errno = EALREADY;
	}
	ccall_done(&c);
	return r;
}

EXPORT int connect(int fd, const struct sockaddr *a, socklen_t l)
{
	struct fdent *e = ent(fd);
	if (e && e->kind == K_OURS) {
		CHECK_USABLE();
		return connect_again(e, fd, a, l);
	}
	uint32_t ip;
	uint16_t port;
	int ours = e && e->kind == K_TCP && !e->listening && !after_fork && !left_stack;
	if (!ours || !v4_of(fd, e, a, l, 0, &ip, &port)) {
		if (ours && e->v6 && a && a->sa_family == AF_INET6)
			debugf("fd %d: an IPv6 connect that does not reach IPv4 (an IPv6 address, IPV6_V6ONLY, or bound to an IPv6 address): the kernel's", fd);
		return real_connect(fd, a, l);
	}
	if (loopback(ip)) {
		debugf("fd %d: connecting in the kernel (a loopback address)", fd);
		return real_connect(fd, a, l);
	}
	if (load_core() != 1)
		return real_connect(fd, a, l);
	int nb = nonblocking(fd), v6 = e->v6;
	int defaults = e->fresh && !e->opts_set, timeo = e->timeo;
	char ccn[CC_NAME_MAX + 1];
	int cc = chosen_cc(fd, e, ccn);
	/* The SYN carries the TOS and TTL the program set, as the kernel's. */
	int tos = -1, ttl = -1;
	if (!defaults) {
		socklen_t ol = sizeof tos;
		if (real_getsockopt(fd, IPPROTO_IP, IP_TOS, &tos, &ol) < 0)
			tos = -1;
		ol = sizeof ttl;
		if (real_getsockopt(fd, IPPROTO_IP, IP_TTL, &ttl, &ol) < 0)
			ttl = -1;
	}
	int h = other_device(fd, defaults, "connecting") || other_congestion(fd, cc, ccn, "connecting") ? 0 : CORE(core.connect(fd, ip, port, tos, ttl));
	if (h == 0) {
		table_lock();
		kreg_forget(fd);
		e->kind = K_NONE;
		table_unlock();
		return real_connect(fd, a, l);
	}
	if (h < 0) {
		errno = -h;
		return -1;
	}
	table_lock();
	set_ours(fd, h, nb, nb, 0, timeo);
	e->v6 = v6;
	kreg_take(fd, e);
	table_unlock();
	copy_options(fd, h, defaults, 0, cc);
	stack_known();
	debugf("fd %d: connecting, accelerated", fd);
	e->connecting = CONN_PENDING;
	if (nb) {
		errno = EINPROGRESS;
		return -1;
	}
	struct ccall c = ccall_begin(e, fd);
	int r = connect_call(&c);
	ccall_done(&c);
	return r;
}

/* inherit_waits gives kfd, accepted (handle h) on listener fd (entry
 * l), what its blocking calls read of the listener's, as the kernel's
 * accept gives a new connection its listener's options: SO_RCVLOWAT
 * (hlowat; the stack's child took it) and SO_RCVTIMEO and SO_SNDTIMEO
 * (on its kernel socket). */
static void inherit_waits(const struct fdent *l, int fd, int kfd, int h)
{
	if ((unsigned)l->h >= MAX_HANDLES || (unsigned)h >= MAX_HANDLES)
		return;
	hlowat[h] = hlowat[l->h];
	if (!htimeo[l->h])
		return;
	for (int i = 0; i < 2; i++) {
		int name = i ? SO_SNDTIMEO : SO_RCVTIMEO;
		struct timeval tv;
		socklen_t len = sizeof tv;
		if (real_getsockopt(fd, SOL_SOCKET, name, &tv, &len) == 0 && (tv.tv_sec || tv.tv_usec) &&
		    real_setsockopt(kfd, SOL_SOCKET, name, &tv, sizeof tv) == 0)
			htimeo[h] = 1;
	}
}

/* inherit_options gives accepted connection kfd the options of
 * listener fd, as Linux's child socket is a copy of its listener's: read
 * from the listener's kernel half (it has what the program set), set on
 * the connection's kernel socket where they differ (getsockopt reads
 * them there, and a handover makes them the live ones). The stack's
 * child has them already: it took its listener's in the stack as it was
 * made (setsockopt gives a listener's to the stack too). Before, the
 * kernel socket had a new socket's defaults: no keepalive, Nagle on
 * (TestShimAccepts), and without SO_REUSEADDR a connection handed over
 * to the kernel (sshd's, inetd's) left a TIME-WAIT that kept the server,
 * restarted, from binding its port for a minute. What differs is read
 * from the listener once (sixteen getsockopt calls) and kept
 * (lopts_of), where every accept read it again: a server that takes a
 * connection a request (redis-benchmark -k 0) spent a quarter of its
 * time a connection there. An option set on the listener between a
 * connection's handshake and its accept reads as set on the connection,
 * which does not have it (nor would it on Linux). */
static const struct { int level, name; } inherited[] = {
	{SOL_SOCKET, SO_REUSEADDR}, {SOL_SOCKET, SO_REUSEPORT}, /* for its TIME-WAIT, if handed over */
	{SOL_SOCKET, SO_KEEPALIVE}, {SOL_SOCKET, SO_RCVLOWAT}, {SOL_SOCKET, SO_PRIORITY},
	{IPPROTO_TCP, TCP_NODELAY}, {IPPROTO_TCP, TCP_CORK}, {IPPROTO_TCP, TCP_KEEPIDLE},
	{IPPROTO_TCP, TCP_KEEPINTVL}, {IPPROTO_TCP, TCP_KEEPCNT}, {IPPROTO_TCP, TCP_USER_TIMEOUT},
	{IPPROTO_IP, IP_TOS}, {IPPROTO_IP, IP_TTL}, {IPPROTO_TCP, TCP_NOTSENT_LOWAT},
	{SOL_SOCKET, SO_RCVBUF}, {SOL_SOCKET, SO_SNDBUF}, /* last: they read back doubled */
};
enum { N_INHERITED = sizeof inherited / sizeof inherited[0] };

/* lopts is what a listener's connections inherit (inherit_options):
 * the options that differ from a new socket's, with their values to set,
 * and its SO_LINGER. It stands while no option was set on a listener
 * and none was accelerated (lopt_gen), and its fd was not closed
 * (fdgen). */
struct lopts {
	uint32_t gen, fdgen;
	int n, linger;
	struct linger lg;
	struct { int level, name, v; } set[N_INHERITED];
};
static struct lopts **lcache; /* by fd, made at the first accept */

/* lopts_of reads what listener fd's connections inherit, or finds it
 * read: NULL if out of memory. A thread that reads it publishes a whole
 * new one (the one it replaces is not freed: a reader may hold it). */
static const struct lopts *lopts_of(int fd, int v6)
{
	if ((unsigned)fd >= (unsigned)nfdt)
		return NULL;
	struct lopts **lc = __atomic_load_n(&lcache, __ATOMIC_ACQUIRE);
	if (!lc) {
		struct lopts **fresh = calloc(nfdt, sizeof *fresh);
		if (!fresh)
			return NULL;
		if (!__atomic_compare_exchange_n(&lcache, &lc, fresh, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			free(fresh);
		else
			lc = fresh;
	}
	uint32_t gen = __atomic_load_n(&lopt_gen, __ATOMIC_ACQUIRE);
	struct lopts *o = __atomic_load_n(&lc[fd], __ATOMIC_ACQUIRE);
	if (o && o->gen == gen && o->fdgen == fdgen[fd])
		return o;
	/* A new socket's values, read once from the first accepted one (all
	 * are the kernel's defaults then): only those that differ are set. */
	static int dflt[2][N_INHERITED], known[2];
	if (!__atomic_load_n(&known[v6], __ATOMIC_ACQUIRE)) {
		int probe = real_socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		for (int i = 0; i < N_INHERITED; i++) {
			socklen_t l = sizeof(int);
			if (probe < 0 || real_getsockopt(probe, inherited[i].level, inherited[i].name, &dflt[v6][i], &l) < 0)
				dflt[v6][i] = -1;
		}
		if (probe >= 0)
			real_close(probe);
		__atomic_store_n(&known[v6], 1, __ATOMIC_RELEASE);
	}
	if (!(o = calloc(1, sizeof *o)))
		return NULL;
	o->gen = gen;
	o->fdgen = fdgen[fd];
	for (int i = 0; i < N_INHERITED; i++) {
		if (v6 && inherited[i].level == IPPROTO_IP)
			continue;
		int v = 0;
		socklen_t l = sizeof v;
		if (real_getsockopt(fd, inherited[i].level, inherited[i].name, &v, &l) < 0 || v == dflt[v6][i])
			continue;
		if (inherited[i].name == SO_RCVBUF || inherited[i].name == SO_SNDBUF)
			v /= 2; /* socket(7): the kernel doubles what is set */
		o->set[o->n].level = inherited[i].level;
		o->set[o->n].name = inherited[i].name;
		o->set[o->n++].v = v;
	}
	socklen_t l = sizeof o->lg;
	o->linger = real_getsockopt(fd, SOL_SOCKET, SO_LINGER, &o->lg, &l) == 0 && o->lg.l_onoff;
	__atomic_store_n(&lc[fd], o, __ATOMIC_RELEASE);
	return o;
}

static void inherit_options(int fd, int kfd, int v6)
{
	const struct lopts *o = lopts_of(fd, v6);
	if (!o)
		return;
	for (int i = 0; i < o->n; i++)
		real_setsockopt(kfd, o->set[i].level, o->set[i].name, &o->set[i].v, sizeof o->set[i].v);
	if (o->linger)
		real_setsockopt(kfd, SOL_SOCKET, SO_LINGER, &o->lg, sizeof o->lg);
}

/* fill_addr gives the program address ip:port (network order) as the
 * kernel gives a name: truncated to *l, whose new value is the whole
 * length; on an IPv6 socket (v6) as an IPv4-mapped address. */
static void fill_addr(struct sockaddr *a, socklen_t *l, uint32_t ip, uint16_t port, int v6)
{
	if (!a || !l)
		return;
	if (v6) {
		struct sockaddr_in6 s6 = {.sin6_family = AF_INET6, .sin6_port = port};
		s6.sin6_addr.s6_addr[10] = s6.sin6_addr.s6_addr[11] = 0xff;
		memcpy(&s6.sin6_addr.s6_addr[12], &ip, 4);
		memcpy(a, &s6, *l < sizeof s6 ? *l : sizeof s6);
		*l = sizeof s6;
		return;
	}
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = port, .sin_addr.s_addr = ip};
	memcpy(a, &sin, *l < sizeof sin ? *l : sizeof sin);
	*l = sizeof sin;
}

static int accept_call(struct ccall *c, int v6, struct sockaddr *a, socklen_t *l, int flags);

EXPORT int accept4(int fd, struct sockaddr *a, socklen_t *l, int flags)
{
	struct fdent *e = ours_or_listener(fd);
	CHILD_TAKES_ANY(fd, e);
	if (!e || !e->listening)
		return real_accept4(fd, a, l, flags);
	CHECK_USABLE();
	/* As a read does (ccall): another thread's close of the listener's
	 * fd while the accept blocks lets go of the number, and the accept
	 * goes on with the listener, as the kernel's does (it holds the
	 * file), returning the next connection; the listener closes when
	 * the accept returns. */
	struct ccall c = ccall_begin(e, fd);
	int r = accept_call(&c, e->v6, a, l, flags);
	ccall_done(&c);
	return r;
}

static int accept_call(struct ccall *c, int v6, struct sockaddr *a, socklen_t *l, int flags)
{
	int fd = c->fd;
	int64_t dl = DL_UNREAD;
	for (;;) {
		switch (ccall_check(c)) {
		case CC_CLOSED:
			return -1;
		case CC_KERNEL:
			ccall_to_kernel(c);
			return real_accept4(fd, a, l, flags);
		}
		int gone = ccall_gone(c);
		int ev;
		CORE_VOID(core.events(&c->h, &ev, NULL, 1, 0));
		if (ev & ONL_READABLE) {
			int kfd = real_socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | (flags & SOCK_CLOEXEC), 0);
			if (kfd < 0)
				return -1;
			/* The fd first: out of fds, the connection stays queued,
			 * as the kernel's does. */
			int h = CORE(core.accept(c->h, kfd));
			if (h > 0) {
				table_lock();
				set_ours(kfd, h, !!(flags & SOCK_NONBLOCK), 1, 0, 0);
				if (ent(kfd))
					ent(kfd)->v6 = v6;
				table_unlock();
				if (!gone) {
					inherit_waits(c->e, fd, kfd, h);
					inherit_options(fd, kfd, v6);
				}
				uint32_t lip, rip;
				uint16_t lp, rp;
				if (CORE(core.addrs(h, &lip, &lp, &rip, &rp)) == 0)
					fill_addr(a, l, rip, rp, v6);
				/* Queued before the process left the stack
				 * (leave_stack): the kernel's. */
				if (__atomic_load_n(&left_stack, __ATOMIC_ACQUIRE)) {
					const char *why = __atomic_load_n(&left_why, __ATOMIC_ACQUIRE);
					to_kernel(kfd, ent(kfd), why ? why : "as the process leaves the stack");
				}
				return kfd;
			}
			real_close(kfd);
			if (h != -EAGAIN) {
				errno = -h;
				return -1;
			}
		}
		if (!gone) {
			/* Clients through loopback reach the kernel's half,
			 * which closes with the fd. */
			int k = real_accept4(fd, a, l, flags);
			if (k >= 0)
				debugf("fd %d: a connection from the listener's kernel socket: the kernel's", fd);
			if (k >= 0 || errno != EAGAIN)
				return k;
		}
		if (!ccall_blocked(c, 0, POLLIN, &dl))
			return -1;
	}
}

EXPORT int accept(int fd, struct sockaddr *a, socklen_t *l) { return accept4(fd, a, l, 0); }

static ssize_t recv_call(struct ccall *c, void *buf, size_t n, int flags);

/* bad_buf: a buffer the kernel would refuse with EFAULT before it
 * touched it (NULL, or in the first page, with a length; one that wraps
 * the address space), which the core would fault on. A wild pointer
 * elsewhere is not caught. */
static inline int bad_buf(const void *p, size_t n)
{
	return n && ((uintptr_t)p < 4096 || n > (size_t)SSIZE_MAX || (uintptr_t)p + n < (uintptr_t)p);
}

/* iov_usable checks cnt vectors as the kernel's import_iovec does (-1
 * with EINVAL or EFAULT) and returns how many of them a call takes:
 * those before the first whose buffer is bad, as the kernel's copy stops
 * there with what it took (EFAULT if that is nothing). */
static int iov_usable(const struct iovec *iov, size_t cnt)
{
	if (cnt > IOV_MAX) {
		errno = EINVAL;
		return -1;
	}
	if (bad_buf(iov, cnt * sizeof *iov)) {
		errno = EFAULT;
		return -1;
	}
	size_t total = 0;
	for (size_t i = 0; i < cnt; i++) {
		if (iov[i].iov_len > (size_t)SSIZE_MAX - total) {
			errno = EINVAL;
			return -1;
		}
		total += iov[i].iov_len;
	}
	size_t before = 0;
	for (size_t i = 0; i < cnt; i++) {
		if (bad_buf(iov[i].iov_base, iov[i].iov_len)) {
			if (!before) {
				errno = EFAULT;
				return -1;
			}
			return (int)i;
		}
		before += iov[i].iov_len;
	}
	return (int)cnt;
}

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
	if (flags & (MSG_ERRQUEUE | MSG_OOB)) {
		/* Not the stream: the stack keeps no error queue (EAGAIN: none
		 * queued), and takes urgent data inline (as SO_OOBINLINE, with
		 * which the kernel's MSG_OOB fails with EINVAL). Taken as a
		 * plain recv, they consumed the stream's bytes. */
		errno = flags & MSG_ERRQUEUE ? EAGAIN : EINVAL;
		return -1;
	}
	if (!(flags & MSG_TRUNC) && bad_buf(buf, n)) {
		errno = EFAULT;
		return -1;
	}
	struct ccall c = ccall_begin(e, fd);
	ssize_t r = recv_call(&c, buf, n, flags);
	ccall_done(&c);
	return r;
}

/* read_target is how many of n bytes a blocking read on handle h
 * returns with: all of them with MSG_WAITALL, else up to SO_RCVLOWAT
 * (tcp_recvmsg's sock_rcvlowat), else any. */
static size_t read_target(int h, int flags, size_t n)
{
	if (flags & MSG_WAITALL)
		return n;
	if ((unsigned)h < MAX_HANDLES && hlowat[h] > 1)
		return hlowat[h] < n ? hlowat[h] : n;
	return 1;
}

static ssize_t recv_call(struct ccall *c, void *buf, size_t n, int flags)
{
	int fd = c->fd;
	size_t got = 0;
	int64_t dl = DL_UNREAD;
	/* MSG_TRUNC: TCP's discards what it takes, buf untouched (tcp(7)). */
	char scratch[4096];
	int trunc = flags & MSG_TRUNC;
	/* It waits, as the kernel's, for the socket to be readable: the
	 * mark's bytes queued (the stack's readiness), an end, an error or
	 * its timeout, and returns what it has then. */
	size_t target = read_target(c->h, flags, n);
	for (;;) {
		switch (ccall_check(c)) {
		case CC_CLOSED:
			return got ? (ssize_t)got : -1;
		case CC_KERNEL:
			ccall_to_kernel(c);
			return got ? (ssize_t)got : real_recv(fd, buf, n, flags);
		}
		size_t want = n - got;
		char *to = (char *)buf + got;
		if (trunc) {
			to = scratch;
			want = want < sizeof scratch ? want : sizeof scratch;
		}
		if (n == 0) {
			/* The kernel's TCP waits for a byte (its low-water mark)
			 * and takes none: EAGAIN, or a block, while none is there. */
			int owed = 0;
			long r = CORE(core.recv(c->h, scratch, 1, 1, &owed));
			if (r >= 0)
				return 0;
			if (r != -EAGAIN) {
				if (r == -EBADF && ccall_taken(c))
					return real_recv(fd, buf, n, flags);
				errno = -r;
				return -1;
			}
			if (!ccall_blocked(c, flags, POLLIN, &dl))
				return -1;
			continue;
		}
		int owed = 0;
		long r = CORE(core.recv(c->h, to, want, flags & MSG_PEEK, &owed));
		if (owed)
			owe_kick(); /* the ACK the read owes (onl_recv) */
		if (r > 0) {
			got += r;
			if (trunc && r == (long)want && got < n && !(flags & MSG_PEEK))
				continue; /* there may be more to discard */
			if (got >= target || (flags & MSG_PEEK))
				return got;
			continue;
		}
		if (r == -EAGAIN && got >= target)
			return got;
		if (r == 0)
			return got;
		if (r != -EAGAIN) {
			if (got)
				return got;
			if (r == -EBADF && ccall_taken(c))
				return real_recv(fd, buf, n, flags);
			errno = -r;
			return -1;
		}
		if (!ccall_blocked(c, flags, POLLIN, &dl))
			return got ? (ssize_t)got : -1;
	}
}

/* ours_send queues all of buf (blocking) or what fits (non-blocking). */
static ssize_t send_call(struct ccall *c, const void *buf, size_t n, int flags);

/* kernel_send hands connection fd (entry e) over to the kernel for a
 * send that only the kernel's socket makes: 1 if it did, and the send
 * goes there. Urgent data (MSG_OOB: the stack sends no URG), and
 * MSG_ZEROCOPY on a socket with SO_ZEROCOPY on, whose completions come
 * on the kernel socket's error queue (without SO_ZEROCOPY the kernel
 * ignores the flag, and so does the stack). Before, the program waited
 * for a completion that never came (calls.c, TestShimCalls). */
static int kernel_send(int fd, struct fdent *e, int flags)
{
	if (!(flags & (MSG_OOB | MSG_ZEROCOPY)))
		return 0;
	const char *why = "to send urgent data (MSG_OOB)";
	if (!(flags & MSG_OOB)) {
		int on = 0;
		socklen_t l = sizeof on;
		if (real_getsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &on, &l) < 0 || !on)
			return 0;
		why = "for MSG_ZEROCOPY, whose completions the kernel's socket gives";
	}
	return to_kernel(fd, e, why) == 0;
}

static ssize_t ours_send(struct fdent *e, int fd, const void *buf, size_t n, int flags)
{
	CHILD_TAKES(fd, e);
	if (!e || e->kind != K_OURS)
		return real_send(fd, buf, n, flags);
	CHECK_USABLE();
	if (bad_buf(buf, n)) {
		errno = EFAULT;
		return -1;
	}
	if (kernel_send(fd, e, flags))
		return real_send(fd, buf, n, flags);
	struct ccall c = ccall_begin(e, fd);
	ssize_t r = send_call(&c, buf, n, flags);
	ccall_done(&c);
	return r;
}

static ssize_t send_call(struct ccall *c, const void *buf, size_t n, int flags)
{
	int fd = c->fd;
	size_t done = 0;
	int64_t dl = DL_UNREAD;
	for (;;) {
		switch (ccall_check(c)) {
		case CC_CLOSED:
			return done ? (ssize_t)done : -1;
		case CC_KERNEL:
			ccall_to_kernel(c);
			return done ? (ssize_t)done : real_send(fd, buf, n, flags);
		}
		/* The frames wait for the kick that this thread's next wait
		 * gives (flush_kicks): a program answering many clients sends
		 * all its answers in one system call. */
		long r = CORE(core.send(c->h, (const char *)buf + done, n - done, 1));
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
			if (r == -EBADF && ccall_taken(c))
				return real_send(fd, buf, n, flags);
			if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
				raise(SIGPIPE); /* as the kernel does; on_pipe closes first */
			errno = -r;
			return -1;
		}
		if (!ccall_blocked(c, flags, POLLOUT, &dl))
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

static ssize_t ours_sendv(struct fdent *e, int fd, const struct iovec *iov, size_t n, int flags)
{
	int cnt = iov_usable(iov, n);
	if (cnt < 0)
		return -1;
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

/* PEEK_MAX bounds what a peek into several vectors looks at (through
 * one buffer): a short read, as a peek may be. */
#define PEEK_MAX (4 << 20)

/* ours_recvv fills the vectors in order, as the kernel's tcp_recvmsg
 * does: a blocking call returns once it has its target counted over all
 * of them (all with MSG_WAITALL, else the socket's SO_RCVLOWAT, else a
 * byte), waiting as recv_call does, then takes what else is queued
 * without waiting. Before, the first vector alone counted (a readv whose
 * first vector was shorter than the mark returned without it). A peek
 * into several vectors looks through one buffer: each vector's own
 * peek saw the same first bytes. */
static ssize_t ours_recvv(struct fdent *e, int fd, const struct iovec *iov, size_t n, int flags)
{
	if (flags & (MSG_ERRQUEUE | MSG_OOB))
		return ours_recv(e, fd, NULL, 0, flags); /* not the stream (ours_recv) */
	int cnt = iov_usable(iov, n);
	if (cnt < 0)
		return -1;
	size_t total = 0;
	int used = 0, one = -1;
	for (int i = 0; i < cnt; i++) {
		if (iov[i].iov_len) {
			total += iov[i].iov_len;
			used++;
			one = i;
		}
	}
	if (used == 0)
		return 0;
	if (used == 1)
		return ours_recv(e, fd, iov[one].iov_base, iov[one].iov_len, flags);
	if (flags & MSG_PEEK) {
		size_t m = total < PEEK_MAX ? total : PEEK_MAX;
		char *b = malloc(m);
		if (!b) {
			errno = ENOMEM;
			return -1;
		}
		ssize_t r = ours_recv(e, fd, b, m, flags);
		for (int i = 0, at = 0; r > 0 && i < cnt && at < r; i++) {
			size_t k = iov[i].iov_len < (size_t)(r - at) ? iov[i].iov_len : (size_t)(r - at);
			memcpy(iov[i].iov_base, b + at, k);
			at += (int)k;
		}
		int saved = errno;
		free(b);
		errno = saved;
		return r;
	}
	size_t target = read_target(e->h, flags, total);
	ssize_t done = 0;
	size_t off = 0;
	for (int i = 0; i < cnt;) {
		size_t len = iov[i].iov_len - off;
		if (len == 0) {
			i++;
			off = 0;
			continue;
		}
		int wait = (size_t)done < target;
		ssize_t r = ours_recv(e, fd, (char *)iov[i].iov_base + off, len,
				      wait ? flags & ~MSG_WAITALL : flags | MSG_DONTWAIT);
		if (r <= 0)
			return done ? done : r; /* an end (0), an error, or nothing more there */
		done += r;
		off += (size_t)r;
		if ((size_t)r < len && !wait)
			break;
	}
	return done;
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	struct fdent *e = ours(fd);
	return e ? ours_recvv(e, fd, iov, (size_t)cnt, 0) : real_readv(fd, iov, cnt);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	struct fdent *e = ours(fd);
	return e ? ours_sendv(e, fd, iov, (size_t)cnt, 0) : real_writev(fd, iov, cnt);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	struct fdent *e = ours(fd);
	if (!e) {
		ssize_t r = real_recvmsg(fd, m, flags);
		if (r >= 0)
			adopt_received(m);
		return r;
	}
	if (bad_buf(m, sizeof *m)) {
		errno = EFAULT;
		return -1;
	}
	ssize_t r = ours_recvv(e, fd, m->msg_iov, m->msg_iovlen, flags);
	if (r >= 0) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

/* pass_listener: listener fd (entry e) goes to another process, which
 * gets its kernel socket and shares it, as two processes share one
 * listening socket on the kernel: the port becomes that socket's
 * (onl_retire_listener), and this process's accepts take what the
 * stack's listener holds, then the kernel's. One the stack has not
 * taken yet stays the kernel's. */
static void pass_listener(int fd, struct fdent *e)
{
	if (e->kind == K_TCP) {
		table_lock();
		if (e->kind == K_TCP && !e->tried) {
			e->tried = 1;
			debugf("fd %d: a listener passed to another process (SCM_RIGHTS): it stays the kernel's", fd);
		}
		table_unlock();
		return;
	}
	int r = listener_to_kernel(fd, e);
	if (r < 0)
		logf_("fd %d: a listener passed to another process (SCM_RIGHTS) keeps its port on the stack (%s): "
		      "connections to it come to this process only", fd, strerror(-r));
	else
		debugf("fd %d: a listener passed to another process (SCM_RIGHTS): its port is the kernel's socket's now, "
		       "which that process shares", fd);
}

/* pass_rights: the accelerated connections a message passes to another
 * process (SCM_RIGHTS, on a Unix socket) go to the kernel first, as
 * across exec: the process that receives one gets its kernel socket,
 * which the stack's connection otherwise leaves unconnected. A listener
 * gives its port to its kernel socket (pass_listener). */
static void pass_right(int fd)
{
	struct fdent *e = ent(fd);
	if (e && (e->kind == K_OURS || e->kind == K_TCP) && e->listening)
		pass_listener(fd, e);
	else
		to_kernel(fd, ours(fd), "to pass it to another process (SCM_RIGHTS)");
}

static void pass_rights(const struct msghdr *m)
{
	if (bad_buf(m, sizeof *m) || !m->msg_controllen || bad_buf(m->msg_control, m->msg_controllen) || !fdt)
		return;
	each_passed_fd(m, pass_right);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	struct fdent *e = ours(fd);
	if (!e) {
		if (m && m->msg_controllen)
			pass_rights(m);
		return real_sendmsg(fd, m, flags);
	}
	if (bad_buf(m, sizeof *m)) {
		errno = EFAULT;
		return -1;
	}
	if (e->kind == K_OURS && !e->listening && !after_fork && kernel_send(fd, e, flags))
		return real_sendmsg(fd, m, flags); /* one send, as the program made it */
	return ours_sendv(e, fd, m->msg_iov, m->msg_iovlen, flags);
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *t)
{
	struct fdent *e = ours(fd);
	if (!e) {
		int r = real_recvmmsg(fd, v, n, flags, t);
		for (int i = 0; i < r; i++)
			adopt_received(&v[i].msg_hdr);
		return r;
	}
	if (n > IOV_MAX)
		n = IOV_MAX; /* as the kernel (UIO_MAXIOV) */
	if (bad_buf(v, n * sizeof *v)) {
		errno = EFAULT;
		return -1;
	}
	unsigned int i;
	for (i = 0; i < n; i++) {
		int f = flags & ~MSG_WAITFORONE;
		if (i > 0 && (flags & MSG_WAITFORONE))
			f |= MSG_DONTWAIT;
		ssize_t r = recvmsg(fd, &v[i].msg_hdr, f);
		if (r < 0)
			return i ? (int)i : -1;
		/* At the end of the stream each takes 0 at once, and the
		 * kernel's fills them all so. */
		v[i].msg_len = r;
	}
	return i;
}

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags)
{
	struct fdent *e = ours(fd);
	if (!e)
		return real_sendmmsg(fd, v, n, flags);
	if (n > IOV_MAX)
		n = IOV_MAX; /* as the kernel (UIO_MAXIOV) */
	if (bad_buf(v, n * sizeof *v)) {
		errno = EFAULT;
		return -1;
	}
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

/* splice with an accelerated socket at one end, which the kernel's
 * cannot reach (its socket is the port's reservation: ENOTCONN), moves
 * the bytes through a buffer as sendfile does, with the kernel's
 * semantics: the other end a pipe (EINVAL), no offset on either
 * (ESPIPE, EINVAL), what the pipe has room for from the socket, and from the
 * pipe only what the socket took (the rest stays in the pipe: the bytes
 * are copied out with tee and consumed once sent). A proxy relays so
 * (HAProxy's splicing). */
__thread int t_tee[2] = {-1, -1}; /* the thread's pipe for splice's copies (tee) */

static int is_pipe(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
}

EXPORT ssize_t splice(int in, loff_t *off_in, int out, loff_t *off_out, size_t n, unsigned int flags)
{
	struct fdent *ei = ours(in), *eo = ours(out);
	if ((!ei || ei->listening) && (!eo || eo->listening))
		return real_splice(in, off_in, out, off_out, n, flags);
	/* The kernel's checks, in its order: an offset on the pipe's end is
	 * ESPIPE, on the socket's EINVAL. */
	if (!is_pipe(ei ? out : in)) {
		errno = EINVAL;
		return -1;
	}
	if (ei ? off_out != NULL : off_in != NULL) {
		errno = ESPIPE;
		return -1;
	}
	if (off_in || off_out) {
		errno = EINVAL;
		return -1;
	}
	char buf[16384];
	size_t want = n < sizeof buf ? n : sizeof buf;
	if (!want)
		return 0;
	int nb = flags & SPLICE_F_NONBLOCK;
	if (ei) {
		/* socket to pipe: no more than the pipe has room for, so that
		 * nothing taken from the socket is left over. */
		for (;;) {
			int size = real_fcntl(out, F_GETPIPE_SZ), queued = 0;
			if (size < 0 || ioctl(out, FIONREAD, &queued) < 0)
				return -1;
			if (size > queued) {
				if ((size_t)(size - queued) < want)
					want = size - queued;
				break;
			}
			struct pollfd p = {.fd = out, .events = POLLOUT};
			if (nb || (real_fcntl(out, F_GETFL) & O_NONBLOCK)) {
				errno = EAGAIN;
				return -1;
			}
			if (poll(&p, 1, -1) < 0)
				return -1;
		}
		ssize_t r = ours_recv(ei, in, buf, want, nb ? MSG_DONTWAIT : 0);
		for (ssize_t w = 0; r > 0 && w < r;) {
			ssize_t k = real_write(out, buf + w, r - w);
			if (k < 0 && errno != EINTR && errno != EAGAIN)
				return w ? w : -1; /* the reader has gone (EPIPE) */
			if (k < 0 && errno == EAGAIN) {
				struct pollfd p = {.fd = out, .events = POLLOUT};
				poll(&p, 1, -1);
			}
			w += k > 0 ? k : 0;
		}
		return r;
	}
	/* pipe to socket: a copy of the pipe's bytes (tee), sent; the pipe
	 * gives up what the socket took. */
	if (t_tee[0] < 0 && pipe2(t_tee, O_CLOEXEC | O_NONBLOCK) < 0)
		return -1;
	ssize_t c = tee(in, t_tee[1], want, flags);
	if (c <= 0)
		return c;
	c = real_read(t_tee[0], buf, c);
	if (c <= 0)
		return c;
	ssize_t s = ours_send(eo, out, buf, c, nb ? MSG_DONTWAIT : 0);
	if (s > 0)
		for (ssize_t k = 0; k < s;) {
			ssize_t r = real_read(in, buf, s - k);
			if (r <= 0)
				break;
			k += r;
		}
	return s;
}

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
	if (e && e->kind == K_CORE && !after_fork && core_fd_live(fd, e))
		return core_fd_refused(fd, "close");
	if (e && e->kind == K_OURS && e->ho_ok)
		handover_for_close(fd, e);
	if (e && e->kind != K_NONE) {
		table_lock();
		drop(fd);
		table_unlock();
	}
	return real_close(fd);
}

/* close_range closes what close would of the range, the table's fds
 * one by one, and goes round the stack's own ("the core's own
 * descriptors", core.c); with CLOSE_RANGE_CLOEXEC it only marks them, as
 * the kernel does (the stack's are close-on-exec already). */
EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	if (first > last || (flags & ~CLOSE_RANGE_UNSHARE) || !nfdt)
		return (int)syscall(SYS_close_range, first, last, flags);
	unsigned int from = first, top = (unsigned int)nfdt - 1;
	for (unsigned int fd = first; fd <= last && fd <= top; fd++) {
		if (!block_used(fd)) {
			fd = (fd / FDT_BLOCK + 1) * FDT_BLOCK - 1; /* the block never had an entry */
			continue;
		}
		uint8_t k = __atomic_load_n(&fdt[fd].kind, __ATOMIC_RELAXED);
		if (k == K_NONE)
			continue;
		if (k == K_CORE && !after_fork && core_fd_live((int)fd, &fdt[fd])) {
			if (fd > from && syscall(SYS_close_range, from, fd - 1, flags) < 0)
				return -1;
			from = fd + 1;
			continue;
		}
		close((int)fd);
	}
	if (from > last)
		return 0;
	return (int)syscall(SYS_close_range, from, last, flags);
}

/* closefrom is close_range to the end (the C library's calls its own). */
EXPORT void closefrom(int lowfd)
{
	if (lowfd < 0)
		lowfd = 0;
	if (close_range((unsigned int)lowfd, ~0u, 0) == 0)
		return;
	for (int fd = lowfd; fd < nfdt; fd++)
		close(fd);
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
	if (e && !after_fork && level == IPPROTO_TCP && name == TCP_CONGESTION && v && l) {
		/* The stack's algorithm, which its kernel socket's need not be
		 * (the namespace's default, or one the stack has not). As the
		 * kernel: up to CC_NAME_MAX bytes of the name, NUL-padded. */
		int cc = CORE(core.getopt(e->h, ONL_OPT_CONGESTION));
		if (cc >= 0 && cc < N_CC) {
			char n[CC_NAME_MAX] = {0};
			strcpy(n, cc_names[cc]);
			socklen_t k = *l < CC_NAME_MAX ? *l : CC_NAME_MAX;
			memcpy(v, n, k);
			*l = k;
			return 0;
		}
	}
	if (!e || e->listening || after_fork)
		return real_getsockopt(fd, level, name, v, l);
	if (level == SOL_SOCKET && name == SO_ERROR && v && l && *l >= sizeof(int)) {
		*(int *)v = CORE(core.sockerr(e->h));
		*l = sizeof(int);
		return 0;
	}
	if (level == IPPROTO_TCP && name == TCP_QUICKACK && v && l && *l >= sizeof(int)) {
		/* The stack's ACK mode, which moves by itself (its kernel
		 * socket's stays as last set). */
		int q = CORE(core.getopt(e->h, ONL_OPT_QUICKACK));
		if (q >= 0) {
			*(int *)v = q;
			*l = sizeof(int);
			return 0;
		}
	}
	if (level == IPPROTO_TCP && name == TCP_MAXSEG && v && l && *l >= sizeof(int)) {
		/* The kernel's is the send MSS in use (its TCP_INFO's
		 * tcpi_snd_mss); the kernel socket's would be its default. */
		struct onl_tcpinfo ti;
		int r = CORE(core.tcpinfo(e->h, &ti));
		if (r < 0) {
			errno = -r;
			return -1;
		}
		*(int *)v = (int)ti.snd_mss;
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
	struct fdent *e = ours(fd), *k = ent(fd);
	CHILD_TAKES(fd, e);
	if (!e && k && k->kind == K_TCP && (level == IPPROTO_TCP || level == SOL_SOCKET || level == IPPROTO_IP)) {
		k->opts_set = 1; /* copy_options reads them */
		k->timeo |= timeo_opt(level, name);
	}
	int r = real_setsockopt(fd, level, name, v, l);
	if (r == 0 && !e && k && k->kind == K_TCP && level == IPPROTO_TCP && name == TCP_CONGESTION)
		k->cc_set = 1; /* chosen_cc */
	if (r == 0 && k && k->listening)
		__atomic_add_fetch(&lopt_gen, 1, __ATOMIC_RELEASE); /* its connections' options change (lopts_of) */
	if (e && r == 0 && timeo_opt(level, name) && (unsigned)e->h < MAX_HANDLES)
		htimeo[e->h] = 1; /* a blocking call reads it (sock_deadline) */
	if (!e || r < 0 || after_fork || !v || l < 1)
		return r;
	if (level == IPPROTO_TCP && name == TCP_CONGESTION) {
		/* The kernel took the name (it knows the algorithm, and the
		 * program may use it); the stack has two of them. */
		int cc = cc_algo(v, l), rr = cc < 0 ? -ENOENT : CORE(core.setopt(e->h, ONL_OPT_CONGESTION, cc));
		if (rr < 0)
			debugf("fd %d: TCP_CONGESTION %.*s: the stack has cubic and reno; the connection keeps its own", fd,
			       (int)(l < CC_NAME_MAX ? l : CC_NAME_MAX), (const char *)v);
		return r;
	}
	/* A listener's go to the stack's listener too, whose connections
	 * take them as they are made (passiveChildLocked), as Linux's child
	 * takes its listener's at the handshake. */
	int opt = 0, val;
	if (l >= sizeof(int))
		val = *(const int *)v;
	else if (level == IPPROTO_IP)
		val = *(const unsigned char *)v; /* ip(7): IP_TOS and IP_TTL take a byte too */
	else
		return r;
	if (level == SOL_SOCKET && name == SO_RCVLOWAT) {
		/* As the kernel took it (capped at half its buffer's limit):
		 * the stack's readiness, and a blocking read's target
		 * (read_target), follow it. */
		socklen_t vl = sizeof val;
		if (real_getsockopt(fd, level, name, &val, &vl) < 0)
			return r;
		if ((unsigned)e->h < MAX_HANDLES)
			hlowat[e->h] = val > 1 ? (uint32_t)val : 0;
	}
	if (level == SOL_SOCKET && name == SO_LINGER) {
		if (l >= sizeof(struct linger)) {
			const struct linger *lg = v;
			opt = ONL_OPT_LINGER;
			val = lg->l_onoff ? lg->l_linger : -1;
		}
	} else {
		opt = stack_opt(level, name);
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
	fill_addr(a, l, ip[peer], port[peer], e->v6);
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
	table_lock();
	drop(newfd);
	if (o->kind == K_TCP || o->kind == K_OURS) {
		if (o->kind == K_OURS)
			mark_ours(newfd, 1);
		*n = *o;
		set_kind(n, o->kind);
		n->ep = NULL;
		/* An option set through one of them is not seen on the other's
		 * entry: copy_options reads them all. */
		o->fresh = n->fresh = 0;
		if (o->kind == K_OURS && (unsigned)o->h < MAX_HANDLES) {
			__atomic_add_fetch(&hrefs[o->h], 1, __ATOMIC_RELAXED);
			hfds[o->h]++;
		}
	}
	table_unlock();
}

EXPORT int dup(int fd)
{
	int r = real_dup(fd);
	if (r >= 0)
		dup_to(fd, r);
	return r;
}

/* over_for_child: dup2 and dup3 onto fd2 close what it named. */
static void over_for_child(int fd, int fd2)
{
	struct fdent *e = ent(fd2);
	if (e && fd != fd2 && e->kind == K_OURS && e->ho_ok && real_fcntl(fd, F_GETFD) >= 0)
		handover_for_close(fd2, e);
}

/* ---- stdio ---------------------------------------------------------------
 *
 * The C library's stdio reads and writes a FILE's fd with its own
 * internal calls, which no interposer sees: a FILE on an accelerated
 * connection read and wrote the kernel's socket under the fd, which is
 * not connected, and a write's EPIPE raised SIGPIPE (bash's `printf ...
 * >&3` on a /dev/tcp connection ended bash). So a connection handed to
 * stdio goes to the kernel first: at fdopen, and where it becomes a
 * standard stream (dup2 or dup3 onto 0, 1 or 2: a shell's redirections,
 * an inetd-style service's). ONLOAD_LOG=debug says so. dprintf, which
 * writes with the same internal calls but keeps no FILE, is done here
 * instead (below). */
static void for_stdio(int fd, const char *why)
{
	struct fdent *e = ours(fd);
	if (e && !e->listening && !in_core)
		to_kernel(fd, e, why);
}

EXPORT FILE *fdopen(int fd, const char *mode)
{
	for_stdio(fd, "for stdio (fdopen), whose reads and writes the shim does not see");
	return real_fdopen(fd, mode);
}

/* dprintf and vdprintf format into a buffer of the C library's and
 * write it with the library's internal write, which the shim does not
 * see either: on a connection of ours they format here and write
 * through the stack, as many writes as it takes (the C library's stop
 * at the first error too: EAGAIN on a non-blocking socket fails them). */
EXPORT int vdprintf(int fd, const char *fmt, va_list ap)
{
	if (!ours(fd))
		return real_vdprintf(fd, fmt, ap);
	char *s;
	int n = vasprintf(&s, fmt, ap);
	if (n < 0)
		return -1;
	for (size_t done = 0; done < (size_t)n;) {
		ssize_t w = write(fd, s + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0) {
			int err = errno;
			free(s);
			errno = err;
			return -1;
		}
		done += w;
	}
	free(s);
	return n;
}

EXPORT int dprintf(int fd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = vdprintf(fd, fmt, ap);
	va_end(ap);
	return r;
}

/* std_stream: dup2 or dup3 made fd2 a standard stream. */
static void std_stream(int fd2)
{
	if (fd2 >= 0 && fd2 <= 2)
		for_stdio(fd2, "as a standard stream, which stdio reads and writes where the shim does not see");
}

/* onto_core refuses dup2 and dup3 onto one of the stack's own fds,
 * which the program never had: the stack would lose it. */
static int onto_core(int fd2, const char *call)
{
	struct fdent *e = ent(fd2);
	if (!e || e->kind != K_CORE || after_fork || !core_fd_live(fd2, e))
		return 0;
	static int logged;
	if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
		logf_("%s onto fd %d refused (EBADF): the number is the accelerated stack's own; "
		      "use another, or run the program without onloadd", call, fd2);
	errno = EBADF;
	return 1;
}

EXPORT int dup2(int fd, int fd2)
{
	if (onto_core(fd2, "dup2"))
		return -1;
	over_for_child(fd, fd2);
	int r = real_dup2(fd, fd2);
	if (r >= 0) {
		dup_to(fd, r);
		std_stream(r);
	}
	return r;
}

EXPORT int dup3(int fd, int fd2, int flags)
{
	if (onto_core(fd2, "dup3"))
		return -1;
	if (!(flags & ~O_CLOEXEC))
		over_for_child(fd, fd2);
	int r = real_dup3(fd, fd2, flags);
	if (r >= 0) {
		dup_to(fd, r);
		std_stream(r);
	}
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
		/* Signal-driven I/O is the kernel socket's: the connection goes
		 * to the kernel, which then signals its readiness. */
		if (e && (arg & O_ASYNC))
			to_kernel(fd, e, "for signal-driven I/O (O_ASYNC)");
		if (e && e->kind == K_OURS) {
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
	if (e && (req == FIONREAD || req == SIOCOUTQ || req == SIOCOUTQNSD))
		CHILD_TAKES(fd, e);
	if (e && req == FIOASYNC && arg && *(int *)arg) {
		to_kernel(fd, e, "for signal-driven I/O (FIOASYNC)");
		return real_ioctl(fd, req, arg);
	}
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
	if (e && (req == SIOCOUTQ || req == SIOCOUTQNSD) && arg && !e->listening) {
		/* What is written and not acknowledged, and what is not sent:
		 * the kernel socket's would be 0 (calls.c). 0 before the
		 * handshake's end, as tcp(7) has it. */
		CHECK_USABLE();
		struct onl_tcpinfo ti;
		int r = CORE(core.tcpinfo(e->h, &ti));
		if (r < 0) {
			errno = -r;
			return -1;
		}
		int early = ti.state == TCP_SYN_SENT || ti.state == TCP_SYN_RECV;
		*(int *)arg = early ? 0 : (int)(req == SIOCOUTQ ? ti.queued : ti.notsent);
		return 0;
	}
	return real_ioctl(fd, req, arg);
}

