/* limits.c: RLIMIT_AS beside the Go core (see shim.h).
 *
 * The core takes about 1.7 GiB of address space as it loads (the Go
 * runtime's reservations, the stack's memory), none of it the program's.
 * A program that limits its own address space (vsftpd's session
 * processes set RLIMIT_AS to 200 MiB, to bound what a client can make
 * them allocate) would then have no room left: on the kernel vsftpd
 * works, under the shim its forked session's next mmap failed (ENOMEM,
 * "500 OOPS: mmap" at every login). So once the core is in the address
 * space, a limit the program sets is raised by what the core added
 * (as_core: the address space since the core began to load, with room
 * for the Go runtime to grow where it runs), and getrlimit gives the
 * program its own value back. A limit set before the core would load
 * that leaves it no room keeps the sockets in the kernel (as_room): the
 * Go runtime cannot start without its reservations, and would end the
 * process. */
#include "shim.h"

/* CORE_AS_NEED is the address space the core's load needs free under a
 * limit; CORE_AS_GROW, the room left for the Go runtime to grow in a
 * process where it runs. */
#define CORE_AS_NEED (3UL << 30)
#define CORE_AS_GROW (256UL << 20)

static unsigned long as_base; /* the address space as the core began to load; 0 before */
static int prog_set;	      /* the program set RLIMIT_AS since: prog_as is its */
static struct rlimit prog_as;
static pthread_mutex_t as_mu = PTHREAD_MUTEX_INITIALIZER;

/* vm_size is the process's address space in bytes (/proc/self/statm), or
 * 0. */
static unsigned long vm_size(void)
{
	int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	char b[64];
	ssize_t n = real_read(fd, b, sizeof b - 1);
	real_close(fd);
	if (n <= 0)
		return 0;
	b[n] = 0;
	return strtoul(b, NULL, 10) * (unsigned long)sysconf(_SC_PAGESIZE);
}

static rlim_t add_sat(rlim_t v, unsigned long d)
{
	if (v == RLIM_INFINITY || v + d < v || v + d == RLIM_INFINITY)
		return RLIM_INFINITY;
	return v + d;
}

/* as_core is what the core added to the address space, and may still
 * add: 0 before it loaded. */
static unsigned long as_core(void)
{
	if (core_state != 1 || !as_base)
		return 0;
	unsigned long now = vm_size(), d = now > as_base ? now - as_base : 0;
	return after_fork ? d : d + CORE_AS_GROW; /* Go never runs after a fork */
}

/* as_room says whether the core may load under the process's RLIMIT_AS:
 * 1, with as_base set; or 0, said once, and the sockets stay the
 * kernel's. Called by load_core before it loads. */
int as_room(void)
{
	struct rlimit r;
	unsigned long vm = vm_size();
	as_base = vm;
	if (real_getrlimit(RLIMIT_AS, &r) < 0 || r.rlim_cur == RLIM_INFINITY || r.rlim_cur >= vm + CORE_AS_NEED)
		return 1;
	logf_("RLIMIT_AS of %lu MiB (ulimit -v) leaves the stack's core no room: it takes about 1.7 GiB of address "
	      "space, none of it the program's; sockets use the kernel; raise the limit by 3 GiB to accelerate them",
	      (unsigned long)(r.rlim_cur >> 20));
	as_base = 0;
	return 0;
}

/* set_as sets RLIMIT_AS to r for the program, raised by what the core
 * added; the program's value is what getrlimit gives it after. */
