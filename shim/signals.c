/* signals.c: the program's signal handlers beside the core, the signals
 * that end the process, SIGPIPE, and faults (see shim.h). */
#include "shim.h"

/* ---- signals ------------------------------------------------------------ */

/* Synchronous signals (a fault of the thread's own) run their handlers
 * at once; any other the program handles goes through on_signal. */
int held_sig(int sig)
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
	uintptr_t h = (uintptr_t)act->sa_handler;
	return core_base && h >= (uintptr_t)core_base && h < core_end;
}

static void end_by_signal(int sig);
static void close_at_end(int sig);
static void set_default(int sig);
static int ends_process(int sig);
static int catching_ends(void);

/* handler_left: the program's handler that call_handler runs was left by
 * a jump (jump_out) or a cancellation (run_undo), not by its return. */
static void handler_left(void *unused)
{
	(void)unused;
	in_handler--;
}

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
	struct undo u;
	undo_push(&u, handler_left, NULL);
	if (a->sa_flags & SA_SIGINFO)
		a->sa_sigaction(sig, si, uc);
	else if (a->sa_handler != SIG_DFL && a->sa_handler != SIG_IGN)
		a->sa_handler(sig);
	undo_pop(&u);
	in_handler--;
}

/* ---- a handler that jumps out ------------------------------------------
 *
 * A signal handler may leave with siglongjmp (or longjmp), and with it
 * the call its signal interrupted: a program that times its reads out
 * with alarm(2) jumps out of a blocked recv. What that call holds (the
 * socket, the stack's arms, an epoll instance's waiter count; the undo
 * list, as for a cancellation) would be held for ever: the program's
 * close of the socket sent no FIN until the process ended. The jump
 * runs the entries of the frames it discards first, as a cancellation
 * does: those deeper on the stack than the frame it returns to, whose
 * stack pointer is in the jmp_buf (glibc mangles it with the thread's
 * pointer guard). On an alternate signal stack (sigaltstack), the
 * handler's entries are discarded by a jump to the thread's own stack,
 * and a jump within the alternate stack discards nothing below it. */

/* jmp_sp is the stack pointer that env returns to, or 0 where unknown
 * (not x86-64, whose glibc layout this reads: its sixth word, mangled as
 * PTR_MANGLE does, with the guard at %fs:0x30). */
static uintptr_t jmp_sp(struct __jmp_buf_tag *env)
{
#if defined(__x86_64__) && defined(__GLIBC__)
	uintptr_t v = (uintptr_t)env->__jmpbuf[6], guard;
	__asm__("mov %%fs:0x30, %0" : "=r"(guard));
	v = (v >> 0x11) | (v << (64 - 0x11));
	return v ^ guard;
#else
	(void)env;
	return 0;
#endif
}

/* discarded reports whether undo entry u lies in a frame that a jump to
 * stack pointer sp discards; alt is the alternate signal stack, if one
 * is set. */
static int discarded(const struct undo *u, uintptr_t sp, const stack_t *alt)
{
	uintptr_t a = (uintptr_t)u;
	int u_alt = 0, sp_alt = 0;
	if (alt) {
		uintptr_t lo = (uintptr_t)alt->ss_sp, hi = lo + alt->ss_size;
		u_alt = a >= lo && a < hi;
		sp_alt = sp >= lo && sp < hi;
	}
	if (u_alt != sp_alt)
		return u_alt; /* to the thread's stack from the alternate one */
	return a < sp;
}

/* jump_out runs what the frames a jump to env discards hold. */
static void jump_out(struct __jmp_buf_tag *env)
{
	if (!t_undo)
		return;
	uintptr_t sp = jmp_sp(env);
	if (!sp)
		return;
	stack_t ss;
	const stack_t *alt = real_sigaltstack(NULL, &ss) == 0 && !(ss.ss_flags & SS_DISABLE) ? &ss : NULL;
	while (t_undo && discarded(t_undo, sp, alt)) {
		struct undo *u = t_undo;
		t_undo = u->next;
		u->fn(u->arg);
	}
	if (!t_undo && !in_handler && t_coff > 0) {
		/* No call of the shim's is left on the thread: the program's
		 * cancellation state as its outermost call found it. */
		t_coff = 0;
		pthread_setcancelstate(t_cancel_was, NULL);
	}
}

