package sockets

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// The log goes to standard error at the level ONLOAD_LOG sets (error by
// default): debug says what was not accelerated and why.
var (
	logLevelVar = new(slog.LevelVar)
	logger      = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevelVar}))
)

const (
	levelDebug = slog.LevelDebug
	levelInfo  = slog.LevelInfo
	levelError = slog.LevelError
)

func init() {
	logLevelVar.Set(logLevel(strings.TrimSpace(os.Getenv("ONLOAD_LOG"))))
}

func logf(level slog.Level, format string, args ...any) {
	if logger.Enabled(nil, level) {
		logger.Log(nil, level, "onload: "+fmt.Sprintf(format, args...))
	}
}

// logFallback says that a call went to the standard library, and why.
func logFallback(op, network, address, why string) {
	logf(levelDebug, "%s %s %s: not accelerated (%s); using the kernel", op, network, address, why)
}
