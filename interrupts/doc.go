// Package interrupts is the spin / arm / sleep / wake policy of lazy
// interrupt enabling (seed 001, "lazy interrupt enabling"; seed 000, claim
// 17: interrupts only while the application is suspended).
//
// While any goroutine polls the stack, there are no interrupts: the rings
// are read with plain loads. A goroutine with nothing to do spins for a
// while (Policy.Spin), then parks on its socket. One goroutine per stack,
// the Sleeper, stands in for the interrupt service routine: when nobody
// else is in the stack it polls it one last time, arms the interrupt
// (Source.Arm: for an AF_XDP stack a plain store to the steering
// program's mmapped control word), re-checks the rings, and sleeps until
// the interrupt fires, the next timer is due, or a goroutine parks and
// needs it. It does not arm if the stack is already armed, if another
// thread holds or waits for the stack lock, or if its last poll woke
// sleepers: in each case someone else will be in the stack soon.
//
// Waiting costs no OS thread: parked goroutines wait on channels, and the
// Sleeper waits on a channel fed by the runtime's network poller (the
// wake-event ring buffer) or by the in-memory NIC.
package interrupts
