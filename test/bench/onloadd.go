package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/xdp-onload/onload/daemon"
)

// onloaddMain runs onloadd (package daemon, as `onloadd serve` does) on
// control socket -socket until it is signalled.
func onloaddMain(args []string) error {
	fs := flag.NewFlagSet("onloadd", flag.ExitOnError)
	sock := fs.String("socket", "", "the control socket")
	fs.Parse(args)
	d, err := daemon.New(daemon.Config{Socket: *sock, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	err = d.Serve(ctx)
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
