package sockets

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
)

// The log goes to standard error, or the file ONLOAD_LOG_FILE names, at
// the level ONLOAD_LOG sets (error by default): debug says what was not
// accelerated and why.
var (
	logLevelVar = new(slog.LevelVar)
	logger      atomic.Pointer[slog.Logger]
)

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: logLevelVar}))
}

// logFile is the log's writer when ONLOAD_LOG_FILE names a file, in a Go
// program (the LD_PRELOAD shim's core writes through the interposer,
// which keeps the file open: SetLogOutput): each line is appended with a
// file opened for it (O_APPEND: whole lines, in the order written,
// whichever process of the program writes them; no descriptor kept for
// the program to close). A line the file refuses goes to standard error,
// the first with why.
type logFile struct {
	path string
	told atomic.Bool
}

func (f *logFile) Write(b []byte) (int, error) {
	w, err := os.OpenFile(f.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err == nil {
		_, err = w.Write(b)
		w.Close()
		if err == nil {
			return len(b), nil
		}
	}
	if !f.told.Swap(true) {
		fmt.Fprintf(os.Stderr, "onload: ONLOAD_LOG_FILE=%s: %v; the log goes to standard error\n", f.path, err)
	}
	return os.Stderr.Write(b)
}

const (
	levelDebug = slog.LevelDebug
	levelInfo  = slog.LevelInfo
	levelError = slog.LevelError
)

func init() {
	logLevelVar.Set(logLevel(strings.TrimSpace(os.Getenv("ONLOAD_LOG"))))
	logger.Store(newLogger(os.Stderr))
	if p := strings.TrimSpace(envGetenv()("ONLOAD_LOG_FILE")); p != "" { // none in secure mode
		SetLogOutput(&logFile{path: p})
	}
}

// SetLogOutput sends the log to w, in place of standard error or
// ONLOAD_LOG_FILE's file, each line naming the process (pid=): the
// LD_PRELOAD shim's core gives it the interposer's writer, which holds
// the log file open from the process's start.
func SetLogOutput(w io.Writer) {
	logger.Store(newLogger(w).With("pid", os.Getpid()))
}

func logf(level slog.Level, format string, args ...any) {
	if l := logger.Load(); l.Enabled(nil, level) {
		l.Log(nil, level, "onload: "+fmt.Sprintf(format, args...))
	}
}

// logFallback says that a call went to the standard library, and why.
func logFallback(op, network, address, why string) {
	logf(levelDebug, "%s %s %s: not accelerated (%s); using the kernel", op, network, address, why)
}
