package daemon

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Locks of dead processes. The stack lock's word names its holder's
// process (stack.Lock.Holder), set in the step that takes it. When a
// process of a shared stack goes while others stay, onloadd looks at the
// lock: if the process that went holds it, and is dead (its pidfd says
// it exited: a process that merely closed its control connection, or is
// stopped, keeps its lock), onloadd breaks the lock so that the others
// go on, then polls the stack itself with the engine's checks watched.
// What the dead holder left half-done is read as any image data is:
// checked at every step. If the poll finds what does not add up (or
// panics), the stack is quarantined: its filters go, and its processes'
// connections see no more frames.
//
// When the last process of a stack goes, orphanLocked breaks a lock it
// left held in the same way.

// exitWait bounds how long onloadd waits, with its own lock held, for a
// process whose control connection closed to be seen to exit (the kernel
// closes a dying process's descriptors a moment before it reports the
// exit); after that the reaper looks again each round, for up to
// exitGiveUp, so that a process that closed its connection holding the
// lock and runs on cannot hold the daemon up.
const (
	exitWait   = 20 * time.Millisecond
	exitGiveUp = 10 * time.Second
)

// deadHolder is a process that left a stack holding its lock, not yet
// seen to exit.
type deadHolder struct {
	pid   int // as it sees itself: what the lock word holds
	pidfd int // onloadd's own, closed when the entry goes
	since time.Time
	who   string
}

// recoverLockLocked breaks s's lock if c, which has just left s, died
// holding it (now, or in a later round of the reaper once its exit
// shows).
func (d *Daemon) recoverLockLocked(s *dstack, c *client) {
	h := s.st.LockHolder()
	if h == 0 || h != c.selfPid || s.quarantined != "" || c.pidfd < 0 {
		return
	}
	for o := range s.clients {
		if o.selfPid == h {
			// Processes in different pid namespaces may see themselves
			// with the same id: the lock may be the other's.
			d.log.Warn("stack lock held by a process id two of its processes have; left alone", "stack", s.id, "pid", h)
			return
		}
	}
	pidfd, err := unix.FcntlInt(uintptr(c.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		d.log.Warn("a process left a stack holding its lock; onloadd cannot watch it", "stack", s.id, "process", c.String(), "err", err)
		return
	}
	s.holders = append(s.holders, deadHolder{pid: h, pidfd: pidfd, since: time.Now(), who: c.String()})
	d.breakDeadHoldersLocked(s, exitWait)
}

// breakDeadHoldersLocked breaks s's lock for each process in s.holders
// that has exited (waiting up to wait for the first to show it) and still
// holds it, then reads the image as any image is read: a poll under
// recover with the engine's inconsistencies watched; quarantine if what
// the holder left does not add up.
func (d *Daemon) breakDeadHoldersLocked(s *dstack, wait time.Duration) {
	left := s.holders[:0]
	for _, dh := range s.holders {
		if !exited(dh.pidfd, wait) {
			if time.Since(dh.since) < exitGiveUp {
				left = append(left, dh)
				continue
			}
			d.log.Warn("a process left a stack holding its lock and still runs; its other processes wait for it", "stack", s.id, "process", dh.who)
			unix.Close(dh.pidfd)
			continue
		}
		wait = 0
		unix.Close(dh.pidfd)
		if s.quarantined != "" {
			continue
		}
		// A lock let go meanwhile is not broken: its holder was not dead
		// when it took it.
		_, err := d.breakLockLocked(s, dh.pid, dh.who, func() error { return guard(func() { s.st.TryPoll() }) })
		if err != nil {
			d.quarantineLocked(s, "a process died holding the stack lock: "+err.Error())
		}
	}
	s.holders = left
}

// breakLockLocked breaks s's lock in the name of process pid (who names
// it in the log), if pid holds it, and runs read, which reads what the
// holder left half-done, with the engine's count of inconsistencies
// watched: err says what did not add up (read's error, or the
// inconsistencies counted meanwhile). broken is false, and read is not
// run, if pid did not hold the lock.
func (d *Daemon) breakLockLocked(s *dstack, pid int, who string, read func() error) (broken bool, err error) {
	corrupt := s.st.CorruptSeen()
	if !s.st.BreakLock(pid) {
		return false, nil
	}
	s.lockBreaks++
	d.log.Warn("stack lock recovered: a process died holding it", "stack", s.id, "process", who, "others", s.clientNames())
	err = read()
	if n := s.st.CorruptSeen() - corrupt; err == nil && n != 0 {
		err = fmt.Errorf("the engine found %d inconsistencies in what the dead holder left", n)
	}
	return true, err
}

// dropHoldersLocked forgets s's dead holders (the stack goes).
func dropHoldersLocked(s *dstack) {
	for _, dh := range s.holders {
		unix.Close(dh.pidfd)
	}
	s.holders = nil
}

// exited reports whether the process pidfd refers to has exited, waiting
// up to wait for it.
func exited(pidfd int, wait time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	ts := unix.NsecToTimespec(int64(wait))
	for {
		n, err := unix.Ppoll(fds, &ts, nil)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1
	}
}

// clientProcess opens a pidfd for the process pid (as onloadd sees it)
// and reads the id that process has in its own pid namespace (the last
// of /proc/PID/status's NSpid); pidfd is -1 if the kernel gives none.
func clientProcess(pid int) (pidfd, selfPid int) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		pidfd = -1
	}
	selfPid = pid
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return pidfd, selfPid
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				if p, err := strconv.Atoi(f[len(f)-1]); err == nil && p > 0 {
					selfPid = p
				}
			}
		}
	}
	return pidfd, selfPid
}
