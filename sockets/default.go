package sockets

import (
	"log/slog"
	"sync"
	"time"
)

// The process's default stack: made on the first accelerated call from
// the ONLOAD_* variables, closed once no socket uses it (and no closed
// connection still has data or a FIN to deliver), made again when needed.
var def struct {
	mu    sync.Mutex
	s     *Stack
	err   string          // why the last attempt failed
	errAt time.Time       // when; the attempt is not repeated for retryAfter
	told  map[string]bool // reasons said as errors (noStack)
}

// retryAfter is how long a failure to make the default stack is
// remembered before another attempt (each attempt loads and attaches the
// XDP program).
const retryAfter = 5 * time.Second

// reapAfter is how long an unused default stack lives on.
const reapAfter = 250 * time.Millisecond

// acquire returns the stack to use, holding a reference the caller
// releases; nil and the reason when there is none.
func acquire(explicit *Stack) (*Stack, string) {
	if explicit != nil {
		if !explicit.hold() {
			return nil, "the stack is closed"
		}
		return explicit, ""
	}
	def.mu.Lock()
	defer def.mu.Unlock()
	if s := def.s; s != nil && s.hold() {
		return s, ""
	}
	def.s = nil
	if def.err != "" && time.Since(def.errAt) < retryAfter {
		return nil, def.err
	}
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, noStack(err.Error(), levelError)
	}
	if cfg.Disable {
		return nil, "ONLOAD_DISABLE=1"
	}
	s, err := Open(cfg)
	if err != nil {
		return nil, noStack(err.Error(), openFailLevel(cfg))
	}
	s.onIdle = func() { time.AfterFunc(reapAfter, func() { reap(s) }) }
	s.hold()
	def.s, def.err = s, ""
	return s, ""
}

func noStack(why string, level slog.Level) string {
	def.err, def.errAt = why, time.Now()
	if level >= levelError {
		// Said as an error once a reason: the retries after retryAfter
		// find the same, and the user has been told.
		if def.told[why] {
			level = levelInfo
		} else {
			if def.told == nil {
				def.told = map[string]bool{}
			}
			def.told[why] = true
		}
	}
	logf(level, "no accelerated stack: %s; sockets use the kernel", why)
	return why
}

// openFailLevel is how loudly a failed Open of the default stack is
// said. Where the user asked for acceleration in so many words (an
// interface named in ONLOAD_INTERFACE, or ONLOAD_DAEMON=require, which
// `onloadd run -n` sets), the program going on the kernel is a
// configuration to mend: an error, which the default ONLOAD_LOG shows.
// Otherwise (auto: no onloadd, and no privilege for a stack of its own)
// it is the designed fallback, said at info.
func openFailLevel(cfg Config) slog.Level {
	if cfg.Interface != "" || cfg.Daemon == DaemonRequire {
		return levelError
	}
	return levelInfo
}

// reap closes the default stack s if it is still unused.
func reap(s *Stack) {
	def.mu.Lock()
	defer def.mu.Unlock()
	s.mu.Lock()
	busy := s.refs > 0 || s.closed.Load()
	s.mu.Unlock()
	if busy {
		return
	}
	if s.enter() {
		n := s.st.Lingering()
		s.leave()
		if n > 0 {
			time.AfterFunc(reapAfter, func() { reap(s) })
			return
		}
	}
	if def.s == s {
		def.s = nil
	}
	s.Close()
	logf(levelInfo, "stack on %s closed: no socket uses it", s.name())
}

// Finish is for a program about to exit whose sockets are on the
// process's default stack made by the process itself (standalone,
// without onloadd). The kernel closes a process's sockets when it exits
// and goes on delivering what they had still to send; a standalone stack
// ends with the process, and Go runs nothing at exit, so the data still
// in a send buffer and the FIN would be lost. Finish closes every socket
// still open, as the kernel would, and waits until the peers have
// acknowledged what the closed connections had to send and their FIN;
// those still delivering after a moment are handed over to the kernel,
// which finishes them after the process is gone (with CAP_NET_ADMIN, as
// a standalone stack has; without it, the wait is at most timeout):
//
//	func main() {
//		defer sockets.Finish(time.Second)
//		...
//	}
//
// (os.Exit runs no deferred call: call Finish before it.) A stack from
// onloadd is onloadd's to finish, when the process is gone: Finish
// returns at once. It reports the connections left unfinished.
func Finish(timeout time.Duration) error {
	def.mu.Lock()
	s := def.s
	def.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.Finish(timeout)
}
