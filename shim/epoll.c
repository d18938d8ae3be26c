/* epoll.c: epoll (see shim.h). */
#include "shim.h"

/* ---- epoll ------------------------------------------------------------- */

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

/* ---- waking the threads that wait on an instance ---------------------
 *
 * A thread waiting in an instance sees the accelerated members it had
 * when its wait began: one blocked in the kernel's epoll_wait (no member
 * then) sees none, and one blocked in wait_block only those it armed.
 * A member another thread adds meanwhile (apache's listener thread waits
 * while a worker hands it back a kept-alive connection) turned ready
 * unseen: the wait ran to its timeout (waits.c, TestShimWaits). So a
 * change of the members while a thread waits (waiters) makes the instance
 * itself readable, through an eventfd of the shim's in the kernel's set
 * (made at the first such change), and the waiter looks again. Its event
 * carries wake_magic, and no call returns it to the program. A program
 * whose threads do not share an instance (redis, nginx, memcached: a set
 * each) never pays the write. */
static uint64_t wake_magic;
static void ep_poke(struct fdent *ee, int epfd, int nest);

/* ep_wake wakes the threads waiting on instance epfd (entry ee), if any,
 * after a change of its members; under mu. */
static void ep_wake(struct fdent *ee, int epfd)
{
	/* The change is visible before the count is read: a waiter counts
	 * itself before it looks at the members (ep_waiting). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!__atomic_load_n(&ee->waiters, __ATOMIC_SEQ_CST))
		return;
	ep_poke(ee, epfd, 0);
}

/* ep_poke makes instance epfd (entry ee) readable in the kernel, through
 * its wake-up eventfd (made at the first poke); for a set that holds it
 * (nest), noted, so that a look that finds it not ready drains it
 * (ep_peek). Under mu. */
static void ep_poke(struct fdent *ee, int epfd, int nest)
{
	int fd = ee->wake_fd1 - 1;
	if (fd < 0) {
		while (!wake_magic)
			wake_magic = ((uint64_t)now_ns() << 20 ^ (uint64_t)getpid() << 8 ^ (uintptr_t)&wake_magic) | 1ULL << 63;
		fd = fd_high(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
		struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = wake_magic};
		if (fd < 0 || real_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			debugf("epoll %d: no wake-up (%s): its waiters see a new member, and the sets that hold it "
			       "an accelerated member ready, at their timeout", epfd, strerror(errno));
			if (fd >= 0)
				real_close(fd);
			return;
		}
		ee->wake_fd1 = fd + 1;
	}
	uint64_t one = 1;
	if (real_write(fd, &one, sizeof one) < 0)
		debugf("epoll %d: its wake-up: %s", epfd, strerror(errno));
	else if (nest)
		ee->poked = 1;
}

/* ep_waiting counts a thread into (+1) or out of (-1) the waiters of
 * instance ee (a K_EPOLL entry). */
static void ep_waiting(struct fdent *ee, int d)
{
	__atomic_add_fetch(&ee->waiters, (uint32_t)d, __ATOMIC_SEQ_CST);
}

/* ep_unwait is ep_waiting(ee, -1), for a cancelled wait (run_undo). */
static void ep_unwait(void *ee) { ep_waiting(ee, -1); }

/* ep_unwake takes the wake-ups out of the r events a kernel wait on
 * instance ee gave; the count left. */
static int ep_unwake(struct fdent *ee, struct epoll_event *ev, int r)
{
	int fd = ee && ee->kind == K_EPOLL ? ee->wake_fd1 - 1 : -1;
	if (fd < 0 || r <= 0)
		return r;
	for (int i = 0; i < r; i++) {
		if (ev[i].data.u64 != wake_magic)
			continue;
		uint64_t v;
		if (real_read(fd, &v, sizeof v) < 0 && errno != EAGAIN)
			debugf("its wake-up: %s", strerror(errno));
		ev[i--] = ev[--r];
	}
	return r;
}

static struct ep *ep_of(int epfd)
{
	struct fdent *e = ent(epfd);
	if (!e)
		return NULL;
	if (e->kind != K_EPOLL) {
		memset(e, 0, sizeof *e);
		set_kind(e, K_EPOLL);
	}
	return e->ep;
}

void ep_free(struct ep *ep)
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
static int *epfds;
static int nepfds;
static int capepfds;
int ep_lists;

/* one_more makes room in *arr (of *cap entries of size bytes, n in use)
 * for one more, doubling it (from first); -1 (errno ENOMEM) if memory is
 * short, the array as it was. */
static int one_more(void *arr, int *cap, int n, size_t size, int first)
{
	if (n < *cap)
		return 0;
	int c = *cap ? 2 * *cap : first;
	void *g = realloc(*(void **)arr, c * size);
	if (!g) {
		errno = ENOMEM;
		return -1;
	}
	*(void **)arr = g;
	*cap = c;
	return 0;
}

static int epfds_add(int fd)
{
	for (int i = 0; i < nepfds; i++)
		if (epfds[i] == fd)
			return 0;
	if (one_more(&epfds, &capepfds, nepfds, sizeof *epfds, 16) < 0)
		return -1;
	epfds[nepfds++] = fd;
	__atomic_store_n(&ep_lists, 1, __ATOMIC_RELAXED);
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

/* ep_find_h is the index of a member whose handle is h, whatever its fd;
 * -1 if none is. */
static int ep_find_h(const struct ep *ep, int h)
{
	if (!ep)
		return -1;
	if (!ep->multi)
		return (unsigned)h < (unsigned)ep->nhidx && ep->hidx[h] ? ep->hidx[h] - 1 : -1;
	for (int i = 0; i < ep->n; i++)
		if (ep->items[i].h == h)
			return i;
	return -1;
}

/* epoll_forget takes fd (handle h) out of every instance's list. With
 * last, the socket's last fd in the process, all its registrations go;
 * while another fd (a dup) names the socket, the one fd made stays, its
 * fd EP_NOFD, as the kernel's registration stays while its file is open
 * (epoll(7)): it reports events, and no epoll_ctl reaches it. */
void epoll_forget(int fd, int h, int last)
{
	int epfd;
	for (int i = 0; i < nepfds; i++) {
		struct ep *ep = ep_next_live(&i, &epfd);
		int j;
		if (!last) {
			if ((j = ep_find(ep, fd, h)) >= 0)
				ep->items[j].fd = EP_NOFD;
			continue;
		}
		for (int n = ep ? ep->n : 0; n > 0 && (j = ep_find_h(ep, h)) >= 0; n--)
			ep_remove(ep, j);
	}
}

/* epoll_to_kernel moves fd's registrations in the instances' lists of
 * accelerated members into the kernel's sets (fd is the kernel's now),
 * and those of the socket (handle h) that outlived their fd (EP_NOFD),
 * on fd, the kernel's name for the socket. */
void epoll_to_kernel(int fd, int h)
{
	int epfd;
	for (int i = 0; i < nepfds; i++) {
		struct ep *ep = ep_next_live(&i, &epfd);
		for (int n = ep ? ep->n : 0, j; n > 0; n--) {
			if ((j = ep_find(ep, fd, h)) < 0 && (j = ep_find(ep, EP_NOFD, h)) < 0)
				break;
			struct epoll_event ev = {.events = ep->items[j].events, .data = ep->items[j].data};
			if (real_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && (errno != EEXIST || ep->items[j].fd == EP_NOFD))
				debugf("fd %d: into epoll %d%s: %s", fd, epfd,
				       ep->items[j].fd == EP_NOFD ? " (for a registration that outlived its fd)" : "",
				       strerror(errno));
			ep_remove(ep, j);
		}
	}
}

static int note_epoll(int r)
{
	struct fdent *e = ent(r);
	if (e) {
		table_lock();
		memset(e, 0, sizeof *e);
		set_kind(e, K_EPOLL);
		e->epgen = ++epoll_gen;
		table_unlock();
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
static int nkregs;
static int capkregs;

static int ep_ctl_locked(struct fdent *ee, int epfd, int op, int fd, struct fdent *fe, struct epoll_event *ev);

/* ---- instances in instances ----------------------------------------
 *
 * An instance in another's kernel set (epoll_ctl of an epoll fd: an
 * event loop embedded in another's) is readable there for its kernel
 * members alone. So a wait on the outer one looks at the inner ones'
 * accelerated members too (ep_peek): when one is ready it makes the
 * inner instance readable in the kernel (ep_poke), and the kernel's set
 * reports it with the program's data; while it blocks their members are
 * armed with its own. The pairs are noted here (under mu), each with its
 * instances' numbers (epgen): one closed, the pair is dropped. */
#define NEST_MAX 16 /* instances in one that a wait looks at */
struct nest {
	int outer, inner;
	uint32_t ogen, igen;
};
static struct nest *nests;
static int nnests, capnests;

/* nest_ctl notes epoll_ctl(outer, op, inner) that the kernel did. */
static void nest_ctl(int outer, int op, int inner)
{
	struct fdent *oe = ent(outer), *ie = ent(inner);
	if (!oe || !ie || oe->kind != K_EPOLL || ie->kind != K_EPOLL || op == EPOLL_CTL_MOD)
		return;
	table_lock();
	int i = 0;
	while (i < nnests && (nests[i].outer != outer || nests[i].inner != inner))
		i++;
	if (op == EPOLL_CTL_DEL) {
		if (i < nnests)
			nests[i] = nests[--nnests];
	} else {
		if (i < nnests || one_more(&nests, &capnests, nnests, sizeof *nests, 8) == 0) {
			nests[i] = (struct nest){outer, inner, oe->epgen, ie->epgen};
			if (i == nnests)
				__atomic_store_n(&nnests, nnests + 1, __ATOMIC_RELAXED);
		} else {
			debugf("epoll %d in epoll %d: not noted (no memory): its accelerated members are not seen there",
			       inner, outer);
		}
	}
	table_unlock();
}

/* nested_ours lists into in (room for NEST_MAX) the instances in outer's
 * set that have accelerated members, dropping the pairs of closed ones;
 * under mu. */
static int nested_ours(int outer, int *in)
{
	int n = 0;
	for (int i = 0; i < nnests;) {
		struct nest *x = &nests[i];
		struct fdent *a = ent(x->outer), *b = ent(x->inner);
		if (!a || !b || a->kind != K_EPOLL || b->kind != K_EPOLL || a->epgen != x->ogen || b->epgen != x->igen) {
			nests[i] = nests[--nnests];
			continue;
		}
		if (x->outer == outer && b->ep && b->ep->n && n < NEST_MAX)
			in[n++] = x->inner;
		i++;
	}
	return n;
}

/* has_nested says whether a wait on outer must look at instances in it. */
static int has_nested(int outer)
{
	if (!__atomic_load_n(&nnests, __ATOMIC_RELAXED) || after_fork || in_core)
		return 0;
	int in[NEST_MAX];
	table_lock();
	int n = nested_ours(outer, in);
	table_unlock();
	return n > 0;
}

/* kreg_ctl is epoll_ctl on a descriptor that is not accelerated: the
 * kernel's, noted if it is a TCP socket the core may take yet. */
static int kreg_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	int r = real_epoll_ctl(epfd, op, fd, ev);
	struct fdent *e = ent(fd), *ee = ent(epfd);
	if (r < 0 || !e || !ee || e->kind != K_TCP || e->tried)
		return r;
	table_lock();
	ep_of(epfd); /* an instance the shim did not see made (inherited) */
	int i = 0;
	while (i < nkregs && (kregs[i].fd != fd || kregs[i].epfd != epfd))
		i++;
	if (op == EPOLL_CTL_DEL || !ev) {
		if (i < nkregs)
			kregs[i] = kregs[--nkregs];
	} else {
		if (i < nkregs || one_more(&kregs, &capkregs, nkregs, sizeof *kregs, 16) == 0) {
			if (i == nkregs)
				nkregs++;
			kregs[i] = (struct kreg){.fd = fd, .epfd = epfd, .epgen = ee->epgen, .ev = *ev};
		} else {
			debugf("fd %d: out of memory to note its registration in epoll %d: "
			       "it stays the kernel's if the socket is accelerated", fd, epfd);
		}
	}
	table_unlock();
	return r;
}

/* kreg_take moves fd's noted registrations into the instances' lists,
 * now that fd is accelerated (entry fe). A listener's stay in the kernel
 * too, for its kernel half (epoll_ctl). Under mu. */
void kreg_take(int fd, struct fdent *fe)
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
		else
			ep_wake(ee, k.epfd);
	}
}

/* kreg_forget drops fd's noted registrations: it is closed, or the
 * kernel keeps it. Under mu. */
void kreg_forget(int fd)
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
		if (op == EPOLL_CTL_MOD && (ep->items[i].events & EPOLLEXCLUSIVE)) {
			errno = EINVAL; /* as the kernel's: made for ADD alone */
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

/* is_epoll: whether epfd, which the shim did not see made (inherited, or
 * not an instance at all), is an epoll instance. 0 with errno as the
 * kernel's epoll_ctl would set it: EBADF (not open), EINVAL. */
static int is_epoll(int epfd)
{
	char path[32], link[32];
	snprintf(path, sizeof path, "/proc/self/fd/%d", epfd);
	ssize_t n = readlink(path, link, sizeof link - 1);
	if (n < 0) {
		errno = real_fcntl(epfd, F_GETFD) < 0 ? EBADF : EINVAL;
		return 0;
	}
	link[n] = 0;
	if (strcmp(link, "anon_inode:[eventpoll]") != 0) {
		errno = EINVAL;
		return 0;
	}
	return 1;
}

/* EP_EXCLUSIVE_OK: the events EPOLLEXCLUSIVE goes with (the kernel's
 * EPOLLEXCLUSIVE_OK_BITS). */
#define EP_EXCLUSIVE_OK (EPOLLIN | EPOLLOUT | EPOLLRDNORM | EPOLLWRNORM | EPOLLERR | EPOLLHUP | EPOLLWAKEUP | EPOLLET | EPOLLEXCLUSIVE)

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct fdent *fe = ours_or_listener(fd);
	struct fdent *ee = ent(epfd);
	CHILD_TAKES_ANY(fd, fe);
	if (!fe && ee && !after_fork) {
		int r = kreg_ctl(epfd, op, fd, ev);
		if (r == 0)
			nest_ctl(epfd, op, fd);
		return r;
	}
	if (!fe || !ee || after_fork)
		return real_epoll_ctl(epfd, op, fd, ev);
	/* The kernel's checks, in its order, that the shim's own list of
	 * accelerated members would not make. */
	if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && !ev) {
		errno = EFAULT;
		return -1;
	}
	if (ee->kind != K_EPOLL && !is_epoll(epfd))
		return -1;
	if ((op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && (ev->events & EPOLLEXCLUSIVE) &&
	    (op == EPOLL_CTL_MOD || (ev->events & ~EP_EXCLUSIVE_OK))) {
		errno = EINVAL;
		return -1;
	}
	if (fe->listening) {
		/* The kernel's half too. */
		int r = real_epoll_ctl(epfd, op, fd, ev);
		if (r < 0)
			return r;
	}
	table_lock();
	int r = ep_ctl_locked(ee, epfd, op, fd, fe, ev);
	if (r == 0 && op != EPOLL_CTL_DEL)
		ep_wake(ee, epfd);
	table_unlock();
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
 * says whether any is a connection (not a listener); *et (unless NULL)
 * whether any is edge-triggered. */
static int ep_members(struct ep *ep, int *hs, int *want, int *et)
{
	int conns = 0;
	for (int j = 0; j < ep->n; j++) {
		hs[j] = ep->items[j].disabled ? 0 : ep->items[j].h;
		want[j] = hs[j] ? from_epoll(ep->items[j].events) : 0;
		if (et && hs[j] && (ep->items[j].events & EPOLLET))
			*et = 1;
		if (hs[j] && !conns) {
			struct fdent *fe = ent(ep->items[j].fd);
			conns = fe && !fe->listening;
		}
	}
	return conns;
}

/* ep_edge_got is what of ready (the events member it asks for that its
 * socket has, whose edge count is edge) a check reports: all of it for a
 * level-triggered member; for an edge-triggered one, only on an edge, as
 * the kernel's: the socket's edge count moved (new data, a connection, a
 * state change, an error) since it was last reported, or the program
 * found it empty (or full) since. */
static uint32_t ep_edge_got(const struct epi *it, uint32_t ready, unsigned edge)
{
	if (!(it->events & EPOLLET) || edge != it->edge_seen)
		return ready;
	struct fdent *fe = ent(it->fd);
	if (fe && fe->rd_eagain == it->rd_seen)
		ready &= ~(EPOLLIN | EPOLLRDNORM | EPOLLRDHUP);
	if (fe && fe->wr_eagain == it->wr_seen)
		ready &= ~(EPOLLOUT | EPOLLWRNORM);
	return ready;
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
		uint32_t got = ep_edge_got(it, ready, edges[j]);
		if (it->events & EPOLLET) {
			struct fdent *fe = ent(it->fd);
			if (ready && full) /* reported now or before: wait for the next edge */
				want[j] = ONL_EDGE;
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
		table_lock();
		struct ep *ep = ee->kind == K_EPOLL ? ee->ep : NULL;
		for (int i = 0; ep && i < ep->n; i++)
			if (ep->items[i].h == hs[j] && ep->items[i].fd != EP_NOFD)
				fd = ep->items[i].fd;
		/* A registration that outlived its fd: another fd names the
		 * socket (this error's path only looks through the table, and
		 * only if some fd does: a member closed since the list was
		 * made, as every connection of a server that takes one a
		 * request is, made each of its waits read the whole table,
		 * 3 MB, about a millisecond). */
		int named = (unsigned)hs[j] < MAX_HANDLES && hfds[hs[j]] > 0;
		for (int i = 0; fd < 0 && named && i < nfdt; i++)
			if (fdt[i].kind == K_OURS && fdt[i].h == hs[j])
				fd = i;
		table_unlock();
		if (fd >= 0 && kernel_took(fd))
			any = 1;
	}
	return any;
}

/* ep_room makes *hs (5 arrays of *room ints: handles, events, wants,
 * scratch, edges) hold len members; -1 if memory is short. */
static int ep_room(int **hs, int *room, int len)
{
	if (len + 1 <= *room)
		return 0;
	int *grown = realloc(*hs, sizeof(int) * 5 * (len + 1));
	if (!grown)
		return -1;
	*hs = grown;
	*room = len + 1;
	return 0;
}

/* ep_arm_level blocks (wait_block) with instance ep's members armed as
 * they are, if none is edge-triggered and the instance is still version
 * ver; wait_block's result, or -2: check all first (edge-triggered
 * members, a change, or memory short). */
static int ep_arm_level(struct fdent *ee, struct ep *ep, unsigned ver, int **hs, int *room, struct wait *w,
			int64_t now, struct pollfd *p, int epfd, const sigset_t *mask)
{
	table_lock();
	int et = 0, conns = 0, k = 0;
	int ok = ee->ep == ep && ep && ep->ver == ver && ep_room(hs, room, ep->n) == 0;
	if (ok) {
		conns = ep_members(ep, *hs, *hs + 2 * *room, &et);
		k = ep->n;
	}
	table_unlock();
	if (!ok || et)
		return -2;
	int *h = *hs, *evs = h + *room, *want = evs + *room;
	return wait_block(w, now, h, want, evs, NULL, k, NULL, p, 1, epfd, conns, mask);
}

/* ---- an instance in a poll or select ----------------------------------
 *
 * The kernel's epoll fd is readable while its set has events to report,
 * and an instance's accelerated members are not in the kernel's set: a
 * poll or select that held the instance (an event loop embedded in
 * another's, as libuv's backend fd or sd-event's in a GLib loop) never
 * saw them, and waited to its timeout. So poll and select look at such
 * an instance's accelerated members themselves (ep_peek), as an
 * epoll_wait on it would, without reporting them, and arm them while
 * they block. */

/* arms_room makes a hold n more entries. */
int arms_room(struct arms *a, int n)
{
	if (a->n + n <= a->cap)
		return 0;
	int cap = a->cap ? a->cap : 16;
	while (cap < a->n + n)
		cap *= 2;
	int **arr[] = {&a->hs, &a->want, &a->evs, (int **)&a->edges};
	for (size_t i = 0; i < sizeof arr / sizeof arr[0]; i++) {
		int *g = realloc(*arr[i], cap * sizeof(int));
		if (!g) {
			errno = ENOMEM;
			return -1;
		}
		*arr[i] = g;
	}
	a->cap = cap;
	return 0;
}

/* arms_append puts k members after a's (handles hs, wants want, edge
 * counts edges, or none), for one wait to arm them all: -1 if memory is
 * short. */
int arms_append(struct arms *a, const int *hs, const int *want, const unsigned *edges, int k)
{
	if (arms_room(a, k) < 0)
		return -1;
	memcpy(a->hs + a->n, hs, k * sizeof(int));
	memcpy(a->want + a->n, want, k * sizeof(int));
	if (edges)
		memcpy(a->edges + a->n, edges, k * sizeof(unsigned));
	else
		memset(a->edges + a->n, 0, k * sizeof(unsigned));
	return 0;
}

/* ep_peek says whether an epoll_wait on instance epfd would report one of
 * its accelerated members now (1), without reporting it: the level-
 * triggered ones ready for an event they ask for, the edge-triggered ones
 * with an edge not reported yet (ep_collect's rules), the one-shot ones
 * not yet reported. If none would (0), it appends to a what a wait is to
 * arm for them: each member's events, or an edge-triggered member's next
 * edge. -1 with errno. spinning: the stack is polled first. */
int ep_peek(int epfd, struct arms *a, int spinning)
{
	static __thread int *hs;
	static __thread int room;
	struct fdent *ee = ent(epfd);
	for (int tries = 0; tries < 8; tries++) {
		table_lock();
		struct ep *ep = ee && ee->kind == K_EPOLL ? ee->ep : NULL;
		int n = ep ? ep->n : 0;
		if (!n || ep_room(&hs, &room, n) < 0 || arms_room(a, n) < 0) {
			table_unlock();
			return n ? -1 : 0;
		}
		int *evs = hs + room, *want = evs + room;
		unsigned *edges = (unsigned *)(want + 2 * room);
		ep_members(ep, hs, want, NULL);
		unsigned ver = ep->ver;
		table_unlock();
		CORE_VOID(core.events(hs, evs, edges, n, spinning));
		table_lock();
		if (ee->kind != K_EPOLL || ee->ep != ep || ep->ver != ver) {
			table_unlock();
			continue; /* the members changed meanwhile */
		}
		int any = 0, at = a->n;
		for (int j = 0; j < n && !any; j++) {
			struct epi *it = &ep->items[j];
			if (it->disabled)
				continue;
			uint32_t ready = to_epoll(evs[j]) & (it->events | EPOLLERR | EPOLLHUP);
			uint32_t got = ep_edge_got(it, ready, edges[j]);
			any = got != 0;
			a->hs[at] = it->h;
			a->want[at] = ready && !got ? ONL_EDGE : from_epoll(it->events);
			a->edges[at++] = edges[j];
		}
		if (!any)
			a->n = at;
		if (!any && ee->poked && !__atomic_load_n(&ee->waiters, __ATOMIC_SEQ_CST)) {
			/* Made readable for a member that is not ready now: the
			 * kernel's look that follows must not see it. (With
			 * threads waiting in it, the eventfd may be their wake-up
			 * too: it stays, and the look may end at once.) */
			uint64_t v;
			real_read(ee->wake_fd1 - 1, &v, sizeof v);
			ee->poked = 0;
		}
		table_unlock();
		return any;
	}
	return 0; /* changing all the while: the caller looks again */
}

/* ep_scratch is do_epoll_wait's scratch, which grows as it goes: freed
 * at its end, or by a cancellation (ep_scratch_free). */
struct ep_scratch {
	int **hs;
	struct arms *arm;
};

static void ep_scratch_free(void *arg)
{
	struct ep_scratch *sc = arg;
	free(*sc->hs);
	free(sc->arm->hs), free(sc->arm->want), free(sc->arm->evs), free(sc->arm->edges);
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
	int spin_tried = timeout_ns == 0 || spin_ns <= 0;
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
	int kstack = 0; /* the last check's events of the stack's */
	struct arms arm = {0}; /* instances in this one's set: what to arm */
	struct ep_scratch sc = {&hs, &arm};
	struct undo u;
	undo_push(&u, ep_scratch_free, &sc);
	for (;;) {
		table_lock();
		ep = ee->ep;
		if (ep && ep->kernel_only >= EP_KERNEL_ONLY)
			spin_tried = 1; /* kernel events alone lately: no spin */
		int full = !ep || ep->full || ep->multi || blocking;
		int logroom = full ? -1 : ep_log_room(ep);
		int len = !ep ? 0 : full ? ep->n : ep->npend + logroom;
		if (ep_room(&hs, &room, len) < 0) {
			table_unlock();
			errno = ENOMEM;
			ret = -1;
			break;
		}
		int *evs = hs + room, *want = evs + room, *later = want + room;
		unsigned *edges = (unsigned *)(later + room);
		int conns = 0, k0 = 0, nmembers = ep ? ep->n : 0;
		if (full && ep) {
			conns = ep_members(ep, hs, want, NULL);
			k0 = ep->n;
		} else if (ep) {
			memcpy(hs, ep->pend, ep->npend * sizeof(int));
			k0 = ep->npend;
		}
		unsigned ver = ep ? ep->ver : 0, seq0 = ep ? ep->seq : 0, seq = seq0;
		table_unlock();
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
		int m = CORE(core.ready(hs, evs, edges, k0, logroom, &seq, &fl));
		if (m < 0) {
			table_lock();
			if (ee->ep == ep && ep)
				ep->full = 1;
			table_unlock();
			continue;
		}
		if (ep_taken_over(ee, hs, evs, m))
			continue; /* those members are the kernel set's now */
		table_lock();
		if (ee->ep != ep || (ep && ep->ver != ver)) {
			table_unlock();
			continue;
		}
		int k = 0, kernel = 1;
		if (ep) {
			k = ep_collect(ep, full, out, max, hs, evs, want, edges, m, later);
			kstack = k;
			kernel = k < max && ((k == 0 && kernel_woke && !blocking && !w.spinning) || ep_kernel_due(ep, w.deadline));
			/* Another thread waiting on the instance read the log
			 * meanwhile: what it took is not in this check. */
			if (ep->seq != seq0)
				ep->full = 1;
			else if (full)
				ep->full = 0;
			ep->seq = seq;
		}
		/* Instances in this one's set, ready for their accelerated
		 * members: readable in the kernel's set now (ep_poke). */
		int inner[NEST_MAX], ni = 0;
		if (__atomic_load_n(&nnests, __ATOMIC_RELAXED))
			ni = nested_ours(epfd, inner);
		table_unlock();
		arm.n = 0;
		for (int i = 0; i < ni && arm.n >= 0; i++) {
			int r = ep_peek(inner[i], &arm, w.spinning);
			if (r > 0) {
				table_lock();
				struct fdent *ie = ent(inner[i]);
				if (ie && ie->kind == K_EPOLL)
					ep_poke(ie, inner[i], 1);
				table_unlock();
				kernel = 1;
			}
			if (r < 0)
				arm.n = -1;
		}
		if (arm.n < 0) {
			ret = -1;
			break;
		}
		if (kernel && k < max) {
			int r;
			while ((r = real_epoll_wait(epfd, out + k, max - k, 0)) < 0 && errno == EINTR)
				;
			if (r < 0) {
				ret = -1;
				break;
			}
			r = ep_unwake(ee, out + k, r);
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
			if (k > 0) {
				table_lock();
				if (ee->ep == ep && ep)
					ep->kernel_only = kstack ? 0 : ep->kernel_only + (ep->kernel_only < EP_KERNEL_ONLY);
				table_unlock();
			}
			break;
		}
		if (!spin_tried) {
			/* The spin slot, claimed without a look (a thread that
			 * does not get it blocks at once, and its check just now
			 * stands); the spinner's next check polls. */
			spin_tried = 1;
			if (CORE(core.try_spin())) {
				w.spinning = 1;
				w.spin_end = now_ns() + spin_ns;
				w.yield_at = 0;
				continue;
			}
		}
		struct pollfd p[4] = {{.fd = epfd, .events = POLLIN}};
		if (arm.n > 0) {
			/* The inner instances' members armed with this one's,
			 * which a full check lists. */
			if (!full) {
				blocking = 1;
				continue;
			}
			if (arms_append(&arm, hs, want, edges, k0) < 0) {
				ret = -1;
				break;
			}
			blocking = 0;
			kernel_woke = wait_block(&w, now, arm.hs, arm.want, arm.evs, arm.edges, arm.n + k0, NULL, p, 1, epfd, 1,
						 mask);
			if (kernel_woke < 0) {
				ret = -1;
				break;
			}
			continue;
		}
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
			/* A level-triggered set arms its members as they are:
			 * the arm checks each (onl_arm), and a member ready
			 * meanwhile ends the wait at once. An edge-triggered
			 * member's arm depends on what the last full check
			 * reported (ep_collect's want): check all first. */
			int r = ep_arm_level(ee, ep, ver, &hs, &room, &w, now, p, epfd, mask);
			if (r == -2) {
				blocking = 1;
				continue;
			}
			if ((kernel_woke = r) < 0) {
				ret = -1;
				break;
			}
			continue;
		}
		blocking = 0;
		if ((kernel_woke = wait_block(&w, now, hs, want, evs, edges, k0, NULL, p, 1, epfd, conns, mask)) < 0) {
			ret = -1;
			break;
		}
	}
	wait_end(&w);
	undo_pop(&u);
	ep_scratch_free(&sc);
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
			CHILD_TAKES_ANY(fd, m);
		}
		return 0;
	}
	return ep_has_members(epfd) && !in_core;
}

