// Command waterfall draws one trace of the span files that examples/cluster
// writes with -traces (OpenTelemetry's stdout exporter: JSON, one span a
// line, a file per process) as a self-contained HTML page: an inline SVG
// waterfall with one row per span, indented under its parent, a bar from
// its start to its end on the trace's time axis, coloured by the process
// that recorded it (the resource's service.instance.id), error spans
// marked, and the attributes and events in each row's tooltip.
//
//	cd examples && go run ./cluster/waterfall -o trace.html /tmp/spans-*.jsonl
//
// Without -trace it draws the trace that crosses the most processes, then
// has the most spans, then took the longest; the page lists the next ones
// with their IDs for -trace. Flags may follow the files.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Errors of the command line and the files.
var (
	ErrNoSpans      = errors.New("waterfall: no span in the files")
	ErrUnknownTrace = errors.New("waterfall: no span of that trace in the files")
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "waterfall:", err)
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// run parses args (flags before, between or after the files), reads the
// files, and writes the chosen trace's page; it logs one line to log.
func run(args []string, log io.Writer) error {
	fs := flag.NewFlagSet("waterfall", flag.ContinueOnError)
	fs.SetOutput(log)
	out := fs.String("o", "trace.html", "write the page to `file` (- for stdout)")
	traceID := fs.String("trace", "", "draw the trace with this `ID` (32 hex digits; default: the one crossing the most processes, then with the most spans, then the slowest)")
	fs.Usage = func() {
		fmt.Fprintln(log, "usage: waterfall [-o trace.html] [-trace ID] SPANS.jsonl...")
		fs.PrintDefaults()
	}
	var files []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		files = append(files, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(files) == 0 {
		fs.Usage()
		return fmt.Errorf("no span file given: %w", flag.ErrHelp)
	}
	var spans []Span
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return err
		}
		s, err := readSpans(f, strings.TrimSuffix(filepath.Base(name), filepath.Ext(name)))
		f.Close()
		if err != nil {
			return err
		}
		spans = append(spans, s...)
	}
	traces := groupTraces(spans)
	if len(traces) == 0 {
		return ErrNoSpans
	}
	pick := 0
	if *traceID != "" {
		pick = -1
		for i, t := range traces {
			if t.ID == strings.ToLower(*traceID) {
				pick = i
			}
		}
		if pick < 0 {
			return fmt.Errorf("%w: %s (%d traces)", ErrUnknownTrace, *traceID, len(traces))
		}
	}
	t := traces[pick]
	others := append(traces[:pick:pick], traces[pick+1:]...)

	w := os.Stdout
	if *out != "-" {
		f, err := os.Create(*out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if err := render(w, t, others, files); err != nil {
		return err
	}
	if w != os.Stdout {
		if err := w.Close(); err != nil {
			return err
		}
	}
	fmt.Fprintf(log, "trace %s (%s): %d spans across %d processes (%s), %s; %d traces in the files; wrote %s\n",
		t.ID, t.Root().Name, len(t.Spans), len(t.Processes), strings.Join(t.Processes, ", "), formatDuration(t.Duration()), len(traces), *out)
	return nil
}
