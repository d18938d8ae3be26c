package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdp-onload/onload/sockets"
)

// The HTTP tests run net/http, unchanged, over our sockets: a server on
// sockets.Listen serving curl, and a client whose transport dials with
// sockets fetching from a kernel server. Both accelerated sides run in
// helper processes on the process default stack, as an application would.

// bigBody is what the HTTP tests move each way: 256 MiB (16 MiB with
// -short, under the race detector; helpers learn it from the environment).
func bigBody() int {
	if os.Getenv("ONLOAD_TEST_SHORT") != "" || os.Getenv("ONLOAD_TEST_HELPER") == "" && testing.Short() {
		return 16 << 20
	}
	return 256 << 20
}

// stream is the deterministic body of n bytes the tests move: a ChaCha8
// stream, so that nothing about it repeats.
func stream(n int64) io.Reader {
	return io.LimitReader(rand.NewChaCha8([32]byte{'o', 'n', 'l', 'o', 'a', 'd'}), n)
}

func streamSum(n int64) string {
	h := sha256.New()
	io.Copy(h, stream(n))
	return hex.EncodeToString(h.Sum(nil))
}

// handler serves /hello?i=N ("hello N\n"), /big?n=N (N bytes of the
// stream) and POST /sum (the body's length and SHA-256). Every response
// says whether its connection is accelerated.
func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s\n", r.URL.Query().Get("i"))
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
		if err != nil || n < 0 {
			http.Error(w, "bad n", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
		io.Copy(w, stream(n))
	})
	mux.HandleFunc("/sum", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "%d %x\n", n, h.Sum(nil))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kind := "kernel"
		if _, ok := r.Context().Value(connKey{}).(*sockets.TCPConn); ok {
			kind = "accelerated"
		}
		w.Header().Set("X-Conn", kind)
		mux.ServeHTTP(w, r)
	})
}

type connKey struct{}

func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

func init() {
	// The server: net/http on sockets.Listen, on the default stack.
	helpers["http-server"] = func() error {
		ln, err := sockets.Listen("tcp", ":0")
		if err != nil {
			return err
		}
		if _, ok := ln.(*sockets.TCPListener); !ok {
			return fmt.Errorf("sockets.Listen fell back to the kernel: %T", ln)
		}
		fmt.Printf("READY %d\n", ln.Addr().(*net.TCPAddr).Port)
		srv := &http.Server{Handler: handler(), ConnContext: connContext}
		return srv.Serve(ln)
	}
	// The client: net/http with a transport dialling through sockets.
	helpers["http-client"] = func() error {
		url := os.Getenv("HTTP_URL")
		fmt.Println("READY")
		tr := &http.Transport{DialContext: (&sockets.Dialer{}).DialContext, MaxIdleConnsPerHost: 1}
		client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
		return clientRun(client, url)
	}
}

// clientRun makes the client's requests and checks every answer: 1000
// keep-alive requests on one accelerated connection, a 256 MiB download
// and a 256 MiB upload.
func clientRun(client *http.Client, url string) error {
	var accelerated, reused, conns int
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if i.Reused {
			reused++
		} else {
			conns++
		}
		if _, ok := i.Conn.(*sockets.TCPConn); ok {
			accelerated++
		}
	}}
	get := func(path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", url+path, nil)
		return client.Do(req)
	}
	for i := range 1000 {
		resp, err := get("/hello?i=" + strconv.Itoa(i))
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if want := fmt.Sprintf("hello %d\n", i); string(body) != want {
			return fmt.Errorf("request %d: body %q, want %q", i, body, want)
		}
	}
	if conns != 1 || reused != 999 || accelerated != 1000 {
		return fmt.Errorf("1000 requests used %d connections (%d reused, %d accelerated); want 1 connection, accelerated, reused 999 times", conns, reused, accelerated)
	}
	resp, err := get("/big?n=" + strconv.Itoa(bigBody()))
	if err != nil {
		return err
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("download after %d bytes: %w", n, err)
	}
	big := int64(bigBody())
	if got, want := hex.EncodeToString(h.Sum(nil)), streamSum(big); n != big || got != want {
		return fmt.Errorf("download: %d bytes, sha256 %s; want %d bytes, %s", n, got, big, want)
	}
	req, _ := http.NewRequest("POST", url+"/sum", stream(big))
	req.ContentLength = big
	resp, err = client.Do(req)
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if want := fmt.Sprintf("%d %s\n", big, streamSum(big)); string(body) != want {
		return fmt.Errorf("upload: server saw %q, want %q", body, want)
	}
	return nil
}

