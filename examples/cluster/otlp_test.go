package main

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// otlpReceiver is the trace service of an OTLP collector on loopback: it
// keeps the spans of every export request, with their resource's
// service.instance.id.
type otlpReceiver struct {
	collectortrace.UnimplementedTraceServiceServer
	mu       sync.Mutex
	spans    []*tracepb.Span
	instance map[*tracepb.Span]string
	requests int
}

func (o *otlpReceiver) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.requests++
	for _, rs := range req.GetResourceSpans() {
		inst := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.instance.id" {
				inst = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				o.spans = append(o.spans, s)
				o.instance[s] = inst
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestTraceExporterOTLPSendsSpansToCollector runs a runner configured by
// the command line -trace-exporter otlp -trace-ratio 1, with the collector's
// address in OTEL_EXPORTER_OTLP_ENDPOINT (an OTLP/gRPC trace service on
// loopback, in the test): a relay's spans arrive there when the process
// flushes, as one trace — the relay's client span, its handler's span,
// the handler's own ask to the other counter and that one's handler span,
// each the child of the one before — under the runner's
// service.instance.id.
func TestTraceExporterOTLPSendsSpansToCollector(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{instance: map[*tracepb.Span]string{}}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, recv)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String()) // http: no TLS
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")                     // empty: ignored, as unset

	c, err := parseFlags([]string{"-id", "runner-1", "-trace-exporter", "otlp", "-trace-ratio", "1"})
	if err != nil {
		t.Fatal(err)
	}
	cfg := runner.Config{ID: c.id, NumShards: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	flush, err := c.traces.setup(t.Context(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New()
	defer store.Cluster().Close()
	r, err := runner.New(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(CounterKind); err != nil {
		t.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- r.Run(context.Background()) }()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := Relay.Ask(ctx, r, "counter-9", RelayReq{To: "counter-10"})
	if err != nil || resp.Value != 1 || resp.Runner != "runner-1" || resp.ToRunner != "runner-1" {
		t.Fatalf("relay counter-9 -> counter-10 = %+v, %v; want value 1 served by runner-1", resp, err)
	}
	if _, err := Relay.Ask(ctx, r, "counter-10", RelayReq{To: "counter-9"}); err == nil {
		t.Errorf("relay counter-10 -> counter-9 succeeded; want %v", ErrRelayOrder)
	}
	if err := r.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-ran
	if err := flush(ctx); err != nil {
		t.Fatalf("flushing the spans to the collector: %v", err)
	}

	recv.mu.Lock()
	defer recv.mu.Unlock()
	t.Logf("the collector received %d spans in %d export requests", len(recv.spans), recv.requests)
	for _, s := range recv.spans {
		if inst := recv.instance[s]; inst != "runner-1" {
			t.Errorf("span %s from service.instance.id %q, want runner-1", s.GetName(), inst)
		}
	}
	// The first relay's chain, root first (the second relay, refused by
	// its handler, is a trace of its own with an error status).
	chain := []struct {
		name string
		kind tracepb.Span_SpanKind
	}{
		{"counter/relay", tracepb.Span_SPAN_KIND_CLIENT},
		{"handle counter/relay", tracepb.Span_SPAN_KIND_INTERNAL},
		{"counter/inc", tracepb.Span_SPAN_KIND_CLIENT},
		{"handle counter/inc", tracepb.Span_SPAN_KIND_INTERNAL},
	}
	var root *tracepb.Span
	for _, s := range recv.spans {
		if s.GetName() == chain[0].name && len(s.GetParentSpanId()) == 0 && s.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			root = s
		}
	}
	if root == nil {
		t.Fatalf("no successful root span %q among the %d spans received", chain[0].name, len(recv.spans))
	}
	parent := root
	for _, want := range chain[1:] {
		var got *tracepb.Span
		for _, s := range recv.spans {
			if s.GetName() == want.name && string(s.GetParentSpanId()) == string(parent.GetSpanId()) {
				got = s
			}
		}
		if got == nil {
			t.Fatalf("no span %q child of %q (%s) in trace %s", want.name, parent.GetName(), hex.EncodeToString(parent.GetSpanId()), hex.EncodeToString(root.GetTraceId()))
		}
		if got.GetKind() != want.kind || string(got.GetTraceId()) != string(root.GetTraceId()) {
			t.Errorf("span %q: kind %v in trace %s, want %v in %s", want.name, got.GetKind(), hex.EncodeToString(got.GetTraceId()), want.kind, hex.EncodeToString(root.GetTraceId()))
		}
		parent = got
	}
}

// TestTraceFlags checks how the tracing flags choose the exporter, and
// that a contradictory or unknown choice is an error naming the flag.
func TestTraceFlags(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		exporter string // "" when off
		err      string // a substring of the error, "" for none
	}{
		{nil, "", ""},
		{[]string{"-traces", "spans.jsonl"}, exportFile, ""},
		{[]string{"-trace-exporter", "file", "-traces", "spans.jsonl"}, exportFile, ""},
		{[]string{"-trace-exporter", "otlp"}, exportOTLP, ""},
		{[]string{"-trace-exporter", "file"}, "", "-traces"},
		{[]string{"-trace-exporter", "otlp", "-traces", "spans.jsonl"}, "", "-traces spans.jsonl"},
		{[]string{"-trace-exporter", "zipkin"}, "", `-trace-exporter "zipkin"`},
		{[]string{"-trace-exporter", "otlp", "-trace-ratio", "1.5"}, "", "-trace-ratio"},
		{[]string{"-relay-ratio", "-0.1"}, "", "-relay-ratio"},
	} {
		c, err := parseFlags(tc.args)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("parseFlags(%q) = %v, want no error", tc.args, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseFlags(%q) = %v, want an error about %s", tc.args, err, tc.err)
		case tc.err == "" && c.traces.exporter != tc.exporter:
			t.Errorf("parseFlags(%q): exporter %q, want %q", tc.args, c.traces.exporter, tc.exporter)
		}
	}
}