static int set_as(const struct rlimit *r)
{
	unsigned long extra = as_core();
	if (!extra || !r || r->rlim_cur > r->rlim_max) /* the kernel's EINVAL for the last */
		return real_setrlimit(RLIMIT_AS, r);
	struct rlimit adj = {add_sat(r->rlim_cur, extra), add_sat(r->rlim_max, extra)}, cur;
	pthread_mutex_lock(&as_mu);
	/* Raising the hard limit takes a privilege the program may not have:
	 * the raise stops at the hard limit it has, where its own value
	 * (which the kernel would refuse above that) stays. */
	if (real_getrlimit(RLIMIT_AS, &cur) == 0 && adj.rlim_max > cur.rlim_max && r->rlim_max <= cur.rlim_max) {
		adj.rlim_max = cur.rlim_max;
		if (adj.rlim_cur > adj.rlim_max)
			adj.rlim_cur = adj.rlim_max;
	}
	int ret = real_setrlimit(RLIMIT_AS, &adj);
	if (ret == 0) {
		prog_as = *r;
		prog_set = 1;
		debugf("RLIMIT_AS %lu MiB set as %lu MiB: the stack's core takes %lu MiB of address space, none of it the program's",
		       (unsigned long)(r->rlim_cur >> 20), (unsigned long)(adj.rlim_cur >> 20), extra >> 20);
	}
	pthread_mutex_unlock(&as_mu);
	return ret;
}

/* get_as is the program's RLIMIT_AS: the value it set, where set_as
 * raised it. */
static int get_as(struct rlimit *r)
{
	pthread_mutex_lock(&as_mu);
	int set = prog_set;
	if (set && r)
		*r = prog_as;
	pthread_mutex_unlock(&as_mu);
	return set ? 0 : real_getrlimit(RLIMIT_AS, r);
}

EXPORT int setrlimit(__rlimit_resource_t res, const struct rlimit *r)
{
	if ((int)res == RLIMIT_AS)
		return set_as(r);
	return real_setrlimit(res, r);
}

EXPORT int setrlimit64(__rlimit_resource_t res, const struct rlimit64 *r)
{
	return setrlimit(res, (const struct rlimit *)r); /* one layout on 64-bit systems */
}

EXPORT int getrlimit(__rlimit_resource_t res, struct rlimit *r)
{
	if ((int)res == RLIMIT_AS)
		return get_as(r);
	return real_getrlimit(res, r);
}

EXPORT int getrlimit64(__rlimit_resource_t res, struct rlimit64 *r)
{
	return getrlimit(res, (struct rlimit *)r);
}

EXPORT int prlimit(pid_t pid, __rlimit_resource_t res, const struct rlimit *nr, struct rlimit *old)
{
	if ((int)res != RLIMIT_AS || (pid != 0 && pid != getpid()))
		return real_prlimit(pid, res, nr, old);
	struct rlimit o;
	if (old && get_as(&o) < 0)
		return -1;
	if (nr && set_as(nr) < 0)
		return -1;
	if (old)
		*old = o;
	return 0;
}

EXPORT int prlimit64(pid_t pid, __rlimit_resource_t res, const struct rlimit64 *nr, struct rlimit64 *old)
{
	return prlimit(pid, res, (const struct rlimit *)nr, (struct rlimit *)old);
}

/* lower_soft_as lowers process pid's soft RLIMIT_AS (0: this process's)
 * to v, if v is below it; the hard limit stays. */
static void lower_soft_as(pid_t pid, rlim_t v)
{
	struct rlimit r;
	if (real_prlimit(pid, RLIMIT_AS, NULL, &r) == 0 && v < r.rlim_cur) {
		r.rlim_cur = v;
		real_prlimit(pid, RLIMIT_AS, &r, NULL);
	}
}

/* as_for_exec gives the program its own soft RLIMIT_AS back for the
 * program it execs, which starts without the core; as_exec_failed raises
 * it again if the exec failed. */
void as_for_exec(void)
{
	if (prog_set)
		lower_soft_as(0, prog_as.rlim_cur);
}

void as_exec_failed(void)
{
	int e = errno; /* the exec's */
	if (prog_set)
		set_as(&prog_as);
	errno = e;
}

/* AS_ENV carries the program's own soft RLIMIT_AS to a program it
 * starts with posix_spawn (as_spawn_env), whose shim sets it as it loads
 * (as_from_env), before the program runs: a shell's first fork (a
 * command substitution) came before the parent's prlimit could reach it
 * (as_for_spawned), and kept the raised limit. */
