package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdp-onload/onload/control"
)

// start runs a daemon on a socket in a temporary directory; it is closed
// when the test ends.
func start(t *testing.T) (*Daemon, string) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "onloadd.sock")
	d, err := New(Config{Socket: sock, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		d.Close()
	})
	return d, sock
}

// raw connects to the daemon without saying hello.
func raw(t *testing.T, sock string) *control.Conn {
	t.Helper()
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	return control.NewConn(uc)
}

// roundTrip sends b (and fds) raw and returns the reply.
func roundTrip(t *testing.T, c *control.Conn, b []byte, fds ...int) *control.Reply {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if err := c.SendRaw(b, oob); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	msg, rfds, err := c.Recv()
	if err != nil {
		t.Fatalf("no reply to %.40q: %v", b, err)
	}
	control.CloseFDs(rfds)
	rep, err := control.ParseReply(msg)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestSecondInstance: a second daemon on the same socket is refused with
// a sentence that names the first.
func TestSecondInstance(t *testing.T) {
	_, sock := start(t)
	_, err := New(Config{Socket: sock, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if !errors.Is(err, ErrRunning) || !strings.Contains(err.Error(), "pid") {
		t.Fatalf("a second daemon on %s: %v", sock, err)
	}
}

// TestHostileClients: clients that send garbage, oversized messages,
// requests out of order, descriptors where none belong, or that leave in
// the middle of a request, each get an error reply (or are dropped) and
// change nothing for a well-behaved client served all along; the daemon
// keeps no descriptor they sent.
func TestHostileClients(t *testing.T) {
	_, sock := start(t)
	good, err := control.Dial(sock, "good")
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	check := func(when string) {
		t.Helper()
		rep, _, err := good.Call(control.Request{Op: control.OpDump, Dump: &control.DumpRequest{}})
		if err != nil || rep.Dump == nil {
			t.Fatalf("%s, the good client's dump: %v", when, err)
		}
	}
	check("at first")
	before := openFDs(t)

	bad := raw(t, sock)
	for _, tc := range []struct {
		msg  string
		fds  bool
		want string
	}{
		{"\x00\x01garbage", false, "malformed"},
		{`{"v":1,"seq":1,"op":"dump","dump":{}}`, false, "before hello"},
		{`{"v":7,"seq":1,"op":"hello","hello":{}}`, false, "protocol version 7"},
		{`{"v":1,"seq":1,"op":"hello","hello":{}}`, true, "carries 1 descriptors"},
		{`{"v":1,"seq":2,"op":"hello","hello":{}}`, false, ""},
		{`{"v":1,"seq":3,"op":"hello","hello":{}}`, false, "second hello"},
		{`{"v":1,"seq":4,"op":"filter","filter":{"stack":9,"kind":"listen","proto":"tcp","local":"198.18.0.2:80"}}`, true, "not one of yours"},
		{`{"v":1,"seq":5,"op":"filter","filter":{"stack":9,"kind":"listen","proto":"tcp","local":"198.18.0.2:80"}}`, false, "carries 0 descriptors"},
		{`{"v":1,"seq":6,"op":"stack","stack":{"interface":"no-such-if0","frames":-5,"image":{}}}`, false, "UMEM frames"},
		{`{"v":1,"seq":7,"op":"stack","stack":{"interface":"no-such-if0","image":{}}}`, false, "no interface no-such-if0"},
		{`{"v":1,"seq":8,"op":"dump","dump":{}}`, false, ""},
	} {
		var fds []int
		var pipe [2]*os.File
		if tc.fds {
			r, w, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			fds, pipe = []int{int(r.Fd())}, [2]*os.File{r, w}
		}
		rep := roundTrip(t, bad, []byte(tc.msg), fds...)
		if tc.fds {
			pipe[0].Close()
			pipe[1].Close()
		}
		switch {
		case tc.want == "" && rep.Error != "":
			t.Errorf("%.50s: refused: %s", tc.msg, rep.Error)
		case tc.want != "" && !strings.Contains(rep.Error, tc.want):
			t.Errorf("%.50s: reply %+v, want an error with %q", tc.msg, rep, tc.want)
		}
		check("after " + tc.msg)
	}
	// A datagram over the limit.
	if err := bad.SendRaw(make([]byte, control.MaxMessage+100), nil); err != nil {
		t.Fatal(err)
	}
	bad.SetDeadline(time.Now().Add(5 * time.Second))
	if msg, _, err := bad.Recv(); err != nil || !strings.Contains(string(msg), "longer than") {
		t.Errorf("an oversized datagram: %s, %v", msg, err)
	}
	check("after an oversized datagram")

	// Clients that leave mid-request: the request sent, the connection
	// closed before the reply.
	for range 20 {
		c := raw(t, sock)
		c.SendRaw([]byte(`{"v":1,"seq":1,"op":"hello","hello":{}}`), nil)
		c.SendRaw([]byte(`{"v":1,"seq":2,"op":"dump","dump":{}}`), nil)
		c.Close()
	}
	check("after clients left mid-request")

	// Nothing the bad clients sent is kept: what is open now is what was
	// before, with the bad client's connection at both ends and the
	// daemon's pidfd for it (this process).
	// The count must come down and stay down for 200 ms: the daemon may
	// still be taking the last of the clients that left mid-request from
	// its backlog (each for a moment a connection and a pidfd), and a
	// descriptor it kept would stay open.
	deadline := time.Now().Add(3 * time.Second)
	n, low := openFDs(t), 0
	for low < 20 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if n = openFDs(t); n <= before+3 {
			low++
		} else {
			low = 0
		}
	}
	if low < 20 {
		t.Errorf("%d descriptors open, %d before the bad clients: the daemon kept some", n, before)
	}
}

// TestFitDump: a dump that says more than one control message carries (a
// stack with thousands of sockets and a long engine dump, as a corrupt
// image whose every slot looks in use gives) is cut to fit, and says how
// much was cut. (Such a dump once closed the stackdump's connection.)
func TestFitDump(t *testing.T) {
	sd := control.StackDump{ID: 1, Engine: strings.Repeat("engine line\n", 20000)}
	for i := range 3000 {
		sd.Sockets = append(sd.Sockets, control.SocketDump{Proto: "tcp", State: "ESTABLISHED",
			Local: "198.18.0.2:80", Remote: fmt.Sprintf("198.18.0.1:%d", i), OwnerPID: 4242})
	}
	small := control.StackDump{ID: 2, Engine: "small", Sockets: []control.SocketDump{{Proto: "udp"}}}
	out := &control.Dump{Stacks: []control.StackDump{sd, small}}
	fitDump(out)
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > control.MaxMessage-1024 {
		t.Fatalf("the dump is %d bytes after fitDump; the limit is %d", len(b), control.MaxMessage)
	}
	big := out.Stacks[0]
	if big.SocketsCut+len(big.Sockets) != 3000 || big.SocketsCut == 0 || big.EngineCut+len(big.Engine) != len(sd.Engine) || big.EngineCut == 0 {
		t.Fatalf("cut %d sockets (kept %d) and %d engine bytes (kept %d): want both cut, and the counts to add up",
			big.SocketsCut, len(big.Sockets), big.EngineCut, len(big.Engine))
	}
	if s := out.Stacks[1]; s.Engine != "small" || len(s.Sockets) != 1 || s.SocketsCut != 0 {
		t.Fatalf("the small stack was cut: %+v", s)
	}

	// A proxy's stack: a filter for each of its connections' ports.
	px := control.StackDump{ID: 3, Sockets: []control.SocketDump{{Proto: "tcp"}}}
	for i := range 2000 {
		px.Filters = append(px.Filters, fmt.Sprintf("tcp 198.18.0.2:%d -> 198.18.0.1:8080 (flow: a connection whose listener or process went)", 10000+i))
	}
	out = &control.Dump{Stacks: []control.StackDump{px}}
	fitDump(out)
	if b, err := json.Marshal(out); err != nil || len(b) > control.MaxMessage-1024 {
		t.Fatalf("the proxy's dump is %d bytes after fitDump (%v); the limit is %d", len(b), err, control.MaxMessage)
	}
	if s := out.Stacks[0]; s.FiltersCut+len(s.Filters) != 2000 || s.FiltersCut == 0 || len(s.Sockets) != 1 {
		t.Fatalf("cut %d filters (kept %d), kept %d sockets: want the filters cut, the counts to add up, the socket kept", s.FiltersCut, len(s.Filters), len(s.Sockets))
	}
}

// TestHelloSecure: a client that says it runs in the dynamic loader's
// secure mode is marked so (client.mayUse reads it); one that does not,
// not.
func TestHelloSecure(t *testing.T) {
	d, sock := start(t)
	for _, secure := range []bool{true, false} {
		cl, err := control.DialHello(sock, control.Hello{Program: "hello-test", Secure: secure})
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		d.mu.Lock()
		for c := range d.clients {
			if c.program == "hello-test" {
				found++
				if c.secure != secure {
					t.Errorf("hello with secure %v: client marked %v", secure, c.secure)
				}
			}
		}
		d.mu.Unlock()
		if found != 1 {
			t.Errorf("hello with secure %v: %d clients named hello-test", secure, found)
		}
		cl.Close()
		deadline := time.Now().Add(5 * time.Second)
		for gone := false; !gone && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			d.mu.Lock()
			gone = true
			for c := range d.clients {
				gone = gone && c.program != "hello-test"
			}
			d.mu.Unlock()
		}
	}
}
