// Package demo holds what the example commands share: an embedded etcd,
// runners that each have their own etcd client as they would in their own
// process, waiting for their shards to settle, and the commands' common
// flags, output, loggers and exit codes.
package demo

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// RegisterFlags registers the flags every demo takes: -etcd, the endpoint
// of an existing etcd ("" starts an embedded one), and -v.
func RegisterFlags(etcd *string, verbose *bool) {
	flag.StringVar(etcd, "etcd", "", "use the etcd at `host:port` instead of starting an embedded one")
	flag.BoolVar(verbose, "v", false, "show the runners' info logs and the etcd client's warnings")
}

// Main parses the command line and calls run with a context that ends on
// SIGINT or SIGTERM. It exits with status 1 if run returns an error, which
// it prints on stderr after "name: ", or reports problems.
func Main(name string, run func(context.Context) (problems bool, err error)) {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	problems, err := run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
	if problems {
		os.Exit(1)
	}
}

// Say returns a function that prints a line to w like fmt.Fprintf,
// prefixed with the seconds since Say was called: "[  1.2s] ".
func Say(w io.Writer) func(format string, args ...any) {
	start := time.Now()
	return func(format string, args ...any) {
		fmt.Fprintf(w, "[%5.1fs] "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
}

// NewLogger returns the runners' logger: errors only unless verbose.
func NewLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelError
	if verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// Round rounds d for display: to 10ms from 1s, to 1ms from 10ms, else to
// 10µs.
func Round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}

// Sleep waits for d, or returns ctx's cause if ctx ends first.
func Sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}