func requireTool(t *testing.T, name string) {
	t.Helper()
	RequireTool(t, name)
}

// TestHTTPServerCurl serves curl (the kernel's TCP, in host a) from an
// http.Server on sockets.Listen in host b: 1000 keep-alive requests on
// one connection, then 256 MiB each way, byte-exact.
func TestHTTPServerCurl(t *testing.T) {
	RequireRoot(t)
	requireTool(t, "curl")
	a, b := Pair(t, LinkOptions{})
	srv := startHelper(t, b, "http-server")
	base := fmt.Sprintf("http://%s:%s", b.Iface0().Addr(), srv.Info)

	// 1000 requests in one curl: it keeps the connection alive.
	var cfg strings.Builder
	var want bytes.Buffer
	for i := range 1000 {
		fmt.Fprintf(&cfg, "url = \"%s/hello?i=%d\"\n", base, i)
		fmt.Fprintf(&want, "hello %d\n", i)
	}
	cfgFile := t.TempDir() + "/curl.cfg"
	if err := os.WriteFile(cfgFile, []byte(cfg.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := a.Command("curl", "-sS", "--fail", "-K", cfgFile, "-w", "%{stderr}%{num_connects} %header{x-conn}\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("curl: %v: %s", err, stderr.Bytes())
	}
	if !bytes.Equal(out, want.Bytes()) {
		t.Fatalf("1000 keep-alive requests: got %d bytes of bodies, want %d (first difference at %d)", len(out), want.Len(), firstDiff(out, want.Bytes()))
	}
	connects, accel := 0, 0
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var n int
		var kind string
		fmt.Sscan(line, &n, &kind)
		connects += n
		if kind == "accelerated" {
			accel++
		}
	}
	if connects != 1 || accel != 1000 {
		t.Fatalf("curl made %d connections and %d of 1000 answers came over an accelerated one; want 1 and 1000", connects, accel)
	}

	// 256 MiB down.
	big := int64(bigBody())
	cmd = a.Command("curl", "-sS", "--fail", "-D", "/dev/stderr", base+"/big?n="+strconv.Itoa(bigBody()))
	stderr.Reset()
	cmd.Stderr = &stderr
	down, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, _ := io.Copy(h, down)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("curl download: %v: %s", err, stderr.Bytes())
	}
	if got := hex.EncodeToString(h.Sum(nil)); n != big || got != streamSum(big) {
		t.Fatalf("download: %d bytes, sha256 %s; want %d bytes of the stream", n, got, big)
	}
	if !strings.Contains(strings.ToLower(stderr.String()), "x-conn: accelerated") {
		t.Fatalf("download did not come over an accelerated connection: %s", stderr.String())
	}
	t.Logf("%d MiB down in %v", big>>20, time.Since(start).Round(time.Millisecond))

	// 256 MiB up.
	cmd = a.Command("curl", "-sS", "--fail", "--data-binary", "@-", "-H", "Content-Type: application/octet-stream", base+"/sum")
	cmd.Stdin = stream(big)
	stderr.Reset()
	cmd.Stderr = &stderr
	start = time.Now()
	out, err = cmd.Output()
	if err != nil {
		t.Fatalf("curl upload: %v: %s", err, stderr.Bytes())
	}
	if want := fmt.Sprintf("%d %s\n", big, streamSum(big)); string(out) != want {
		t.Fatalf("upload: server saw %q, want %q", out, want)
	}
	t.Logf("%d MiB up in %v", big>>20, time.Since(start).Round(time.Millisecond))
}

// kernelHTTPServer serves handler from an http.Server on net in host h
// (the kernel's TCP) until the test ends, and returns its address.
func kernelHTTPServer(t *testing.T, h *Host) string {
	t.Helper()
	var ln net.Listener
	if err := h.Do(func() (err error) { ln, err = net.Listen("tcp", h.Iface0().Addr().String()+":0"); return }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler(), ConnContext: connContext}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestHTTPClientKernelServer fetches from a kernel http.Server (host b)
// with an http.Client whose transport dials through sockets (host a).
func TestHTTPClientKernelServer(t *testing.T) {
	RequireRoot(t)
	a, b := Pair(t, LinkOptions{})
	p := startHelper(t, a, "http-client", "HTTP_URL=http://"+kernelHTTPServer(t, b))
	if err := p.wait(3 * time.Minute); err != nil {
		t.Fatal(err)
	}
}
