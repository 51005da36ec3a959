package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/shardhost/shardhost/runner"
)

// The span exporters -trace-exporter chooses.
const (
	exportFile = "file" // OpenTelemetry's stdout exporter, into the file -traces names
	exportOTLP = "otlp" // OTLP over gRPC, to $OTEL_EXPORTER_OTLP_ENDPOINT
)

// traces exports the process's spans, to a file as JSON, one span a line
// (-traces FILE), or over OTLP/gRPC to a collector (-trace-exporter otlp,
// configured by the standard OTEL_EXPORTER_OTLP_* variables), sampling
// -trace-ratio of the requests the process starts (parent-based: a runner
// traces the asks whose gateway sampled them, whatever its own ratio).
// The W3C trace context and baggage ride in the runner-to-runner requests.
type traces struct {
	exporter string // exportFile, exportOTLP, or "" (file when -traces is given, else off)
	file     string
	ratio    float64
}

func (t *traces) register(fs *flag.FlagSet) {
	fs.StringVar(&t.exporter, "trace-exporter", "", "export OpenTelemetry spans with `exporter` "+exportFile+
		" (JSON lines into the -traces file) or "+exportOTLP+
		" (OTLP/gRPC to $OTEL_EXPORTER_OTLP_ENDPOINT, default localhost:4317; http://host:port for no TLS); default: "+exportFile+" with -traces, else tracing off")
	fs.StringVar(&t.file, "traces", "", "export OpenTelemetry spans to `file` (JSON, one span a line; default: tracing off)")
	fs.Float64Var(&t.ratio, "trace-ratio", 0.01, "with tracing on: the share of requests traced (0 to 1)")
}

// check validates the flags and resolves the default exporter.
func (t *traces) check() error {
	if t.exporter == "" && t.file != "" {
		t.exporter = exportFile
	}
	switch t.exporter {
	case "":
		return nil
	case exportFile:
		if t.file == "" {
			return errors.New("-trace-exporter " + exportFile + ": name the file with -traces")
		}
	case exportOTLP:
		if t.file != "" {
			return fmt.Errorf("-traces %s: a file is for -trace-exporter %s, not %s", t.file, exportFile, exportOTLP)
		}
	default:
		return fmt.Errorf("-trace-exporter %q: want %s or %s", t.exporter, exportFile, exportOTLP)
	}
	if t.ratio < 0 || t.ratio > 1 {
		return fmt.Errorf("-trace-ratio %v: want 0 to 1", t.ratio)
	}
	return nil
}

// setup makes cfg trace through the chosen exporter; the returned
// shutdown flushes the spans not exported yet (and closes the file).
// With tracing off it does nothing. t must have passed check.
func (t traces) setup(ctx context.Context, cfg *runner.Config) (shutdown func(context.Context) error, err error) {
	var (
		exp       sdktrace.SpanExporter
		closeFile = func() error { return nil }
	)
	switch t.exporter {
	case "":
		return func(context.Context) error { return nil }, nil
	case exportFile:
		f, err := os.OpenFile(t.file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("traces: %w", err)
		}
		if exp, err = stdouttrace.New(stdouttrace.WithWriter(f)); err != nil {
			f.Close()
			return nil, fmt.Errorf("traces: %w", err)
		}
		closeFile = f.Close
	case exportOTLP:
		// The endpoint, TLS, headers, timeout and compression come from
		// the OTEL_EXPORTER_OTLP_[TRACES_]* variables. The connection is
		// made on the first export: no collector up yet is no error here.
		if exp, err = otlptracegrpc.New(ctx); err != nil {
			return nil, fmt.Errorf("traces: OTLP exporter: %w", err)
		}
	default:
		return nil, fmt.Errorf("traces: exporter %q", t.exporter)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.ratio))),
		sdktrace.WithResource(resource.NewSchemaless(
			attribute.String("service.name", "shardhost-cluster"), attribute.String("service.instance.id", cfg.ID))),
	)
	cfg.TracerProvider = tp
	cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return func(ctx context.Context) error { return errors.Join(tp.Shutdown(ctx), closeFile()) }, nil
}
