//go:build race

package stack

import "sync/atomic"

// The stack lock lives in mmapped memory, where the race detector does not
// see its atomics. Under -race, taking and releasing the lock also touch
// a word in the Go heap with atomics, which the detector does see, so that
// it knows what the lock orders.
func raceAcquire(hb *uint32) { atomic.AddUint32(hb, 1) }
func raceRelease(hb *uint32) { atomic.AddUint32(hb, 1) }