/* The C library's jumps (__longjmp_chk: what a program built with
 * _FORTIFY_SOURCE calls for longjmp), each after jump_out. */
#define JUMP(name)                                                  \
	EXPORT void name(struct __jmp_buf_tag *env, int val)       \
	{                                                           \
		jump_out(env);                                      \
		real_##name(env, val);                              \
		__builtin_unreachable();                            \
	}
JUMP(siglongjmp)
JUMP(longjmp)
JUMP(_longjmp)
JUMP(__longjmp_chk)
#undef JUMP

static void pass_on(int sig, void *uc);

/* on_signal stands in for the program's handlers (Onload defers its
 * signals the same way): on a thread in the core, or holding a lock of
 * the shim's (locks_taking), it only notes the signal, and the thread
 * runs the handler when it leaves (run_held), as if the signal had come
 * a moment later; on a thread of the Go runtime's it passes it on
 * (pass_on); elsewhere it runs it at once. */
static void on_signal(int sig, siginfo_t *si, void *uc)
{
	if (in_core || t_locks) {
		sig_info[sig] = *si;
		sig_held |= 1ull << (sig - 1);
		return;
	}
	if (t_go && si->si_code != SI_TKILL) {
		pass_on(sig, uc);
		return;
	}
	stack_t ss;
	int onstack = real_sigaltstack(NULL, &ss) == 0 && (ss.ss_flags & SS_ONSTACK);
	t_sigstack += onstack;
	call_handler(sig, si, uc);
	t_sigstack -= onstack;
}

/* run_held runs the handlers of the signals held while the thread was in
 * the core, each with the mask it asked for, as the kernel would have. */
void run_held(void)
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
int fault_sig(int sig)
{
	return sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGTRAP || sig == SIGSYS;
}

static uintptr_t core_text[2]; /* [lo, hi): the core's mapping */
static uintptr_t shim_text[2]; /* and ours */

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

/* ---- the Go runtime's threads ------------------------------------------
 *
 * The runtime blocks the program's signals on its threads (they start
 * with the mask load_core gave it) but for those it must see, SIGCHLD and
 * SIGPROF among them (minitSignalMask): a SIGCHLD sent to the process
 * went to whichever thread did not block it, a Go thread as often as not,
 * and the program's handler ran there, beside its main thread, which had
 * the signal blocked. The core makes its threads with pthread_create,
 * from a thread in a call into it (in_core: the loader's, one in a
 * callback that starts a runtime thread) or from a thread of its own
 * (t_go): such a thread is marked as it starts, and a signal that comes
 * to it goes on to the program's threads (pass_on). */
__thread int t_go;

struct go_start {
	void *(*fn)(void *);
	void *arg;
};

static void *go_thread(void *p)
{
	struct go_start st = *(struct go_start *)p;
	free(p);
	t_go = 1;
	return st.fn(st.arg);
}

EXPORT int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
	if (!t_go && !in_core)
		return real_pthread_create(t, attr, fn, arg);
	struct go_start *st = malloc(sizeof *st);
	if (!st)
		return EAGAIN;
	st->fn = fn;
	st->arg = arg;
	int r = real_pthread_create(t, attr, go_thread, st);
	if (r != 0)
		free(st);
	return r;
}

