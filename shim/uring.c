/* uring.c: io_uring instances beside the stack (see shim.h).
 *
 * What a ring does on a socket's fd (an accept, a send, a poll submitted
 * through it) passes the interposer by and reaches the fd's kernel
 * socket: for an accelerated socket, the port's reservation, which has
 * no connection (a send failed with EPIPE, an accept waited for ever).
 * So a process with a ring keeps its sockets in the kernel, unless
 * ONLOAD_IO_URING=accelerate (for rings that do file I/O only):
 *
 * - a ring open as the stack would load (uring_keeps_kernel, asked by
 *   load_core): the core does not load;
 * - a ring made after the core loaded, through liburing's calls, which
 *   the interposer sees (io_uring_queue_init and its kin,
 *   io_uring_setup): the process's accelerated connections are handed
 *   over to the kernel (to_kernel), its listeners' ports go to their
 *   kernel sockets (onl_retire_listener), and its later sockets stay the
 *   kernel's (leave_stack). A connection the stack's listener had queued
 *   before is taken by the C library's accept, not the ring's, and goes
 *   to the kernel as it is accepted.
 *
 * - a ring made after the core loaded with the system call through the
 *   C library's syscall(2), as a program that makes its own system calls
 *   does (Rust's io-uring crate), the same.
 *
 * liburing makes its system calls itself: a ring made by a liburing
 * linked into the program, or with the system call's own instruction,
 * is not seen until the next load, and its operations on accelerated
 * sockets fail as above. */
#include "shim.h"

/* uring_accelerate: ONLOAD_IO_URING=accelerate, the user's word that the
 * process's rings do not touch its sockets. */
static int uring_accelerate(void)
{
	const char *v = getenv("ONLOAD_IO_URING");
	return v && !strcmp(v, "accelerate");
}

/* uring_in finds an io_uring instance among the fds in open (a bit an
 * fd, as load_core's open_fds): its number, or -1. */
static int uring_in(const uint8_t *open)
{
	for (int fd = 0; open && fd < nfdt; fd++) {
		if (!(open[fd / 8] & (1 << (fd % 8))))
			continue;
		char path[64], link[32];
		snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
		ssize_t n = readlink(path, link, sizeof link - 1);
		if (n > 0 && (link[n] = 0, !strcmp(link, "anon_inode:[io_uring]")))
			return fd;
	}
	return -1;
}

int uring_keeps_kernel(const uint8_t *open)
{
	if (uring_accelerate())
		return 0;
	int fd = uring_in(open);
	if (fd < 0)
		return 0;
	logf_("fd %d is an io_uring instance, whose operations the interposer cannot see: this process's sockets "
	      "use the kernel (ONLOAD_IO_URING=accelerate accelerates them, for rings that do file I/O only)", fd);
	return 1;
}

/* uring_made: the program made a ring (how: the call) after the core
 * loaded. Its accelerated sockets go to the kernel, once. */
static void uring_made(const char *how)
{
	if (core_state != 1 || uring_accelerate())
		return;
	char what[160];
	snprintf(what, sizeof what, "the program made an io_uring instance (%s), whose operations the interposer cannot see",
		 how);
	leave_stack("for the io_uring instance the program made", what,
		    "ONLOAD_IO_URING=accelerate accelerates them, for rings that do file I/O only", 1, 1);
}

/* The interposers, of liburing's calls that make a ring. Their argument
 * types are liburing's, opaque here: the interposer passes them on. */
struct io_uring;
struct io_uring_params;

#define REAL_URING(name, type) \
	static __typeof__(type) real_; \
	if (!real_) \
		*(void **)&real_ = dlsym(RTLD_NEXT, name); \
	if (!real_) \
		return -ENOSYS

EXPORT int io_uring_queue_init(unsigned entries, struct io_uring *ring, unsigned flags)
{
	REAL_URING("io_uring_queue_init", int (*)(unsigned, struct io_uring *, unsigned));
	int r = real_(entries, ring, flags);
	if (r >= 0)
		uring_made("io_uring_queue_init");
	return r;
}

EXPORT int io_uring_queue_init_params(unsigned entries, struct io_uring *ring, struct io_uring_params *p)
{
	REAL_URING("io_uring_queue_init_params", int (*)(unsigned, struct io_uring *, struct io_uring_params *));
	int r = real_(entries, ring, p);
	if (r >= 0)
		uring_made("io_uring_queue_init_params");
	return r;
}

EXPORT int io_uring_queue_init_mem(unsigned entries, struct io_uring *ring, struct io_uring_params *p, void *buf,
				   size_t size)
{
	REAL_URING("io_uring_queue_init_mem",
		   int (*)(unsigned, struct io_uring *, struct io_uring_params *, void *, size_t));
	int r = real_(entries, ring, p, buf, size);
	if (r >= 0)
		uring_made("io_uring_queue_init_mem");
	return r;
}

/* liburing's own system-call wrapper: a ring's fd, or -errno (liburing
 * 2.3's io_uring_setup returns the kernel's result as it is). */
EXPORT int io_uring_setup(unsigned entries, struct io_uring_params *p)
{
	REAL_URING("io_uring_setup", int (*)(unsigned, struct io_uring_params *));
	int r = real_(entries, p);
	if (r >= 0)
		uring_made("io_uring_setup");
	return r;
}

/* The C library's syscall(2): a ring made through it is seen as
 * liburing's are. Every other call passes on as it came (six words: the
 * most a system call takes, as the C library's own reads them), errno
 * as the call left it. */
EXPORT long syscall(long nr, ...)
{
	static long (*real_)(long, ...);
	if (!real_)
		*(void **)&real_ = dlsym(RTLD_NEXT, "syscall");
	if (!real_) {
		errno = ENOSYS;
		return -1;
	}
	va_list ap;
	va_start(ap, nr);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
	long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
	va_end(ap);
	long r = real_(nr, a, b, c, d, e, f);
	if (nr == SYS_io_uring_setup && r >= 0) {
		int saved = errno;
		uring_made("syscall(SYS_io_uring_setup)");
		errno = saved;
	}
	return r;
}
