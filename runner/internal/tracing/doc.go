// Package tracing holds what a runner's parts share to trace calls with
// OpenTelemetry: the runner's tracer and propagator (Tracer), the span
// attribute keys (documented with the runner), the classification of an
// outcome as an error status, and the slog handler that puts the trace
// and span IDs on the records made inside a traced call.
//
// It guarantees that tracing is free when it is off: Tracer.On is a load
// or two, allocates nothing, and is what every traced path tests first;
// spans' attributes are built only for spans that record (sampled in).
// It starts no goroutine and holds no state but its configuration.
package tracing
