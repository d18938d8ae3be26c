package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/xdp-onload/onload/sockets"
)

// config prints the configuration an accelerated process would run with
// (from the ONLOAD_* variables in the environment), or the table of
// variables as docs/config.md.
func config(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("config", flag.ContinueOnError)
	markdown := fs.Bool("markdown", false, "print the table of variables as docs/config.md")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *markdown {
		_, err := io.WriteString(out, sockets.Markdown())
		return err
	}
	cfg, err := sockets.ConfigFromEnv()
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%+v\n", cfg)
	for _, o := range sockets.Options {
		if v, ok := os.LookupEnv(o.Env); ok {
			fmt.Fprintf(out, "  %s=%s (set)\n", o.Env, strings.TrimSpace(v))
		}
	}
	return nil
}
