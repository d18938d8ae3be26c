package sockets

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/control"
)

// Secure mode. A program the dynamic loader runs in its secure mode
// (AT_SECURE: a set-user-ID or set-group-ID program, or one exec'd with
// its real and effective users apart, as squid's master execs its
// workers) has its environment from a less privileged user. The LD_PRELOAD
// shim reaches such a program only when it is installed set-user-ID in a
// system library directory (make install-shim), and then the stack
// trusts none of the variables that would let that user have the program
// write a file or take its stack from anyone but root's onloadd:
// ONLOAD_LOG_FILE is ignored (the log goes to standard error), stacks
// come from onloadd only (ONLOAD_DAEMON=require: the program never loads
// the steering program or opens an AF_XDP socket of its own), and
// onloadd, wherever ONLOAD_DAEMON_SOCKET puts its socket, must run as
// root or as the program's effective user (SO_PEERCRED: trustDaemon);
// the hello tells onloadd the program is in secure mode, and it then
// shares and adopts only stacks of the program's effective user's
// (daemon's client.mayUse: ONLOAD_STACK_NAME and ONLOAD_CLUSTER are the
// environment's). The other variables are tuning, each bounded by the
// option table. The shim's C half ignores ONLOAD_CORE there too.

// atSecure is AT_SECURE's type in the auxiliary vector.
const atSecure = 23

// secureMode reports that the process runs in the dynamic loader's
// secure mode: AT_SECURE in its auxiliary vector (the Go runtime's copy,
// which it has in a library the shim loads too, else /proc/self/auxv,
// which a set-user-ID process that has dropped its privilege cannot
// read), or, where neither can be read, real and effective users (or
// groups) apart.
var secureMode = sync.OnceValue(func() bool {
	if v, err := unix.Auxv(); err == nil {
		for _, kv := range v {
			if kv[0] == atSecure {
				return kv[1] != 0
			}
		}
		return false
	}
	if b, err := os.ReadFile("/proc/self/auxv"); err == nil {
		return auxvSecure(b)
	}
	return os.Getuid() != os.Geteuid() || os.Getgid() != os.Getegid()
})

// auxvSecure reads AT_SECURE from an auxiliary vector of 64-bit pairs.
func auxvSecure(b []byte) bool {
	for ; len(b) >= 16; b = b[16:] {
		switch binary.NativeEndian.Uint64(b) {
		case 0:
			return false
		case atSecure:
			return binary.NativeEndian.Uint64(b[8:]) != 0
		}
	}
	return false
}

// secureGetenv is getenv as secure mode reads it (see above).
func secureGetenv(getenv func(string) string) func(string) string {
	return func(k string) string {
		switch k {
		case "ONLOAD_LOG_FILE":
			return ""
		case "ONLOAD_DAEMON":
			return DaemonRequire
		}
		return getenv(k)
	}
}

// envGetenv is the environment as the stack reads it: all of it, or in
// secure mode what secureGetenv keeps.
func envGetenv() func(string) string {
	if secureMode() {
		return secureGetenv(os.Getenv)
	}
	return os.Getenv
}

// trustDaemon says whether a process in secure mode, of effective user
// euid, takes a stack from an onloadd running as uid: root's, or its
// effective user's own.
func trustDaemon(uid uint32, euid int) error {
	if uid == 0 || int(uid) == euid {
		return nil
	}
	return fmt.Errorf("it runs as uid %d: a program in the dynamic loader's secure mode (set-user-ID, or exec'd with its users apart) takes its stack only from an onloadd of root's or of its effective user's", uid)
}

// dialDaemon connects to onloadd at path as program. In secure mode the
// hello says so (onloadd then shares and adopts stacks only of the
// effective user's), and an onloadd that trustDaemon refuses is an
// error: the stack's memory, which the engine trusts, comes from it.
func dialDaemon(path, program string) (*control.Client, error) {
	sec := secureMode()
	cl, err := control.DialHello(path, control.Hello{Program: program, Secure: sec})
	if err != nil || !sec {
		return cl, err
	}
	cred, err := cl.Peer()
	if err == nil {
		err = trustDaemon(cred.Uid, os.Geteuid())
	}
	if err != nil {
		cl.Close()
		return nil, err
	}
	return cl, nil
}
