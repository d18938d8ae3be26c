package daemon

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
)

// TestCheckProofOwner: a proof socket of another user than the client's
// is taken only where holding it already gives the client every
// connection of the port: a TCP listener without SO_REUSEPORT (a
// pre-fork server's workers hold their master's, made as root). A
// reuseport listener, or a socket that only binds, must be the client's
// own. The sockets here are root's (the test runs as root); the client
// says it is uid 65534.
func TestCheckProofOwner(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root: the proofs must be another user's than the client's")
	}
	proof := func(reuseport, listen bool) (int, bpf.Listener) {
		t.Helper()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if reuseport {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		if listen {
			if err := unix.Listen(fd, 1); err != nil {
				t.Fatal(err)
			}
		}
		sa, err := unix.Getsockname(fd)
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(sa.(*unix.SockaddrInet4).Port)
		return fd, bpf.Listener{Proto: bpf.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: port}
	}
	for _, c := range []struct {
		name              string
		reuseport, listen bool
		ok                bool
	}{
		{"a listener", false, true, true},
		{"a reuseport listener", true, true, false},
		{"a bound socket", false, false, false},
	} {
		fd, key := proof(c.reuseport, c.listen)
		for _, uid := range []uint32{0, 65534} {
			cl := &client{cred: unix.Ucred{Uid: uid}}
			err := checkProof(cl, key, fd)
			want := c.ok || uid == 0
			if (err == nil) != want {
				t.Errorf("%s of uid 0, for a client of uid %d: %v, want accepted %v", c.name, uid, err, want)
			}
			if err != nil && !strings.Contains(err.Error(), "not yours") {
				t.Errorf("%s, for uid %d: %v, want the refusal to say whose it is", c.name, uid, err)
			}
			if err != nil && c.reuseport && !strings.Contains(err.Error(), "every listener on the port") {
				t.Errorf("%s, for uid %d: %v, want the refusal to say what would do", c.name, uid, err)
			}
		}
	}
}

// TestCheckProofServersGroup: another user's reuseport listener is proof
// when every listener on its port is held by the client or its parent (a
// master's group, a socket for each worker), and not once a listener on
// the port is held by another process only. The client here is this
// process, as uid 65534.
func TestCheckProofServersGroup(t *testing.T) {
	if unix.Geteuid() != 0 {
		t.Skip("needs root: the proofs must be another user's than the client's")
	}
	listen := func(port int) int {
		t.Helper()
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		if err := unix.Listen(fd, 1); err != nil {
			t.Fatal(err)
		}
		return fd
	}
	first := listen(0)
	defer unix.Close(first)
	sa, err := unix.Getsockname(first)
	if err != nil {
		t.Fatal(err)
	}
	port := sa.(*unix.SockaddrInet4).Port
	second := listen(port)
	defer unix.Close(second)
	key := bpf.Listener{Proto: bpf.TCP, Addr: netip.MustParseAddr("127.0.0.1"), Port: uint16(port)}
	cl := &client{cred: unix.Ucred{Pid: int32(os.Getpid()), Uid: 65534}}
	if err := checkProof(cl, key, second); err != nil {
		t.Fatalf("a group of two, both held by the client: %v", err)
	}
	// A third, held by another process only (the test's copy closed).
	third := listen(port)
	thirdFile := os.NewFile(uintptr(third), "third")
	other := exec.Command("sleep", "30")
	other.ExtraFiles = []*os.File{thirdFile}
	if err := other.Start(); err != nil {
		t.Skipf("no sleep(1) to hold a socket: %v", err)
	}
	defer func() { other.Process.Kill(); other.Wait() }()
	thirdFile.Close()
	time.Sleep(50 * time.Millisecond) // the child has it: its fd 3
	err = checkProof(cl, key, second)
	if err == nil || !strings.Contains(err.Error(), "every listener on the port") {
		t.Fatalf("a group with a listener another process holds: %v, want refused, saying why", err)
	}
}

// TestClientMayUse: root may join, or adopt, any user's stack, but not
// from the dynamic loader's secure mode, where the stack's name came from
// a less privileged user's environment; a user only its own.
func TestClientMayUse(t *testing.T) {
	for _, tc := range []struct {
		uid    uint32
		secure bool
		owner  int
		want   bool
	}{
		{0, false, 1000, true},
		{0, true, 1000, false},
		{0, true, 0, true},
		{1000, false, 1000, true},
		{1000, true, 1000, true},
		{1000, false, 0, false},
		{1000, false, 1001, false},
	} {
		c := &client{cred: unix.Ucred{Uid: tc.uid}, secure: tc.secure}
		if got := c.mayUse(tc.owner); got != tc.want {
			t.Errorf("client of uid %d (secure %v) on a stack of uid %d: may use %v, want %v", tc.uid, tc.secure, tc.owner, got, tc.want)
		}
	}
}
