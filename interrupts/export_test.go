package interrupts

// DirectGraceForTest is DirectGrace, for the external tests.
const DirectGraceForTest = DirectGrace

// SetBeforeTimersOnly sets (nil: clears) the hook the Sleeper runs as it
// is about to sleep for the timers alone, before it says it sleeps.
func SetBeforeTimersOnly(f func()) {
	if f == nil {
		beforeTimersOnly.Store(nil)
		return
	}
	beforeTimersOnly.Store(&f)
}