/* any_epoll is epoll_wait (how 0: timeout ms), epoll_pwait (1) or
 * epoll_pwait2 (2: timeout t) for timeout_ns (-1: none), through the
 * stack if the instance has accelerated members, else the kernel's (see
 * kwait), counted among its waiters: a member another thread adds
 * meanwhile wakes it (ep_wake), and it goes on through the stack for the
 * time left. */
static int any_epoll(int epfd, struct epoll_event *ev, int max, int ms, const struct timespec *t, int64_t timeout_ns,
		     const sigset_t *mask, int how)
{
	struct fdent *ee = ent(epfd);
	int counted = timeout_ns != 0 && ee && ee->kind == K_EPOLL;
	struct undo u;
	cancel_off();
	if (counted) {
		ep_waiting(ee, 1);
		undo_push(&u, ep_unwait, ee);
	}
	int64_t end = timeout_ns; /* > 0: set at the first kernel wait */
	struct kwait k;
	int r;
	for (int again = 0;; again = 1) {
		int64_t left = timeout_ns;
		if (again && end > 0) {
			left = end - now_ns();
			if (left < 0)
				left = 0;
		}
		if (ep_has_ours(epfd) || has_nested(epfd)) {
			r = do_epoll_wait(epfd, ev, max, left, mask);
			break;
		}
		if (!again) {
			/* The clock is read here only: the stack's wait above
			 * keeps its own deadline. */
			kwait_begin(&k, timeout_ns);
			if (timeout_ns > 0)
				end = k.end > 0 ? k.end : now_ns() + timeout_ns;
		}
		struct timespec ts;
		if (again) {
			ms = ns_ms(left);
			t = ns_ts(left, &ts);
		}
		CANCEL_POINT(r = how == 2 ? real_epoll_pwait2(epfd, ev, max, t, mask)
				 : how == 1 ? real_epoll_pwait(epfd, ev, max, ms, mask)
					    : real_epoll_wait(epfd, ev, max, ms));
		int64_t unused;
		if (kwait_again(&k, r, &unused))
			continue;
		if (r <= 0)
			break;
		int n = ep_unwake(ee, ev, r);
		if (n > 0 || left == 0 || (end > 0 && now_ns() >= end)) {
			r = n;
			break;
		}
		/* Only a wake-up: the members changed. */
	}
	int err = errno;
	if (counted) {
		undo_pop(&u);
		ep_waiting(ee, -1);
	}
	cancel_on();
	errno = err;
	return r;
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	return any_epoll(epfd, ev, max, timeout, NULL, timeout < 0 ? -1 : timeout * 1000000LL, NULL, 0);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout, const sigset_t *mask)
{
	return any_epoll(epfd, ev, max, timeout, NULL, timeout < 0 ? -1 : timeout * 1000000LL, mask, 1);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max, const struct timespec *t, const sigset_t *mask)
{
	return any_epoll(epfd, ev, max, 0, t, ts_ns(t), mask, 2);
}

