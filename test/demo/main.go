// Command demo shows the product on two test hosts: steering of
// registered ports into an AF_XDP socket while everything else still
// reaches the kernel; then one Go server, written against net.Listener,
// served by the standard net package and by package sockets, measured by
// the same kernel client, in a table; then a short floor benchmark.
// `make demo` runs it as root.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/xdp-onload/onload/test"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n== "+format+"\n", args...) }

func run() error {
	bin := filepath.Dir(os.Args[0])
	onloadd := flag.String("onloadd", filepath.Join(bin, "onloadd"), "onloadd binary")
	bench := flag.String("bench", filepath.Join(bin, "onload-bench"), "bench binary: the client of the sockets demo and the floor ('' to skip both)")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("the demo makes network namespaces and attaches XDP programs: run it as root")
	}

	n, a, b, err := test.NewPair(test.LinkOptions{})
	if err != nil {
		return err
	}
	defer func() {
		n.Close()
		step("Test hosts torn down.")
	}()
	ia, ib := a.Iface0(), b.Iface0()
	step("Two test hosts, a (%s) and b (%s), joined by a veth pair", ia.Addr(), ib.Addr())

	// b's kernel serves TCP on 8080.
	echo, err := b.KernelEcho(ib.Addr().String() + ":8080")
	if err != nil {
		return err
	}
	defer echo.Close()

	step("b: onloadd capture steers UDP 7000 and TCP 7001 into an AF_XDP socket")
	capture := b.Command(*onloadd, "capture", "-iface", ib.Name, "-udp", "7000", "-tcp", "7001", "-duration", "3s")
	out, err := capture.StdoutPipe()
	if err != nil {
		return err
	}
	capture.Stderr = os.Stderr
	if err := capture.Start(); err != nil {
		return fmt.Errorf("start onloadd: %w", err)
	}
	ready := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(out)
		first := true
		for sc.Scan() {
			fmt.Printf("   b| %s\n", sc.Text())
			if first {
				close(ready)
				first = false
			}
		}
		if first {
			close(ready)
		}
	}()
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		capture.Process.Kill()
		return errors.New("onloadd capture did not start")
	}
	time.Sleep(100 * time.Millisecond)

	bAddr := ib.Addr().String()
	step("a -> b: ping (not steered: b's kernel answers)")
	if out, err := a.Run("ping", "-c", "3", "-i", "0.2", "-W", "1", bAddr); err != nil {
		return err
	} else {
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.Contains(l, "received") || strings.Contains(l, "bytes from") {
				fmt.Printf("   a| %s\n", l)
			}
		}
	}
	time.Sleep(50 * time.Millisecond)

	step("a -> b: a UDP datagram to port 7000 (steered: it lands in the AF_XDP socket)")
	err = a.Do(func() error {
		c, err := net.Dial("udp", bAddr+":7000")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hello from a, over AF_XDP"))
		return err
	})
	if err != nil {
		return err
	}
	time.Sleep(50 * time.Millisecond)

	step("a -> b: TCP connect to port 7001 (steered: the SYN lands in the socket, b's kernel never sees it)")
	err = a.Do(func() error {
		_, err := net.DialTimeout("tcp", bAddr+":7001", 500*time.Millisecond)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			fmt.Println("   a| connect timed out: a bare AF_XDP socket does not speak TCP (the stack below does)")
			return nil
		}
		return fmt.Errorf("connect to the steered port: %v (want a timeout)", err)
	})
	if err != nil {
		return err
	}

	step("a -> b: TCP to port 8080 (not steered: b's kernel answers)")
	err = a.Do(func() error {
		c, err := net.DialTimeout("tcp", bAddr+":8080", 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		msg := "hello, b's kernel"
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		buf := make([]byte, len(msg))
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		fmt.Printf("   a| echoed by b's kernel: %q\n", buf)
		return nil
	})
	if err != nil {
		return err
	}

	step("b: onloadd capture stops and prints the steering counters")
	err = capture.Wait()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("onloadd capture: %w", err)
	}
	fmt.Println("   (redirect_listener: the datagram and the SYN; pass_other_proto: the pings;")
	fmt.Println("    pass_no_match: the TCP connection to 8080; pass_not_unicast: IPv6 neighbour discovery)")

	if *bench == "" {
		return nil
	}
	if err := socketsDemo(a, b, *bench); err != nil {
		return err
	}
	step("The floor: 64-byte round trips over the same kind of veth pair (short run; `make bench` for the full one)")
	cmd := exec.Command(*bench, "-rounds", "3", "-count", "20000", "-api-rounds", "0", "-out", "")
	cmd.Stdout, cmd.Stderr = os.Stdout, io.Discard
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("floor benchmark: %w", err)
	}
	return nil
}