#define AS_ENV "ONLOAD_RLIMIT_AS"

/* as_spawn_env is envp with AS_ENV set to the program's soft limit, for
 * posix_spawn (free it after), or NULL where the program set none below
 * the limit in force. */
char **as_spawn_env(char *const envp[])
{
	struct rlimit r;
	if (!prog_set || real_getrlimit(RLIMIT_AS, &r) < 0 || prog_as.rlim_cur >= r.rlim_cur)
		return NULL;
	size_t n = 0, k = 0;
	while (envp && envp[n])
		n++;
	char **e = malloc((n + 2) * sizeof *e + sizeof AS_ENV + 24);
	if (!e)
		return NULL;
	char *v = (char *)(e + n + 2);
	snprintf(v, sizeof AS_ENV + 24, AS_ENV "=%llu", (unsigned long long)prog_as.rlim_cur);
	for (size_t i = 0; i < n; i++)
		if (strncmp(envp[i], AS_ENV "=", sizeof AS_ENV) != 0)
			e[k++] = envp[i];
	e[k++] = v;
	e[k] = NULL;
	return e;
}

/* system and popen start their shell with posix_spawn inside the C
 * library, from the process's environment, and give no one its process
 * id: as_environ_enter puts AS_ENV into the process's environment for
 * the call (a copy of environ with it, as_spawn_env's), and
 * as_environ_leave takes it out after, so that the shell's shim sets the
 * program's own limit as it loads. Calls in several threads at once share
 * one copy; the last to leave puts the program's environ back, or, where
 * the program changed its environment in the meantime (its setenv then
 * made an array of its own from the copy), unsets AS_ENV in that one. A
 * shell started without the shim (LD_PRELOAD taken out of the program's
 * environment) keeps the raised limit. */
static pthread_mutex_t env_mu = PTHREAD_MUTEX_INITIALIZER;
static int env_users;		    /* calls between enter and leave */
static char **env_prog, **env_copy; /* the program's environ and the copy in its place; NULL: none */

void as_environ_enter(void)
{
	pthread_mutex_lock(&env_mu);
	if (env_users++ == 0 && (env_copy = as_spawn_env(environ)) != NULL) {
		env_prog = environ;
		environ = env_copy;
	}
	pthread_mutex_unlock(&env_mu);
}

void as_environ_leave(void)
{
	int e = errno; /* the call's */
	pthread_mutex_lock(&env_mu);
	if (--env_users == 0 && env_copy) {
		if (environ == env_copy)
			environ = env_prog;
		else
			unsetenv(AS_ENV);
		free(env_copy);
		env_copy = env_prog = NULL;
	}
	pthread_mutex_unlock(&env_mu);
	errno = e;
}

/* as_from_env sets the soft RLIMIT_AS a parent under the shim passed in
 * AS_ENV (as_spawn_env), as the shim loads, and takes the variable out of
 * the environment: a program this one starts has the limit this one
 * sets. */
void as_from_env(void)
{
	const char *v = getenv(AS_ENV);
	if (!v)
		return;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (*v && !*end && !errno)
		lower_soft_as(0, x);
	unsetenv(AS_ENV);
}

/* as_for_spawned gives a child that posix_spawn made the program's own
 * soft RLIMIT_AS from the parent once it has exec'd (glibc's posix_spawn
 * returns then), where it runs without the shim and AS_ENV means nothing
 * to it: what it maps from then on is held to the program's limit. Its
 * exec's first mappings, and whatever it forked before this, had the
 * raised one. system's and popen's children, whose process ids are out
 * of reach, get the limit through AS_ENV alone (as_environ_enter). */
void as_for_spawned(pid_t pid)
{
	if (pid > 0 && prog_set)
		lower_soft_as(pid, prog_as.rlim_cur);
}
