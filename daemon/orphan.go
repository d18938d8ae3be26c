package daemon

import (
	"fmt"
	"os"
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
	if d.closed || s.quarantined != "" || s.watch == nil || s.watch.err.Load() != nil {
		d.releaseStackLocked(s)
		return
	}
	s.abandoned = nil // all of them now
	dropHoldersLocked(s)
	closed, ok, err := closeAbandoned(s)
	if h := s.st.LockHolder(); err == nil && !ok && h != 0 && h != os.Getpid() {
		// Every process of the stack is gone, and one died holding its
		// lock (its control connection closes only once none of its
		// threads runs): nobody but onloadd can let it go. Then the
		// image is read with care: a panic or an inconsistency in what
		// the holder left half-done, and the stack is released (its
		// peers' next segments are answered with resets by the kernel).
		_, err = d.breakLockLocked(s, h, fmt.Sprintf("pid %d", h), func() (err error) {
			closed, ok, err = closeAbandoned(s)
			return err
		})
	}
	if err != nil {
		d.log.Error("the stack's image is corrupt; its connections cannot be finished", "stack", s.id, "err", err)
		d.releaseStackLocked(s)
		return
	}
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
	for _, f := range s.filters {
		f.gone = true
	}
	d.settleGoneFiltersLocked(s)
	if s.name != "" && d.named[s.name] == s {
		delete(d.named, s.name) // a new process with the name gets a new stack
	}
	d.log.Info("stack orphaned: its processes are gone; onloadd finishes its connections", "stack", s.id, "closed", closed, "in_use", s.st.InUse())
}

// adoptableLocked finds an orphan stack on ifc that client c may take as
// its own when no queue is free: one of c's user (or any, for root not
// in secure mode: client.mayUse),
// named name, or unnamed or named by `onloadd run` if name is either
// (control.SameRunKind), whose watch found nothing wrong.
func (d *Daemon) adoptableLocked(c *client, ifc *iface, name string) *dstack {
	for _, s := range d.stacks {
		if s.ifc != ifc || s.orphanSince.IsZero() || s.quarantined != "" || !control.SameRunKind(s.name, name) ||
			s.watch == nil || s.watch.err.Load() != nil || !c.mayUse(s.uid) {
			continue
		}
		return s
	}
	return nil
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

// closeAbandoned is stack.CloseAbandoned on an image its processes may
// have broken: a panic is an error.
func closeAbandoned(s *dstack) (closed int, ok bool, err error) {
	err = guard(func() { closed, ok = s.st.CloseAbandoned(100 * time.Millisecond) })
	return
}

// closeGoneLocked closes the sockets of the processes of s that went
// while others stayed (s.abandoned), as their descriptors would close
// (stack.CloseAbandonedBy, guarded as closeAbandoned is), waiting at most
// wait for the stack's lock for each; those whose lock stayed busy wait
// for the reaper's next round.
func (d *Daemon) closeGoneLocked(s *dstack, wait time.Duration) {
	left := s.abandoned[:0]
	for _, pid := range s.abandoned {
		var closed int
		var ok bool
		if err := guard(func() { closed, ok = s.st.CloseAbandonedBy(pid, wait) }); err != nil {
			d.quarantineLocked(s, "closing the sockets of a process that went: "+err.Error())
			s.abandoned = nil
			return
		}
		if !ok {
			left = append(left, pid)
			continue
		}
		if closed > 0 {
			d.log.Info("a process of a shared stack went; onloadd finishes its connections", "stack", s.id, "pid", pid, "closed", closed)
		}
	}
	s.abandoned = left
}

// guard runs f, which reads a client's image, and turns a panic into an
// error: an image the engine's checks let through must not take the
// daemon down.
func guard(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("reading the image: %v", r)
		}
	}()
	f()
	return nil
}

// quarantineLocked cuts stack s off after its image was found corrupt:
// its filters and its socket leave the steering maps (no frame reaches
// it; its ports are free again), nobody polls it, and the event is
// logged. Its processes keep their mappings until they go.
func (d *Daemon) quarantineLocked(s *dstack, why string) {
	if s.quarantined != "" {
		return
	}
	s.quarantined = why
	s.watch.end()
	if err := d.unsteerLocked(s); err != nil {
		d.log.Warn("quarantine", "stack", s.id, "err", err)
	}
	d.log.Error("stack quarantined: its image is corrupt", "stack", s.id, "why", why, "processes", s.clientNames())
}

// reap releases the orphan stacks whose sockets are all gone, closes
// the sockets and settles the ports of processes that went, and
// quarantines the stacks whose watcher found their image corrupt, until
// done is closed. It looks every reapEvery while any stack needs it
// (reapable), and sleeps otherwise until kickReaper: a daemon whose
// stacks are all alive and well does nothing.
func (d *Daemon) reap(done <-chan struct{}) {
	t := time.NewTicker(reapEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		case <-d.reapKick:
		}
		d.mu.Lock()
		d.reapLocked()
		busy := false
		for _, s := range d.stacks {
			busy = busy || s.reapable()
		}
		d.mu.Unlock()
		if busy {
			t.Reset(reapEvery)
		} else {
			t.Stop()
		}
	}
}

// kickReaper makes the reaper look now, and then every reapEvery while
// there is something for it to do.
func (d *Daemon) kickReaper() {
	select {
	case d.reapKick <- struct{}{}:
	default:
	}
}

// reapable reports whether s needs the reaper: an orphan, sockets or
// ports of processes that went, or a watch that found the image corrupt.
func (s *dstack) reapable() bool {
	if !s.orphanSince.IsZero() || len(s.holders) > 0 || len(s.abandoned) > 0 || len(s.flows) > 0 {
		return true
	}
	if w := s.watch; w != nil && s.quarantined == "" && w.err.Load() != nil {
		return true
	}
	for _, f := range s.filters {
		if f.gone {
			return true
		}
	}
	return false
}

// reapLocked is one round of the reaper.
func (d *Daemon) reapLocked() {
	for _, s := range d.stacks {
		if w := s.watch; w != nil && s.quarantined == "" {
			if e := w.err.Load(); e != nil {
				if !s.orphanSince.IsZero() {
					d.log.Error("orphan stack released: its image is corrupt", "stack", s.id, "why", *e)
					d.releaseStackLocked(s)
					continue
				}
				d.quarantineLocked(s, *e)
			}
		}
		if len(s.holders) > 0 {
			d.breakDeadHoldersLocked(s, 0)
		}
		if len(s.abandoned) > 0 && s.quarantined == "" {
			d.closeGoneLocked(s, 10*time.Millisecond)
		}
		d.settleGoneFiltersLocked(s)
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
}
