/* poll.c: poll and select (see shim.h). */
#include "shim.h"

/* ---- poll and select ----------------------------------------------- */

/* A wait on the kernel's fds alone: see struct kwait in shim.h. */

int64_t ts_ns(const struct timespec *t)
{
	return t ? t->tv_sec * 1000000000LL + t->tv_nsec : -1;
}

/* kwait_again reports whether the wait that returned r goes again, and
 * for how long (*left_ns; -1 for ever). */
int kwait_again(struct kwait *k, int r, int64_t *left_ns)
{
	if (r >= 0 || !core_signal_only(errno, k->handled))
		return 0;
	int64_t left = k->end > 0 ? k->end - now_ns() : k->end;
	*left_ns = k->end < 0 ? -1 : left > 0 ? left : 0;
	return 1;
}

int ns_ms(int64_t ns)
{
	return ns < 0 ? -1 : ns >= INT_MAX * 1000000LL ? INT_MAX : (int)((ns + 999999) / 1000000);
}

struct timespec *ns_ts(int64_t ns, struct timespec *ts)
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
		CHILD_TAKES_ANY(fds[i].fd, e);
		if (e || ((fds[i].events & (POLLIN | POLLRDNORM)) && ep_has_members(fds[i].fd)))
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
			CHILD_TAKES_ANY(fd, e);
			any |= e != NULL || (r && FD_ISSET(fd, r) && ep_has_members(fd));
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
	int rc = wait_poll_sel(p, k, timeout_ns, mask, 1);
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
	int64_t tmo = t ? t->tv_sec * 1000000000LL + t->tv_usec * 1000LL : -1, start = t ? now_ns() : 0;
	int ret = do_select(n, r, w, x, tmo, NULL);
	if (t) {
		/* As Linux's select, the time left goes back in *t. */
		int64_t left = tmo - (now_ns() - start);
		left = left > 0 ? left : 0;
		*t = (struct timeval){.tv_sec = left / 1000000000LL, .tv_usec = left % 1000000000LL / 1000};
	}
	return ret;
}

EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *x, const struct timespec *t, const sigset_t *mask)
{
	if (!select_ours(n, r, w, x))
		return kernel_pselect(n, r, w, x, t, mask);
	return do_select(n, r, w, x, ts_ns(t), mask);
}

