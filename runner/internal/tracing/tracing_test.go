package tracing

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

var w3c = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// globalSetHere is the provider TestOnFollowsTheProvider set globally.
var globalSetHere trace.TracerProvider

// TestOnFollowsTheProvider: a no-op provider is off; an SDK provider is
// on; the global provider is off while no program set one and on from
// the moment one is set (the runner made before included); On allocates
// nothing in any of these.
//
// It sets the process's global provider, which cannot be unset: no other
// test of this package may depend on it, and a second run in the same
// process (-count 2) finds it set and skips.
func TestOnFollowsTheProvider(t *testing.T) {
	sdk := sdktrace.NewTracerProvider()
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	global := otel.GetTracerProvider()
	if globalSetHere != nil && global == globalSetHere {
		t.Skip("the global provider was set by an earlier run of this test in this process")
	}
	if !IsGlobalStandIn(global) {
		t.Fatalf("the global provider before any was set is a %T: not recognised as the stand-in (has OpenTelemetry changed it?)", global)
	}
	cases := []struct {
		name string
		tp   trace.TracerProvider
		on   bool
	}{
		{"noop", noop.NewTracerProvider(), false},
		{"noop pointer", new(noop.TracerProvider), false},
		{"deprecated noop", trace.NewNoopTracerProvider(), false}, //nolint:staticcheck // recognised as off
		{"global, unset", global, false},
		{"sdk", sdk, true},
	}
	tracers := map[string]*Tracer{}
	for _, c := range cases {
		tr := New(c.tp, w3c, "r")
		tracers[c.name] = tr
		if got := tr.On(); got != c.on {
			t.Errorf("%s: On() = %v, want %v", c.name, got, c.on)
		}
		if n := testing.AllocsPerRun(100, func() { tr.On() }); n != 0 {
			t.Errorf("%s: On() allocates %v times", c.name, n)
		}
	}
	if (*Tracer)(nil).On() {
		t.Error("a nil Tracer is on")
	}

	rec := tracetest.NewSpanRecorder()
	set := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = set.Shutdown(context.Background()) }()
	otel.SetTracerProvider(set)
	globalSetHere = set
	tr := tracers["global, unset"]
	if !tr.On() {
		t.Fatal("the global provider's tracer is still off after otel.SetTracerProvider")
	}
	_, span := tr.Start(context.Background(), "after")
	span.End()
	if got := rec.Ended(); len(got) != 1 || got[0].Name() != "after" {
		t.Errorf("spans recorded by the provider set later: %v", got)
	}
	if n := testing.AllocsPerRun(100, func() { tr.On() }); n != 0 {
		t.Errorf("On() of the global provider, set, allocates %v times", n)
	}
	if tracers["noop"].On() {
		t.Error("a no-op provider's tracer turned on with the global provider")
	}
}

// TestHeadersCarryTheSpan: the headers Inject writes carry a span's
// context and baggage to Extract; a context with neither writes none.
func TestHeadersCarryTheSpan(t *testing.T) {
	sdk := sdktrace.NewTracerProvider()
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	tr := New(sdk, w3c, "r")
	if h := tr.Inject(context.Background()); h != nil {
		t.Errorf("Inject(no span) = %v, want nil", h)
	}
	ctx, span := tr.Start(context.Background(), "s")
	defer span.End()
	h := tr.Inject(ctx)
	if !strings.HasPrefix(h["traceparent"], "00-"+span.SpanContext().TraceID().String()) {
		t.Fatalf("Inject = %v, want the traceparent of %v", h, span.SpanContext())
	}
	got := trace.SpanContextFromContext(tr.Extract(context.Background(), h))
	if got.TraceID() != span.SpanContext().TraceID() || got.SpanID() != span.SpanContext().SpanID() || !got.IsRemote() {
		t.Errorf("Extract(%v) = %v, want the remote %v", h, got, span.SpanContext())
	}
}

// TestEndRecordsTheOutcome: an error ends a span with an error status,
// the error's text and error.type; success leaves the status unset.
func TestEndRecordsTheOutcome(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	tr := New(sdk, w3c, "r")
	_, ok := tr.Start(context.Background(), "ok")
	End(ok, nil, func(error) string { t.Error("error.type asked of a success"); return "" })
	_, bad := tr.Start(context.Background(), "bad")
	End(bad, errors.New("it broke"), func(error) string { return "handler_error" })
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended", len(spans))
	}
	if spans[0].Status().Code != codes.Unset || len(spans[0].Attributes()) != 0 {
		t.Errorf("a success: status %v, attributes %v", spans[0].Status(), spans[0].Attributes())
	}
	if st := spans[1].Status(); st.Code != codes.Error || st.Description != "it broke" {
		t.Errorf("a failure: status %v", st)
	}
	if a := spans[1].Attributes(); len(a) != 1 || a[0] != KeyErrorType.String("handler_error") {
		t.Errorf("a failure: attributes %v, want error.type", a)
	}
}

// TestLogHandlerAddsTraceIDs: a record made with a context carrying a
// valid span context gets trace_id and span_id, in groups and with
// attributes too; one made without does not.
func TestLogHandlerAddsTraceIDs(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(LogHandler(slog.NewTextHandler(&buf, nil))).With("runner", "a")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: [16]byte{1}, SpanID: [8]byte{2}, TraceFlags: trace.FlagsSampled})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "traced")
	log.Info("plain")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("lines: %q", lines)
	}
	want := "trace_id=" + sc.TraceID().String() + " span_id=" + sc.SpanID().String()
	if !strings.Contains(lines[0], want) || !strings.Contains(lines[0], "runner=a") {
		t.Errorf("traced line %q, want %q and runner=a", lines[0], want)
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("untraced line %q has a trace ID", lines[1])
	}
}

// BenchmarkOn: the cost of the switch every traced path tests first, per
// mode (the global provider unset: the default).
func BenchmarkOn(b *testing.B) {
	for _, c := range []struct {
		name string
		tp   trace.TracerProvider
	}{{"noop", noop.NewTracerProvider()}, {"global-unset", otel.GetTracerProvider()}} {
		b.Run(c.name, func(b *testing.B) {
			tr := New(c.tp, w3c, "r")
			if tr.On() {
				b.Skip("the global provider was set by another test")
			}
			b.ReportAllocs()
			for b.Loop() {
				if tr.On() {
					b.Fatal("on")
				}
			}
		})
	}
}
