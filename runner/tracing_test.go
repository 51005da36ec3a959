package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// startTraced starts a runner owning every shard of the memory cluster c,
// hosting tracees, traced into s.
func startTraced(t *testing.T, c *memory.Cluster, s *spans, cfg runner.Config) *started {
	t.Helper()
	r := start(t, c, nil, s.traced(t, cfg))
	if err := r.Register(traceeKind); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the runner owns its shards", func() bool { return len(r.Owned()) == cfg.NumShards })
	return r
}

// TestLocalAskTraced: an ask to an entity of the sender's own runner is a
// client span, with the handler's span as its child and the entity's
// activation as the handler's child; the handler's context carries its
// span, so the ask it makes joins the trace; an ask whose handler panics
// ends its spans with an error status, and the runner's log record of the
// panic carries the handler span's trace and span IDs.
func TestLocalAskTraced(t *testing.T) {
	c := memory.NewCluster()
	defer c.Close()
	s := newSpans(t)
	var lc logCapture
	r := startTraced(t, c, s, runner.Config{ID: "a", NumShards: 4, Logger: lc.logger(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if _, err := traceeRelay.Ask(ctx, r, "x", relayReq{To: "y"}); err != nil {
		t.Fatal(err)
	}
	client := s.waitEnded(t, "the client span", func(sp sdktrace.ReadOnlySpan) bool {
		return named("tracee/relay", trace.SpanKindClient, "a")(sp) && spanAttr(sp, "shardhost.entity") == "x"
	})
	// Every span of a handler ends before its asker's: the trace is
	// complete when the ask returned.
	got := s.trace(client.SpanContext().TraceID())
	if len(got) != 6 { // client, handler, activation; the same for y
		t.Fatalf("trace of the ask has %d spans, want 6:%s", len(got), describe(got))
	}
	byName := map[string][]sdktrace.ReadOnlySpan{}
	for _, sp := range got {
		byName[sp.Name()+"/"+spanAttr(sp, "shardhost.entity")] = append(byName[sp.Name()+"/"+spanAttr(sp, "shardhost.entity")], sp)
	}
	one := func(name string) sdktrace.ReadOnlySpan {
		if len(byName[name]) != 1 {
			t.Fatalf("%d spans %q in the trace:%s", len(byName[name]), name, describe(got))
		}
		return byName[name][0]
	}
	hx, ax := one("handle tracee/relay/x"), one("activate tracee/x")
	cy, hy, ay := byName["tracee/relay/y"], one("handle tracee/relay/y"), one("activate tracee/y")
	if client.Parent().IsValid() {
		t.Errorf("the client span of an ask made without a span has parent %v", client.Parent())
	}
	childOf(t, hx, client)
	childOf(t, ax, hx)
	if len(cy) != 1 || cy[0].SpanKind() != trace.SpanKindClient {
		t.Fatalf("no client span of the handler's ask to y:%s", describe(got))
	}
	childOf(t, cy[0], hx)
	childOf(t, hy, cy[0])
	childOf(t, ay, hy)
	hasAttrs(t, client, "rpc.system", "shardhost", "rpc.service", "tracee", "rpc.method", "relay", "shardhost.runner", "a",
		"shardhost.attempts", "1", "shardhost.owner", "a", "shardhost.one_way", "false")
	hasAttrs(t, hx, "rpc.system", "shardhost", "rpc.service", "tracee", "rpc.method", "relay", "shardhost.entity", "x")
	hasAttrs(t, ax, "shardhost.activate.reason", "new", "shardhost.entity", "x")
	if hx.SpanKind() != trace.SpanKindInternal || ax.SpanKind() != trace.SpanKindInternal {
		t.Errorf("handler span kind %v, activation span kind %v; want internal", hx.SpanKind(), ax.SpanKind())
	}

	_, err := traceeRelay.Ask(ctx, r, "x", relayReq{Panic: true})
	if err == nil {
		t.Fatal("a panicking handler's ask succeeded")
	}
	hp := s.waitEnded(t, "the panicking handler's span", func(sp sdktrace.ReadOnlySpan) bool {
		return sp.Name() == "handle tracee/relay" && sp.Status().Description != ""
	})
	failedWith(t, hp, "handler_panic")
	cp := s.waitEnded(t, "the panicking ask's client span", func(sp sdktrace.ReadOnlySpan) bool {
		return sp.SpanContext().SpanID() == hp.Parent().SpanID()
	})
	failedWith(t, cp, "handler_panic")
	lines := lc.find(slog.LevelError, "panicked", "trace_id", hp.SpanContext().TraceID().String(), "span_id", hp.SpanContext().SpanID().String())
	if len(lines) != 1 {
		t.Errorf("log lines of the panic with the handler span's IDs: %v; all: %v", lines, lc.all())
	}
}

// TestSignalInSendersTraceTimerLinked: a signal's handler span is a
// child of the sender's span (a parent-based sampler keeps it with its
// sender), although its sender has its answer before it runs; a timer's
// tick starts a new trace linked to the span of the handler that started
// the timer; a reminder's tick starts a new trace without a link.
func TestSignalInSendersTraceTimerLinked(t *testing.T) {
	c := memory.NewCluster()
	defer c.Close()
	s := newSpans(t)
	r := startTraced(t, c, s, runner.Config{ID: "a", NumShards: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := traceeArm.Tell(ctx, r, "z", traceArmReq{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-traceeEnvs.ticks:
	case <-ctx.Done():
		t.Fatal("the timer never ticked")
	}
	client := s.waitEnded(t, "the signal's client span", named("tracee/arm", trace.SpanKindClient, "a"))
	arm := s.waitEnded(t, "the signal handler's span", named("handle tracee/arm", trace.SpanKindInternal, "a"))
	tick := s.waitEnded(t, "the timer tick's span", named("handle tracee/tick", trace.SpanKindInternal, "a"))
	hasAttrs(t, client, "shardhost.one_way", "true")
	childOf(t, arm, client)
	if len(arm.Links()) != 0 {
		t.Errorf("the signal handler's span links %v, want none (its sender is its parent)", arm.Links())
	}
	linkedTo(t, tick, arm)
	hasAttrs(t, tick, "shardhost.tick", "timer", "shardhost.entity", "z")

	// A reminder's tick: a new trace, without a link (the span context
	// that registered it is not stored).
	if err := traceeRemind.Tell(ctx, r, "z", traceArmReq{}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-traceeEnvs.ticks:
	case <-ctx.Done():
		t.Fatal("the reminder never fired")
	}
	reminded := s.waitEnded(t, "the reminder tick's span", named("handle tracee/reminded", trace.SpanKindInternal, "a"))
	hasAttrs(t, reminded, "shardhost.tick", "reminder", "shardhost.entity", "z")
	if reminded.Parent().IsValid() || len(reminded.Links()) != 0 {
		t.Errorf("a reminder tick's span has parent %v and links %v; want a new trace without links", reminded.Parent(), reminded.Links())
	}
}

// TestSpanTextValidUTF8FromAnyPeer: the text a span takes from a request
// — an entity ID a program chose, a peer's kind, method, entity and runner
// ID on the wire, an error's text — is valid UTF-8 in every span, event
// and status: OTLP encodes it as protobuf strings, and one span with
// invalid UTF-8 makes its whole export batch fail (the other spans lost).
// The server span of a kind unknown here is named "unknown kind or
// method", whatever the peer sent.
func TestSpanTextValidUTF8FromAnyPeer(t *testing.T) {
	c := memory.NewCluster()
	defer c.Close()
	s := newSpans(t)
	net := transport.NewInmemNetwork()
	r := startTraced(t, c, s, runner.Config{ID: "a", NumShards: 4, Transport: net.Transport("a:7100")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := traceeRelay.Ask(ctx, r, "local\xff", relayReq{Panic: true}); err == nil {
		t.Fatal("a panicking handler's ask succeeded")
	}
	peer := net.Transport("evil:1")
	for _, req := range []*transport.DeliverRequest{
		{Kind: "tracee", Method: "relay", Entity: "remote\xfe", Payload: []byte(`{}`), Codec: entity.JSON.Name(), Sender: "evil\xff"},
		{Kind: "no\xffkind", Method: "m\xfe", Entity: "e\xff", Sender: "evil\xff"},
	} {
		req.Shard = uint32(sharding.ShardOf(req.Entity, 4))
		if _, _, err := peer.Call(ctx, "a:7100", req); err != nil {
			t.Fatalf("peer's request %+v: %v", req, err)
		}
	}
	// The unknown kind's server span has a fixed name (a peer cannot
	// multiply span names), the peer's text in its attributes.
	s.waitEnded(t, "the server span of the unknown kind", func(sp sdktrace.ReadOnlySpan) bool {
		return sp.SpanKind() == trace.SpanKindServer && sp.Name() == "unknown kind or method" &&
			strings.HasPrefix(spanAttr(sp, "rpc.service"), "no")
	})
	s.waitEnded(t, "the remote ask's handler span", func(sp sdktrace.ReadOnlySpan) bool {
		return sp.Name() == "handle tracee/relay" && strings.HasPrefix(spanAttr(sp, "shardhost.entity"), "remote")
	})
	valid := func(what, text string) {
		if !utf8.ValidString(text) {
			t.Errorf("%s %q is not valid UTF-8", what, text)
		}
	}
	validAttrs := func(where string, kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			if kv.Value.Type() == attribute.STRING {
				valid(where+" attribute "+string(kv.Key), kv.Value.AsString())
			}
		}
	}
	for _, sp := range s.ended() {
		where := fmt.Sprintf("span %s %q", sp.SpanKind(), sp.Name())
		valid("span name", sp.Name())
		valid(where+" status", sp.Status().Description)
		validAttrs(where, sp.Attributes())
		for _, ev := range sp.Events() {
			valid(where+" event", ev.Name)
			validAttrs(where+" event "+ev.Name, ev.Attributes)
		}
	}
}

// outliver is the entity of TestAsyncSendOutlivesItsHandler.
type outliver struct{ env *outliverEnv }

type outliverEnv struct {
	release chan struct{} // Hold returns
	held    chan struct{} // Hold started
	done    chan error    // the outcome of Fan's asynchronous ask
	fanCtx  chan context.Context
}

type outliverReq struct{ To string }

// Fan asks To's Hold asynchronously and returns at once.
func (o *outliver) Fan(ctx context.Context, r outliverReq) (struct{}, error) {
	s, _ := runner.SenderFrom(ctx)
	outliverHold.AskAsync(s, r.To, outliverReq{}, 10*time.Second, func(_ struct{}, err error) { o.env.done <- err })
	o.env.fanCtx <- ctx
	return struct{}{}, nil
}

// Hold returns once the test releases it.
func (o *outliver) Hold(context.Context, outliverReq) (struct{}, error) {
	o.env.held <- struct{}{}
	<-o.env.release
	return struct{}{}, nil
}

var (
	outliverEnvs = &outliverEnv{release: make(chan struct{}), held: make(chan struct{}, 1), done: make(chan error, 1), fanCtx: make(chan context.Context, 1)}
	outliverKind = entity.NewKind("outliver", func(string) *outliver { return &outliver{env: outliverEnvs} })
	outliverFan  = entity.Method(outliverKind, "fan", (*outliver).Fan)
	outliverHold = entity.Method(outliverKind, "hold", (*outliver).Hold)
)

// TestAsyncSendOutlivesItsHandler: an asynchronous ask sent from a traced
// handler (its SenderFrom) keeps the handler's trace but not its
// cancellation: the handler returns, its context is cancelled (the
// asker's deadline bounds it), and the ask still gets its answer; its
// client span is a child of the handler's span.
func TestAsyncSendOutlivesItsHandler(t *testing.T) {
	c := memory.NewCluster()
	defer c.Close()
	s := newSpans(t)
	r := startTraced(t, c, s, runner.Config{ID: "a", NumShards: 4})
	if err := r.Register(outliverKind); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := outliverFan.Ask(ctx, r, "fan", outliverReq{To: "hold"}); err != nil {
		t.Fatal(err)
	}
	fanCtx := <-outliverEnvs.fanCtx
	select {
	case <-fanCtx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context is not cancelled after it returned: the test proves nothing")
	}
	select {
	case <-outliverEnvs.held:
		outliverEnvs.release <- struct{}{}
	case err := <-outliverEnvs.done:
		t.Fatalf("the asynchronous ask of a handler that returned failed before its handler ran: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the asynchronous ask's handler never ran")
	}
	if err := <-outliverEnvs.done; err != nil {
		t.Fatalf("the asynchronous ask of a handler that returned: %v", err)
	}
	fan := s.waitEnded(t, "the handler's span", named("handle outliver/fan", trace.SpanKindInternal, "a"))
	async := s.waitEnded(t, "the asynchronous ask's client span", named("outliver/hold", trace.SpanKindClient, "a"))
	hold := s.waitEnded(t, "the held handler's span", named("handle outliver/hold", trace.SpanKindInternal, "a"))
	childOf(t, async, fan)
	childOf(t, hold, async)
}
