package control

import (
	"encoding/json"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// pair is two connected Conns over a SOCK_SEQPACKET socketpair.
func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *Conn {
		f := os.NewFile(uintptr(fd), "control")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return NewConn(c.(*net.UnixConn))
	}
	return conn(fds[0]), conn(fds[1])
}

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		msg, err string
	}{
		{`{"v":1,"seq":1,"op":"hello","hello":{"program":"x"}}`, ""},
		{`{"v":1,"seq":2,"op":"stack","stack":{"interface":"vB","image":{}}}`, ""},
		{`{"v":1,"seq":3,"op":"filter","filter":{"stack":1,"kind":"listen","proto":"tcp","local":"198.18.0.2:80"}}`, ""},
		{`{"v":1,"seq":4,"op":"dump","dump":{}}`, ""},
		{`{"v":2,"seq":1,"op":"hello","hello":{}}`, "protocol version 2"},
		{`{"v":1,"seq":1,"op":"reboot","hello":{}}`, `unknown request "reboot"`},
		{`{"v":1,"seq":1,"op":"hello"}`, "must carry its own body"},
		{`{"v":1,"seq":1,"op":"hello","hello":{},"dump":{}}`, "must carry its own body"},
		{`{"v":1,"seq":1,"op":"hello","hello":{},"extra":1}`, "unknown field"},
		{`{"v":1,"seq":1,"op":"hello","hello":{}}{}`, "more than one object"},
		{`{"v":1,`, "malformed"},
		{``, "malformed"},
		{`{"v":1,"seq":1,"op":"hello","hello":{"program":` + strings.Repeat(" ", MaxMessage) + `"x"}}`, "the limit is"},
	} {
		_, err := ParseRequest([]byte(tc.msg))
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%.60s: %v", tc.msg, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%.60s: error %v, want one with %q", tc.msg, err, tc.err)
		}
	}
}

func TestFilterLocal(t *testing.T) {
	for local, ok := range map[string]bool{
		"198.18.0.2:80": true, "0.0.0.0:80": true, "198.18.0.2:0": false, "[::1]:80": false, "x": false,
	} {
		f := FilterRequest{Local: local}
		if _, err := f.LocalAddrPort(); (err == nil) != ok {
			t.Errorf("%s: error %v", local, err)
		}
	}
}

// TestConnFDs sends a message with descriptors and checks that the same
// files arrive, and that oversized messages are refused on both sides
// with the descriptors closed.
func TestConnFDs(t *testing.T) {
	a, b := pair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := a.Send(Request{V: Version, Seq: 7, Op: OpDump, Dump: &DumpRequest{}}, int(w.Fd())); err != nil {
		t.Fatal(err)
	}
	msg, fds, err := b.Recv()
	if err != nil {
		t.Fatal(err)
	}
	req, err := ParseRequest(msg)
	if err != nil || req.Seq != 7 || req.Op != OpDump {
		t.Fatalf("got %+v, %v", req, err)
	}
	if len(fds) != 1 {
		t.Fatalf("%d descriptors arrived, want 1", len(fds))
	}
	// The descriptor is the pipe's write end: what goes in comes out.
	if _, err := unix.Write(fds[0], []byte("x")); err != nil {
		t.Fatal(err)
	}
	CloseFDs(fds)
	got := make([]byte, 1)
	if _, err := r.Read(got); err != nil || got[0] != 'x' {
		t.Fatalf("read %q, %v", got, err)
	}

	if err := a.Send(Hello{Program: strings.Repeat("x", MaxMessage)}); err == nil {
		t.Error("a message over the limit was sent")
	}
	if err := a.Send(Hello{}, 0, 1, 2, 0, 1); err == nil {
		t.Error("a message with too many descriptors was sent")
	}
	// A raw datagram over the limit, as a hostile client would send it.
	rc, _ := a.c.SyscallConn()
	rc.Control(func(fd uintptr) {
		unix.Write(int(fd), make([]byte, MaxMessage+10))
	})
	if _, _, err := b.Recv(); err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("an oversized datagram gave %v", err)
	}
	// The connection still works after it.
	a.Send(Request{V: Version, Seq: 8, Op: OpHello, Hello: &Hello{}})
	if msg, _, err := b.Recv(); err != nil || !strings.Contains(string(msg), `"seq":8`) {
		t.Errorf("after the oversized datagram: %s, %v", msg, err)
	}
	a.Close()
	if _, _, err := b.Recv(); !IsClosed(err) {
		t.Errorf("after the peer closed: %v, want the close reported", err)
	}
}

// FuzzParseRequest feeds the daemon's parser arbitrary bytes: it never
// panics, and what it accepts survives a round trip unchanged.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"seq":1,"op":"hello","hello":{"program":"x"}}`,
		`{"v":1,"seq":2,"op":"stack","stack":{"interface":"vB","name":"web","frames":4096,"image":{"sockets":64}}}`,
		`{"v":1,"seq":3,"op":"filter","filter":{"stack":1,"kind":"listen","proto":"tcp","local":"198.18.0.2:80"}}`,
		`{"v":1,"seq":3,"op":"unfilter","filter":{"stack":1,"kind":"listen","proto":"udp","local":"0.0.0.0:53"}}`,
		`{"v":1,"seq":4,"op":"dump","dump":{}}`,
		`{"v":1,"seq":4,"op":"dump","dump":null}`,
		`[1,2,3]`, `null`, `{"v":1e400}`, "\x00\xff",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseRequest(b)
		if err != nil {
			return
		}
		again, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", b, err)
		}
		req2, err := ParseRequest(again)
		if err != nil {
			t.Fatalf("accepted %q but not its re-encoding %q: %v", b, again, err)
		}
		if !reflect.DeepEqual(req, req2) {
			t.Fatalf("%q changed in a round trip: %+v, %+v", b, req, req2)
		}
		if req.Filter != nil {
			req.Filter.LocalAddrPort() // must not panic on any string
		}
	})
}
