package main

import "testing"

// TestThreadProcs: the processors beyond the CPUs' follow the live
// threads up in powers of two and down only when the threads fall to an
// eighth of them, never below minThreadProcs once raised past it.
func TestThreadProcs(t *testing.T) {
	extra, changes := 0, 0
	step := func(n int) {
		t.Helper()
		if want := threadProcs(n, extra); want != extra {
			extra = want
			changes++
		}
		if n > extra {
			t.Fatalf("%d threads with %d processors for them", n, extra)
		}
	}
	// 40 threads start, and end.
	for n := 1; n <= 40; n++ {
		step(n)
	}
	if extra != 64 || changes != 7 {
		t.Fatalf("40 threads: %d processors after %d changes; want 64 after 7 (1, 2, 4, 8, 16, 32, 64)", extra, changes)
	}
	for n := 39; n >= 1; n-- {
		step(n)
	}
	if extra != minThreadProcs {
		t.Fatalf("one thread left of 40: %d processors; want %d", extra, minThreadProcs)
	}
	// A thread a connection, one after another: nothing changes.
	changes = 0
	for range 100 {
		step(2)
		step(1)
	}
	if changes != 0 {
		t.Fatalf("threads that come and go one at a time changed GOMAXPROCS %d times", changes)
	}
	// Threads that come and go between 8 and 17 (python's http.server
	// with 20 connections): no change once raised.
	changes = 0
	for range 100 {
		step(17)
		step(8)
	}
	if changes > 1 {
		t.Fatalf("threads between 8 and 17 changed GOMAXPROCS %d times", changes)
	}
}
