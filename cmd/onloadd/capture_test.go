package main

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/xdp-onload/onload/test"
)

func TestCapture(t *testing.T) {
	a, b := test.Pair(t, test.LinkOptions{})
	var out test.SyncBuffer
	done := make(chan error, 1)
	go func() {
		done <- b.Do(func() error {
			return capture([]string{"-iface", "eth0", "-udp", "7000", "-tcp", "7001", "-count", "1", "-duration", "10s"}, &out)
		})
	}()
	// Send until the capture has seen one frame (it may not be steering yet
	// when the first datagrams leave).
	var u net.Conn
	if err := a.Do(func() (err error) { u, err = net.Dial("udp", "198.18.0.2:7000"); return }); err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	var err error
	deadline := time.After(10 * time.Second)
loop:
	for {
		u.Write([]byte("to the capture"))
		select {
		case err = <-done:
			break loop
		case <-deadline:
			t.Fatalf("capture saw nothing in 10s; output so far:\n%s", out.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"capture: steering udp/7000 tcp/7001 to every local address on eth0 queue 0 (native XDP, xdp copy)",
		"-> 198.18.0.2:7000 len=14 \"to the capture\"",
		"capture: 1 frames in the AF_XDP socket",
		"redirect_listener=",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

func TestCaptureArgumentErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-udp", "1"}, "-iface is required"},
		{[]string{"-iface", "eth0"}, "nothing to steer"},
		{[]string{"-iface", "eth0", "-udp", "0"}, "must be a number from 1 to 65535"},
		{[]string{"-iface", "eth0", "-tcp", "http"}, "must be a number from 1 to 65535"},
		{[]string{"-iface", "eth0", "-udp", "1", "-addr", "::1"}, "want an IPv4 address"},
		{[]string{"-iface", "eth0", "-udp", "1", "-mode", "fast"}, "want auto, native or generic"},
	} {
		err := capture(c.args, new(bytes.Buffer))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("capture %v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
