package runner

import (
	"log/slog"

	"github.com/shardhost/shardhost/runner/internal/tracing"
)

// newTracer returns the runner's tracer (Config.TracerProvider and
// Config.Propagator; see "Traces" in the package doc). It warns when
// tracing is on while the propagator carries nothing: the runners' spans
// of one call would then be traces of their own.
func newTracer(cfg Config, log *slog.Logger) *tracing.Tracer {
	t := tracing.New(cfg.TracerProvider, cfg.Propagator, cfg.ID)
	if t.On() && len(cfg.Propagator.Fields()) == 0 {
		log.Warn("tracing is on but the propagator carries nothing: the spans of a call on other runners start traces of their own; " +
			"set Config.Propagator (or otel.SetTextMapPropagator) to propagation.TraceContext{}")
	}
	return t
}
