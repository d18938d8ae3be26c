// Package interrupts will hold the spin / arm / sleep / wake policy of lazy
// interrupt enabling: no interrupts while anyone polls the stack; a thread
// about to sleep arms the stack (bpf.Control.Arm, a plain store), re-checks
// the rings, then sleeps, and the steering program's wake event (or the
// AF_XDP socket's readiness) wakes it.
//
// Not implemented yet: a placeholder that fixes the layout. The mechanism
// it will drive (the armed flag, the wake event ring buffer) is in package
// bpf already.
package interrupts
