// Package timers will be a hashed timer wheel living in the stack image:
// arming and cancelling are memory writes, no system calls; the poll loop
// runs due timers and a sleeper sleeps until the next deadline.
//
// Not implemented yet: a placeholder that fixes the layout.
package timers
