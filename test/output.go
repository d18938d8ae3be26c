package test

import (
	"bytes"
	"sync"
)

// LimitedBuffer keeps the first 4 KiB written to it: a helper process's
// standard error, kept for the error message if it fails. It is safe for
// concurrent use.
type LimitedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (w *LimitedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := 4096 - len(w.b); room > 0 {
		w.b = append(w.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// String is what was kept, without surrounding white space.
func (w *LimitedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(bytes.TrimSpace(w.b))
}
