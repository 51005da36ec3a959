package tracing

import (
	"context"
	"log/slog"
	"net"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ScopeName is the instrumentation scope of shardhost's spans (the module
// path, like its meter's).
const ScopeName = "github.com/shardhost/shardhost"

// System is the value of rpc.system on shardhost's spans.
const System = "shardhost"

// The attribute keys of shardhost's spans: OpenTelemetry's RPC semantic
// conventions where they fit, shardhost's own under "shardhost.". The
// runner documents them in docs/observability.md; a test
// checks that every key here is in that table.
const (
	KeyRPCSystem      = attribute.Key("rpc.system")
	KeyRPCService     = attribute.Key("rpc.service")
	KeyRPCMethod      = attribute.Key("rpc.method")
	KeyServerAddress  = attribute.Key("server.address")
	KeyServerPort     = attribute.Key("server.port")
	KeyErrorType      = attribute.Key("error.type")
	KeyRunner         = attribute.Key("shardhost.runner")
	KeyEntity         = attribute.Key("shardhost.entity")
	KeyShard          = attribute.Key("shardhost.shard")
	KeyOneWay         = attribute.Key("shardhost.one_way")
	KeyOwner          = attribute.Key("shardhost.owner")
	KeyAttempts       = attribute.Key("shardhost.attempts")
	KeyAttempt        = attribute.Key("shardhost.attempt")
	KeyRetryReason    = attribute.Key("shardhost.retry.reason")
	KeySender         = attribute.Key("shardhost.sender")
	KeyEpoch          = attribute.Key("shardhost.epoch")
	KeyTick           = attribute.Key("shardhost.tick")
	KeyActivateReason = attribute.Key("shardhost.activate.reason")
	KeyActivateWarmed = attribute.Key("shardhost.activate.warmed")
	KeyRestoreFound   = attribute.Key("shardhost.restore.found")
	KeyRestoreBytes   = attribute.Key("shardhost.restore.bytes")
	KeyPeer           = attribute.Key("shardhost.peer")
	KeyPeerEpoch      = attribute.Key("shardhost.peer.epoch")
	KeyOutcome        = attribute.Key("shardhost.outcome")
	KeyWarmed         = attribute.Key("shardhost.warmed")
	KeyShards         = attribute.Key("shardhost.shards")
	KeyShardCount     = attribute.Key("shardhost.shard_count")
	KeyDetachReason   = attribute.Key("shardhost.detach.reason")
	KeyLease          = attribute.Key("shardhost.lease")
	KeyLeaseDeadline  = attribute.Key("shardhost.lease.deadline")
	KeyLeaseNew       = attribute.Key("shardhost.lease.new")
	KeyRunning        = attribute.Key("shardhost.running")
)

// Keys lists every attribute key above (the documentation test's list).
var Keys = []attribute.Key{
	KeyRPCSystem, KeyRPCService, KeyRPCMethod, KeyServerAddress, KeyServerPort, KeyErrorType,
	KeyRunner, KeyEntity, KeyShard, KeyOneWay, KeyOwner, KeyAttempts, KeyAttempt, KeyRetryReason,
	KeySender, KeyEpoch, KeyTick, KeyActivateReason, KeyActivateWarmed, KeyRestoreFound, KeyRestoreBytes,
	KeyPeer, KeyPeerEpoch, KeyOutcome, KeyWarmed, KeyShards, KeyShardCount, KeyDetachReason,
	KeyLease, KeyLeaseDeadline, KeyLeaseNew, KeyRunning,
}

// EventRetry is the name of the event a client span gets for each attempt
// that failed in a way that proves no handler ran it and was retried.
const EventRetry = "shardhost.retry"

// The events of the lifecycle spans (see the runner's "Traces"): the
// restore of a checkpoint by an Activate or Warm hook; a sender held at
// the old owner during a cutover; the phases of a handoff on each side;
// the end of a detach's interruption and a re-attachment's steps.
const (
	EventRestore          = "shardhost.restore"
	EventCutoverWait      = "shardhost.cutover_wait"
	EventWarming          = "shardhost.handoff.warming"
	EventWarmed           = "shardhost.handoff.warmed"
	EventWarmTimeout      = "shardhost.handoff.warm_timeout"
	EventReady            = "shardhost.handoff.ready"
	EventAdmissionStopped = "shardhost.handoff.admission_stopped"
	EventDrained          = "shardhost.handoff.drained"
	EventReleaseHook      = "shardhost.handoff.release_shard"
	EventProgress         = "shardhost.handoff.progress_recorded"
	EventEntitiesStopped  = "shardhost.detach.entities_stopped"
	EventRegistered       = "shardhost.reattach.registered"
	EventEpochsBumped     = "shardhost.reattach.epochs_bumped"
)

// Events lists every event name (the documentation test's list).
var Events = []string{
	EventRetry, EventRestore, EventCutoverWait, EventWarming, EventWarmed, EventWarmTimeout, EventReady,
	EventAdmissionStopped, EventDrained, EventReleaseHook, EventProgress, EventEntitiesStopped,
	EventRegistered, EventEpochsBumped,
}

// LifecycleSpans lists the names of the lifecycle spans (the runner's;
// the documentation test's list).
var LifecycleSpans = []string{"handoff warm", "handoff release", "detach", "reattach"}

// The log attribute keys of a record made inside a traced call.
const (
	LogTraceID = "trace_id"
	LogSpanID  = "span_id"
)

// mode says when a Tracer makes spans.
type mode uint8

const (
	off    mode = iota // a no-op provider: never
	on                 // always
	follow             // the global provider's delegating stand-in: once a provider is set globally
)

// Tracer is a runner's tracer and propagator, with the switch that keeps
// tracing free when it is off: callers test On before anything else
// (starting a span with OpenTelemetry's no-op tracer still allocates a
// context), and build attributes only for a span that IsRecording. A nil
// *Tracer is off. Safe for concurrent use.
type Tracer struct {
	tr     trace.Tracer
	prop   propagation.TextMapPropagator
	runner attribute.KeyValue
	mode   mode
	global trace.TracerProvider // followed while it has no delegate (mode follow)
}

// New returns the tracer of runner id on tp, propagating with prop. It is
// off when tp is a no-op provider (noop.TracerProvider), and follows the
// global provider when tp is the global one before any was set
// (otel.GetTracerProvider() before otel.SetTracerProvider): off until a
// program sets one, on from then on.
func New(tp trace.TracerProvider, prop propagation.TextMapPropagator, id string) *Tracer {
	t := &Tracer{tr: tp.Tracer(ScopeName), prop: prop, runner: KeyRunner.String(id), mode: on}
	switch {
	case isNoop(tp):
		t.mode = off
	case IsGlobalStandIn(tp):
		t.mode, t.global = follow, tp
	}
	return t
}

func isNoop(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return true
	}
	// trace.NewNoopTracerProvider (deprecated) returns an unexported type.
	return reflect.TypeOf(tp) == reflect.TypeOf(trace.NewNoopTracerProvider()) //nolint:staticcheck // recognised, not used
}

