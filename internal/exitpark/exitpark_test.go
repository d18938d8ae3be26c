package exitpark

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestParkHoldsUntilRelease: a pipe's write end, parked and then closed,
// is still open (its reader sees no end of file) until the release.
func TestParkHoldsUntilRelease(t *testing.T) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	release, err := Park(p[1], -1)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(p[1])
	buf := make([]byte, 1)
	if n, err := unix.Read(p[0], buf); err != unix.EAGAIN {
		t.Fatalf("read with the write end parked: %d, %v; want EAGAIN (still open)", n, err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if n, err := unix.Read(p[0], buf); n != 0 || err != nil {
		t.Fatalf("read after the release: %d, %v; want end of file", n, err)
	}
	if err := release(); err != nil {
		t.Fatalf("a second release: %v", err)
	}
}
