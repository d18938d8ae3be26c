package daemon

import (
	"net/netip"
	"strings"
	"testing"

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
			if err != nil && c.reuseport && !strings.Contains(err.Error(), "listen without reuseport") {
				t.Errorf("%s, for uid %d: %v, want the refusal to say what would do", c.name, uid, err)
			}
		}
	}
}
