package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/shardhost/shardhost/runner"
)

// traces exports the process's spans as JSON, one span a line, to the
// file -traces names, sampling -trace-ratio of the requests the process
// starts (parent-based: a runner traces the asks whose gateway sampled
// them, whatever its own ratio). The W3C trace context and baggage ride
// in the runner-to-runner requests.
type traces struct {
	file  string
	ratio float64
}

// setup makes cfg trace into t.file; the returned shutdown flushes the
// spans not exported yet and closes the file. Without -traces it does
// nothing.
func (t traces) setup(cfg *runner.Config) (shutdown func(context.Context) error, err error) {
	if t.file == "" {
		return func(context.Context) error { return nil }, nil
	}
	if t.ratio < 0 || t.ratio > 1 {
		return nil, fmt.Errorf("-trace-ratio %v: want 0 to 1", t.ratio)
	}
	f, err := os.OpenFile(t.file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("traces: %w", err)
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("traces: %w", err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.ratio))),
		sdktrace.WithResource(resource.NewSchemaless(
			attribute.String("service.name", "shardhost-cluster"), attribute.String("service.instance.id", cfg.ID))),
	)
	cfg.TracerProvider = tp
	cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return func(ctx context.Context) error { return errors.Join(tp.Shutdown(ctx), f.Close()) }, nil
}