// IsGlobalStandIn reports whether tp is OpenTelemetry's global provider
// as it is before a program sets one: a stand-in that forwards to the
// provider set later, and makes non-recording spans (allocating) until
// then.
func IsGlobalStandIn(tp trace.TracerProvider) bool {
	t := reflect.TypeOf(tp)
	return t.Kind() == reflect.Pointer && t.Elem().Name() == "tracerProvider" &&
		t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// On reports whether spans are made. It allocates nothing.
func (t *Tracer) On() bool {
	if t == nil {
		return false
	}
	switch t.mode {
	case on:
		return true
	case follow: // on once a program set a provider, unless a no-op one
		tp := otel.GetTracerProvider()
		return tp != t.global && !isNoop(tp)
	}
	return false
}

// Span start options without an allocation per span (a variadic option
// built at the call allocates).
var (
	ClientSpan   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
	ServerSpan   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	InternalSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
	RootSpan     = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal), trace.WithNewRoot()}
)

// Names caches the span names of a key (a handler), made once each.
type Names[K comparable] struct{ m sync.Map }

// Get returns the name of k, made by mk the first time.
func (n *Names[K]) Get(k K, mk func() string) string {
	if v, ok := n.m.Load(k); ok {
		return v.(string)
	}
	v, _ := n.m.LoadOrStore(k, mk())
	return v.(string)
}

