package daemon

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/bpf"
)

// serversGroup reports whether fd, a TCP listener with SO_REUSEPORT that
// another user made, belongs to a server the client is part of, whole:
// every TCP socket listening on the port, on any address, is held by the
// client or by its parent (a pre-fork master makes a reuseport socket
// for each worker and keeps them all, as nginx's does with `listen ...
// reuseport` and `user`). Steering the port to the client's stack then
// takes connections only from its own server's sockets, as a cluster of
// its workers does. A listener on the port that neither holds (another
// program's, of the same maker) keeps the proof refused: the kernel
// would have given it connections that the steering would take.
func serversGroup(c *client, fd int, key bpf.Listener) bool {
	if key.Proto != bpf.TCP || c.cred.Pid <= 0 || !listening(fd) || !reusePort(fd) {
		return false
	}
	held := map[uint64]bool{}
	pids := []int{int(c.cred.Pid)}
	if pp, err := parentOf(int(c.cred.Pid)); err == nil && pp > 1 {
		pids = append(pids, pp)
	}
	for _, pid := range pids {
		if err := socketInodes(pid, held); err != nil {
			return false
		}
	}
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil || !held[st.Ino] {
		return false // the client passed a socket it does not hold
	}
	found := false
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := netlink.SocketDiagTCP(family)
		if err != nil {
			return false
		}
		for _, sk := range socks {
			if sk.State != tcpListenState || sk.ID.SourcePort != key.Port {
				continue
			}
			if !held[uint64(sk.INode)] {
				return false
			}
			found = found || uint64(sk.INode) == st.Ino
		}
	}
	return found
}

// tcpListenState is the kernel's TCP_LISTEN (include/net/tcp_states.h).
const tcpListenState = 10

// parentOf reads process pid's parent from /proc.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return strconv.Atoi(f[1])
}

// socketInodes adds the inodes of the sockets process pid holds to held.
func socketInodes(pid int, held map[uint64]bool) error {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(link, "socket:[") || !strings.HasSuffix(link, "]") {
			continue
		}
		if ino, err := strconv.ParseUint(link[len("socket:["):len(link)-1], 10, 64); err == nil {
			held[ino] = true
		}
	}
	return nil
}
