package sockets

import (
	"encoding/binary"
	"os"
	"testing"
)

// auxv builds an auxiliary vector of the given type/value pairs, ended
// by AT_NULL.
func auxv(pairs ...uint64) []byte {
	b := make([]byte, 0, 8*(len(pairs)+2))
	for _, v := range append(pairs, 0, 0) {
		b = binary.NativeEndian.AppendUint64(b, v)
	}
	return b
}

func TestAuxvSecure(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		want bool
	}{
		{"AT_SECURE 1", auxv(6, 4096, atSecure, 1, 25, 0x1234), true},
		{"AT_SECURE 0", auxv(6, 4096, atSecure, 0), false},
		{"none", auxv(6, 4096, 25, 0x1234), false},
		{"after AT_NULL", append(auxv(6, 4096), auxv(atSecure, 1)...), false},
		{"cut short", auxv(atSecure, 1)[:12], false},
	} {
		if got := auxvSecure(tc.b); got != tc.want {
			t.Errorf("%s: secure %v, want %v", tc.name, got, tc.want)
		}
	}
	b, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		t.Skipf("cannot read this process's auxiliary vector: %v", err)
	}
	if auxvSecure(b) || secureMode() {
		t.Error("a test process reads as one in the loader's secure mode")
	}
}

// TestSecureConfig: in secure mode the environment cannot name a log
// file or have the process make a stack of its own; the rest is read as
// ever.
func TestSecureConfig(t *testing.T) {
	env := map[string]string{"ONLOAD_LOG_FILE": "/etc/evil", "ONLOAD_DAEMON": DaemonOff,
		"ONLOAD_DAEMON_SOCKET": "/tmp/d.sock", "ONLOAD_SPIN_US": "7"}
	get := func(k string) string { return env[k] }
	c, err := configFrom(get, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.LogFile != "/etc/evil" || c.Daemon != DaemonOff {
		t.Fatalf("outside secure mode: log file %q, daemon %q", c.LogFile, c.Daemon)
	}
	c, err = configFrom(secureGetenv(get), "")
	if err != nil {
		t.Fatal(err)
	}
	if c.LogFile != "" || c.Daemon != DaemonRequire || c.DaemonSocket != "/tmp/d.sock" || c.Spin.Microseconds() != 7 {
		t.Fatalf("in secure mode: log file %q, daemon %q, socket %q, spin %v", c.LogFile, c.Daemon, c.DaemonSocket, c.Spin)
	}
}

// TestTrustDaemon: in secure mode the stack's memory comes from root's
// onloadd, or the effective user's own, and from no other user's.
func TestTrustDaemon(t *testing.T) {
	for _, tc := range []struct {
		uid  uint32
		euid int
		ok   bool
	}{{0, 0, true}, {0, 1000, true}, {1000, 1000, true}, {1000, 0, false}, {65534, 1000, false}} {
		if err := trustDaemon(tc.uid, tc.euid); (err == nil) != tc.ok {
			t.Errorf("onloadd of uid %d, program of euid %d: %v, want trusted %v", tc.uid, tc.euid, err, tc.ok)
		}
	}
}
