package eventfd

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

func TestSignalDrain(t *testing.T) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatalf("eventfd: %v", err)
	}
	defer unix.Close(fd)
	Signal(fd)
	Signal(fd)
	var b [8]byte
	if n, err := unix.Read(fd, b[:]); err != nil || n != 8 || b[0] != 2 {
		t.Fatalf("read after two signals: %d %v %v, want the count 2", n, b, err)
	}
	Signal(fd)
	Drain(fd)
	if _, err := unix.Read(fd, b[:]); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("read after Drain: %v, want EAGAIN (nothing left)", err)
	}
}
