package daemon

import (
	"time"

	"github.com/xdp-onload/onload/bpf"
	"github.com/xdp-onload/onload/control"
)

// Orphan stacks. When the last process of a stack is gone (it exited,
// crashed or was killed: its control connection closed), onloadd closes
// the sockets it left open as the kernel closes a dead process's
// descriptors (stack.CloseAbandoned) and keeps the stack, its filters and
// its queue while its connections finish: the watcher polls it (the
// process no longer does), so that every byte the application wrote is
// delivered and then FIN, and TIME-WAIT is honoured. The reaper releases
// it when no socket is left.

// orphanMax bounds an orphan's life: connections whose peer neither reads
// nor goes away are given up, as Linux gives up orphans.
const orphanMax = 10 * time.Minute

// reapEvery is how often the reaper looks at the orphans.
const reapEvery = 100 * time.Millisecond

// orphanLocked adopts s, whose last process has gone, or releases it if
// nothing is left to finish or nobody can finish it.
func (d *Daemon) orphanLocked(s *dstack) {
	if d.closed || s.watch == nil || s.watch.err.Load() != nil {
		d.releaseStackLocked(s)
		return
	}
	closed, ok := s.st.CloseAbandoned(100 * time.Millisecond)
	if !ok {
		d.log.Warn("the stack's lock is held by a process that is gone; its connections cannot be finished", "stack", s.id)
		d.releaseStackLocked(s)
		return
	}
	if s.st.InUse() == 0 {
		d.releaseStackLocked(s)
		return
	}
	s.orphanSince = time.Now()
	if s.name != "" && d.named[s.name] == s {
		delete(d.named, s.name) // a new process with the name gets a new stack
	}
	d.log.Info("stack orphaned: its processes are gone; onloadd finishes its connections", "stack", s.id, "closed", closed, "in_use", s.st.InUse())
}

// killLocked ends orphan stack id for client c: its connections are
// reset and it is released.
func (d *Daemon) killLocked(c *client, id bpf.StackID) (*control.KillReply, error) {
	s := d.stacks[id]
	switch {
	case s == nil:
		return nil, refuse(codeInvalid, "no stack %d", id)
	case c.cred.Uid != 0 && int(c.cred.Uid) != s.uid:
		return nil, refuse(codeDenied, "stack %d belongs to uid %d; only it and root may end it", id, s.uid)
	case s.orphanSince.IsZero():
		return nil, refuse(codeInUse, "stack %d has processes (%s): it ends when they do", id, s.clientNames())
	}
	reset, ok := s.st.ResetAll(100 * time.Millisecond)
	d.log.Info("orphan stack ended", "stack", id, "by", c.String(), "reset", reset, "lock", map[bool]string{true: "taken", false: "held by a process that is gone"}[ok])
	d.releaseStackLocked(s)
	return &control.KillReply{Reset: reset}, nil
}

// reap releases the orphan stacks whose sockets are all gone, until done
// is closed.
func (d *Daemon) reap(done <-chan struct{}) {
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		d.mu.Lock()
		for _, s := range d.stacks {
			if s.orphanSince.IsZero() {
				continue
			}
			switch {
			case s.st.InUse() == 0:
				d.log.Info("orphan stack finished", "stack", s.id, "after", time.Since(s.orphanSince).Round(time.Millisecond).String())
				d.releaseStackLocked(s)
			case time.Since(s.orphanSince) > orphanMax:
				d.log.Warn("orphan stack given up: its connections did not finish", "stack", s.id, "in_use", s.st.InUse(), "after", orphanMax.String())
				d.releaseStackLocked(s)
			}
		}
		d.mu.Unlock()
	}
}
