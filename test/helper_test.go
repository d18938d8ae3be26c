package test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Helper processes: the test binary run again inside a host (`ip netns
// exec`), as a program of its own, so that what it does goes through the
// process's default stack exactly as an application's would. TestMain
// runs the helper named by ONLOAD_TEST_HELPER instead of the tests.

// helpers are the helper programs by name. A helper prints "READY <info>"
// on stdout when the test may go on, and exits 0 when it succeeded.
var helpers = map[string]func() error{}

func TestMain(m *testing.M) {
	if name := os.Getenv("ONLOAD_TEST_HELPER"); name != "" {
		fn, ok := helpers[name]
		if !ok {
			fmt.Fprintf(os.Stderr, "no helper %q\n", name)
			os.Exit(2)
		}
		if err := fn(); err != nil {
			fmt.Fprintf(os.Stderr, "helper %s: %v\n", name, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// helperProc is a running helper process.
type helperProc struct {
	cmd    *exec.Cmd
	Info   string         // what it printed after READY
	In     io.WriteCloser // the helper's standard input
	stdout *bufio.Reader
	stderr strings.Builder
	done   chan error
	lines  chan string // what it printed after READY
}

// line returns the next line the helper printed after READY.
func (p *helperProc) line(timeout time.Duration) (string, error) {
	select {
	case l := <-p.lines:
		return l, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("the helper said nothing for %v", timeout)
	}
}

// startHelper runs helper name in host h with extra environment and waits
// (up to 20s) for it to say READY. It is killed when the test ends.
func startHelper(t *testing.T, h *Host, name string, env ...string) *helperProc {
	t.Helper()
	return runHelper(t, h.Command(os.Args[0], "-test.run=^$"), name, env...)
}

// startHelperAs runs helper name as uid (its group the same number), with
// no capabilities, from bin (a copy of the test binary that uid can
// read: `go test` keeps its own in a directory only root can).
func startHelperAs(t *testing.T, h *Host, uid int, bin, name string, env ...string) *helperProc {
	t.Helper()
	id := fmt.Sprint(uid)
	return runHelper(t, h.Command("setpriv", "--reuid", id, "--regid", id, "--clear-groups",
		"--inh-caps=-all", "--bounding-set=-all", bin, "-test.run=^$"), name, env...)
}

func runHelper(t *testing.T, cmd *exec.Cmd, name string, env ...string) *helperProc {
	t.Helper()
	p := &helperProc{done: make(chan error, 1), cmd: cmd, lines: make(chan string, 64)}
	p.cmd.Env = append(append(os.Environ(), "ONLOAD_TEST_HELPER="+name), env...)
	if testing.Short() {
		p.cmd.Env = append(p.cmd.Env, "ONLOAD_TEST_SHORT=1")
	}
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.In, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("helper %s stderr:\n%s", name, p.stderr.String())
		}
	})
	p.stdout = bufio.NewReader(out)
	ready := make(chan string, 1)
	go func() {
		for {
			line, err := p.stdout.ReadString('\n')
			if info, ok := strings.CutPrefix(strings.TrimSpace(line), "READY"); ok {
				ready <- strings.TrimSpace(info)
				// What it says afterwards, for line (dropped if nobody
				// reads it).
				for {
					line, err := p.stdout.ReadString('\n')
					if line != "" {
						select {
						case p.lines <- strings.TrimSpace(line):
						default:
						}
					}
					if err != nil {
						break
					}
				}
				break
			}
			if err != nil {
				break
			}
		}
		p.done <- p.cmd.Wait()
	}()
	select {
	case p.Info = <-ready:
	case err := <-p.done:
		p.done <- err
		t.Fatalf("helper %s exited before it was ready: %v\n%s", name, err, p.stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("helper %s not ready after 20s\n%s", name, p.stderr.String())
	}
	return p
}

// wait waits (up to timeout) for the helper to exit and returns its error.
func (p *helperProc) wait(timeout time.Duration) error {
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			return fmt.Errorf("%v: %s", err, strings.TrimSpace(p.stderr.String()))
		}
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("helper still running after %v", timeout)
	}
}
