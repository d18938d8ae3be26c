package sockets

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNoStackSaidOnce: a process whose configuration asks for
// acceleration in so many words (ONLOAD_DAEMON=require, as `onloadd run
// -n` sets it) and gets none says why as an error, which the default
// ONLOAD_LOG shows, with the fix, once: the attempts after retryAfter say
// it at info. Before, every such failure was said at info, and a user
// whose onloadd was not running saw nothing while the program ran on the
// kernel. The designed fallback (auto) stays at info.
func TestNoStackSaidOnce(t *testing.T) {
	var buf bytes.Buffer
	old := logger.Load()
	logger.Store(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	def.mu.Lock()
	saved := def.told
	def.err, def.told = "", nil
	def.mu.Unlock()
	t.Cleanup(func() {
		logger.Store(old)
		def.mu.Lock()
		def.err, def.told = "", saved
		def.mu.Unlock()
	})
	t.Setenv("ONLOAD_DAEMON", "require")
	t.Setenv("ONLOAD_DAEMON_SOCKET", filepath.Join(t.TempDir(), "none.sock"))
	t.Setenv("ONLOAD_INTERFACE", "lo")
	for i := range 2 {
		s, why := acquire(nil)
		if s != nil {
			s.release()
			t.Fatal("a stack without onloadd under ONLOAD_DAEMON=require")
		}
		if !strings.Contains(why, "onloadd is not running") || !strings.Contains(why, "onloadd serve") {
			t.Fatalf("attempt %d: the reason %q does not say that onloadd is not running and how to start it", i+1, why)
		}
		def.mu.Lock()
		def.errAt = time.Now().Add(-2 * retryAfter) // the next attempt tries again
		def.mu.Unlock()
	}
	log := buf.String()
	if n := strings.Count(log, "level=ERROR"); n != 1 || strings.Count(log, "no accelerated stack") != 2 {
		t.Errorf("two attempts logged %d errors (want 1, the second at info):\n%s", n, log)
	}
	if l := openFailLevel(Config{Daemon: DaemonAuto}); l != levelInfo {
		t.Errorf("the fallback of ONLOAD_DAEMON=auto without an interface named is said at %v, want info", l)
	}
}
