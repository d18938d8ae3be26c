package fdbase

import (
	"testing"

	"golang.org/x/sys/unix"
)

func eventfd(t *testing.T) int {
	t.Helper()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatalf("eventfd: %v", err)
	}
	return fd
}

// TestMove moves a descriptor above the base, and leaves it where it is
// with no base or no room there.
func TestMove(t *testing.T) {
	defer Set(0)
	fd := eventfd(t)
	if got := Move(fd); got != fd {
		t.Fatalf("with no base fd %d moved to %d", fd, got)
	}
	Set(fd + 100)
	h := Move(fd)
	defer unix.Close(h)
	if h < fd+100 {
		t.Fatalf("fd %d moved to %d, under the base %d", fd, h, fd+100)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
		t.Errorf("the old fd %d is still open", fd)
	}
	if fl, err := unix.FcntlInt(uintptr(h), unix.F_GETFD, 0); err != nil || fl&unix.FD_CLOEXEC == 0 {
		t.Errorf("the moved fd %d: flags %#x, %v; want close-on-exec", h, fl, err)
	}
	if got := Move(h); got != h {
		t.Errorf("fd %d above the base moved to %d", h, got)
	}
	// A base past the limit: no room, and the fd stays.
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	Set(int(rl.Cur))
	fd2 := eventfd(t)
	defer unix.Close(fd2)
	if got := Move(fd2); got != fd2 {
		t.Errorf("with the base at the limit fd %d moved to %d", fd2, got)
	}
}

// TestNotify hears of every descriptor Move returns under a base, where
// it was moved or not, and of its Close; nothing with no base.
func TestNotify(t *testing.T) {
	defer Set(0)
	defer Notify(nil)
	heard := map[int]bool{}
	Notify(func(fd int, open bool) { heard[fd] = open })
	fd := eventfd(t)
	Move(fd)
	if len(heard) != 0 {
		t.Fatalf("with no base heard %v", heard)
	}
	Set(fd + 100)
	h := Move(fd)
	if open, ok := heard[h]; !ok || !open {
		t.Fatalf("fd %d moved to %d: heard %v", fd, h, heard)
	}
	if got := Move(h); got != h || !heard[h] {
		t.Fatalf("fd %d above the base: %d, heard %v", h, got, heard)
	}
	if err := Close(h); err != nil {
		t.Fatal(err)
	}
	if open, ok := heard[h]; !ok || open {
		t.Fatalf("fd %d closed: heard %v", h, heard)
	}
	if _, err := unix.FcntlInt(uintptr(h), unix.F_GETFD, 0); err == nil {
		t.Errorf("fd %d is still open after Close", h)
	}
}