// Start starts a span (see trace.Tracer.Start). Call it only when On.
func (t *Tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tr.Start(ctx, name, opts...)
}

// Runner is the shardhost.runner attribute of this runner's spans.
func (t *Tracer) Runner() attribute.KeyValue { return t.runner }

// Inject returns the headers carrying ctx's trace context and baggage
// (nil when the propagator writes none).
func (t *Tracer) Inject(ctx context.Context) map[string]string {
	h := make(propagation.MapCarrier, 2)
	t.prop.Inject(ctx, h)
	if len(h) == 0 {
		return nil
	}
	return h
}

// Extract returns ctx with the trace context and baggage of headers h.
func (t *Tracer) Extract(ctx context.Context, h map[string]string) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return t.prop.Extract(ctx, propagation.MapCarrier(h))
}

// Text returns s as valid UTF-8 (each invalid byte sequence replaced by
// U+FFFD), for the text a span carries that comes from a request — an
// entity ID, a peer's kind, method or runner ID, an error's text: OTLP
// encodes it as a protobuf string, and one span with invalid UTF-8 makes
// the whole batch of spans it is exported with fail to marshal.
func Text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// Call returns the attributes of a call of method of kind to entity id
// in shard (client, server and handler spans), as valid UTF-8 (Text).
func Call(kind, method, id string, shard uint32) []attribute.KeyValue {
	return []attribute.KeyValue{
		KeyRPCSystem.String(System), KeyRPCService.String(Text(kind)), KeyRPCMethod.String(Text(method)),
		KeyEntity.String(Text(id)), KeyShard.Int64(int64(shard)),
	}
}

// Server returns the server.address and server.port of addr (host:port).
func Server(addr string) []attribute.KeyValue {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return []attribute.KeyValue{KeyServerAddress.String(addr)}
	}
	out := []attribute.KeyValue{KeyServerAddress.String(host)}
	if p, err := strconv.Atoi(port); err == nil {
		out = append(out, KeyServerPort.Int(p))
	}
	return out
}

// End ends span with the outcome: err (nil for success) as an error
// status whose description is its text (Text), classified by errType(err) (the
// error.type attribute, low cardinality), called only for an error of a
// span that records.
func End(span trace.Span, err error, errType func(error) string) {
	if err != nil && span.IsRecording() {
		span.SetAttributes(KeyErrorType.String(errType(err)))
		span.SetStatus(codes.Error, Text(err.Error()))
	}
	span.End()
}

// LogHandler wraps h so that a record made with a context carrying a
// valid span context (the *Context methods of slog.Logger) gets the
// trace_id and span_id attributes.
func LogHandler(h slog.Handler) slog.Handler { return logHandler{h} }

type logHandler struct{ slog.Handler }

func (h logHandler) Handle(ctx context.Context, r slog.Record) error {
	if ctx != nil {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			r = r.Clone()
			r.AddAttrs(slog.String(LogTraceID, sc.TraceID().String()), slog.String(LogSpanID, sc.SpanID().String()))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h logHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return logHandler{h.Handler.WithAttrs(as)}
}

func (h logHandler) WithGroup(name string) slog.Handler {
	return logHandler{h.Handler.WithGroup(name)}
}