/* pass_on gives a signal that came to a Go thread to the program's
 * threads: that thread blocks it from now on (its mask as the handler
 * returns), and the process is sent it again, for a thread of the
 * program's that does not block it, or to wait till one unblocks it,
 * as the kernel would have done with no Go threads there. postgres's
 * postmaster blocks its signals but in its select; its SIGCHLD handler
 * (which forks) ran on a Go thread meanwhile, beside its main loop, and
 * its child hung. The second sending is kill's: a handler that reads the
 * siginfo finds the process's own pid there. A signal sent to the thread
 * itself (tgkill: the runtime's own, to a thread of its) is not the
 * process's to pass on. */
static void pass_on(int sig, void *uc)
{
	sigset_t one;
	sigemptyset(&one);
	sigaddset(&one, sig);
	pthread_sigmask(SIG_BLOCK, &one, NULL);
	if (uc)
		sigaddset(&((ucontext_t *)uc)->uc_sigmask, sig);
	kill(getpid(), sig);
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
void catch_ends(void)
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

void uncatch_ends(void)
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

/* ---- sleeps and signal waits ------------------------------------------
 *
 * The kernel never restarts these calls after a handler (signal(7)):
 * they fail with EINTR. Once the core is loaded the Go runtime handles
 * SIGURG, which the kernel ignores at its default (struct kwait in
 * shim.h): a sleep or wait it ended with none of the program's handlers
 * run on the thread (t_handled) goes on for the time it has left, as it
 * would have on the kernel. sleep and usleep are glibc's own, on our
 * nanosleep (glibc's call its nanosleep within libc, which we do not
 * see). sigwaitinfo is glibc's sigtimedwait without a timeout, within
 * libc: it is ours for the same reason. */

EXPORT int nanosleep(const struct timespec *req, struct timespec *rem)
{
	unsigned handled = t_handled;
	struct timespec left;
	int r;
	while ((r = real_nanosleep(req, &left)) < 0 && core_signal_only(errno, handled))
		req = &left;
	if (r < 0 && errno == EINTR && rem)
		*rem = left;
	return r;
}

/* clock_nanosleep returns its error, not -1 and errno. */
EXPORT int clock_nanosleep(clockid_t clock, int flags, const struct timespec *req, struct timespec *rem)
{
	unsigned handled = t_handled;
	int abs = flags & TIMER_ABSTIME;
	struct timespec left;
	int r;
	while ((r = real_clock_nanosleep(clock, flags, req, abs ? NULL : &left)) != 0 && core_signal_only(r, handled))
		if (!abs)
			req = &left;
	if (r == EINTR && !abs && rem)
		*rem = left;
	return r;
}

/* sleep returns the whole seconds left when a handler ended it, as
 * glibc's. */
EXPORT unsigned int sleep(unsigned int seconds)
{
	int saved = errno;
	struct timespec ts = {.tv_sec = seconds};
	if (nanosleep(&ts, &ts) < 0)
		return (unsigned int)ts.tv_sec;
	errno = saved;
	return 0;
}

EXPORT int usleep(useconds_t us)
{
	struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (long)(us % 1000000) * 1000};
	return nanosleep(&ts, NULL);
}

/* pause and sigsuspend return once a handler of the program's ran. */
EXPORT int pause(void)
{
	unsigned handled = t_handled;
	int r;
	while ((r = real_pause()) < 0 && core_signal_only(errno, handled))
		;
	return r;
}

EXPORT int sigsuspend(const sigset_t *mask)
{
	unsigned handled = t_handled;
	int r;
	while ((r = real_sigsuspend(mask)) < 0 && core_signal_only(errno, handled))
		;
	return r;
}

EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *timeout)
{
	struct kwait k;
	kwait_begin(&k, ts_ns(timeout));
	int r;
	int64_t left;
	struct timespec ts;
	while ((r = real_sigtimedwait(set, info, timeout)) < 0 && kwait_again(&k, r, &left))
		timeout = ns_ts(left, &ts);
	return r;
}

EXPORT int sigwaitinfo(const sigset_t *set, siginfo_t *info)
{
	return sigtimedwait(set, info, NULL);
}
