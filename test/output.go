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

// SyncBuffer is a bytes.Buffer that a running command writes to while a
// test reads it: safe for concurrent use, and unbounded.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
