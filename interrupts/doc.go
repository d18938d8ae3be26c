// Package interrupts is the spin / arm / sleep / wake policy of lazy
// interrupt enabling (seed 001, "lazy interrupt enabling"; seed 000, claim
// 17: interrupts only while the application is suspended).
//
// While any goroutine polls the stack, there are no interrupts: the rings
// are read with plain loads. One goroutine per stack may spin (TrySpin);
// the others park at once. One goroutine per stack, the Sleeper, stands in
// for the interrupt service routine: when nobody else attends the stack it
// polls it one last time, arms the interrupt (Source.Arm: for an AF_XDP
// stack the steering program's armed flag, and the socket's readiness,
// which the kernel signals once a frame is in the RX ring), re-checks the
// rings, and sleeps until the interrupt fires, the next timer is due, or
// a goroutine parks and needs it. It does not arm if another thread holds
// or waits for the stack lock, if a goroutine spins, or if its last poll
// woke sleepers: in each case someone else will be in the stack soon. It
// watches instead, and polls itself if nobody has for Policy.Watch.
//
// Waiting costs no OS thread: parked goroutines wait on channels, and the
// Sleeper waits on a channel fed by the runtime's network poller (the
// sockets' readiness) or by the in-memory NIC.
//
// Threads outside Go (the LD_PRELOAD shim's) may block on the interrupt
// themselves and poll when it fires (ParkDirect): the kernel then wakes
// the thread that will use the frame, one wake-up where the Sleeper's
// path takes three. Meanwhile the Sleeper attends the timers alone.
package interrupts
