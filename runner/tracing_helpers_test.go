package runner_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// spans records the spans of the runners configured with it (one SDK
// provider per runner, sampling everything, one in-memory recorder).
type spans struct {
	rec *tracetest.SpanRecorder
}

func newSpans(t *testing.T) *spans {
	return &spans{rec: tracetest.NewSpanRecorder()}
}

// traced returns cfg with a tracer provider recording into s and the W3C
// propagators.
func (s *spans) traced(t *testing.T, cfg runner.Config) runner.Config {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return cfg
}

// ended returns the spans ended so far.
func (s *spans) ended() []sdktrace.ReadOnlySpan { return s.rec.Ended() }

// trace returns the ended spans of trace id.
func (s *spans) trace(id trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, sp := range s.ended() {
		if sp.SpanContext().TraceID() == id {
			out = append(out, sp)
		}
	}
	return out
}

// waitEnded waits until a span matching match has ended, and returns it.
func (s *spans) waitEnded(t *testing.T, what string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, what, func() bool {
		for _, sp := range s.ended() {
			if match(sp) {
				found = sp
				return true
			}
		}
		return false
	})
	return found
}

// spanAttr returns span sp's attribute key as text ("" when absent).
func spanAttr(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.Emit()
		}
	}
	return ""
}

// named matches the spans of kind k named name recorded by runner id ("":
// any).
func named(name string, k trace.SpanKind, id string) func(sdktrace.ReadOnlySpan) bool {
	return func(sp sdktrace.ReadOnlySpan) bool {
		return sp.Name() == name && sp.SpanKind() == k && (id == "" || spanAttr(sp, "shardhost.runner") == id)
	}
}

// childOf checks that child's parent is parent (same trace).
func childOf(t *testing.T, child, parent sdktrace.ReadOnlySpan) {
	t.Helper()
	if child.Parent().SpanID() != parent.SpanContext().SpanID() || child.SpanContext().TraceID() != parent.SpanContext().TraceID() {
		t.Errorf("span %q (%s on %s) has parent %s of trace %s; want %q (%s on %s), span %s of trace %s",
			child.Name(), child.SpanKind(), spanAttr(child, "shardhost.runner"), child.Parent().SpanID(), child.SpanContext().TraceID(),
			parent.Name(), parent.SpanKind(), spanAttr(parent, "shardhost.runner"), parent.SpanContext().SpanID(), parent.SpanContext().TraceID())
	}
}

// linkedTo checks that sp starts a new trace linked to span to.
func linkedTo(t *testing.T, sp sdktrace.ReadOnlySpan, to sdktrace.ReadOnlySpan) {
	t.Helper()
	if sp.Parent().IsValid() || sp.SpanContext().TraceID() == to.SpanContext().TraceID() {
		t.Errorf("span %q has parent %v in trace %s: want a new trace", sp.Name(), sp.Parent().SpanID(), sp.SpanContext().TraceID())
	}
	links := sp.Links()
	if len(links) != 1 || links[0].SpanContext.SpanID() != to.SpanContext().SpanID() || links[0].SpanContext.TraceID() != to.SpanContext().TraceID() {
		t.Errorf("span %q links %v, want one link to %q (%s)", sp.Name(), links, to.Name(), to.SpanContext().SpanID())
	}
}

// hasAttrs checks that sp carries every key=value of kv.
func hasAttrs(t *testing.T, sp sdktrace.ReadOnlySpan, kv ...string) {
	t.Helper()
	for i := 0; i+1 < len(kv); i += 2 {
		if got := spanAttr(sp, kv[i]); got != kv[i+1] {
			t.Errorf("span %q (%s): %s = %q, want %q (attributes %v)", sp.Name(), sp.SpanKind(), kv[i], got, kv[i+1], sp.Attributes())
		}
	}
}

// failedWith checks that sp ended with an error status of error.type typ.
func failedWith(t *testing.T, sp sdktrace.ReadOnlySpan, typ string) {
	t.Helper()
	if sp.Status().Code != codes.Error || spanAttr(sp, "error.type") != typ {
		t.Errorf("span %q: status %v %q, error.type %q; want an error of type %q", sp.Name(), sp.Status().Code, sp.Status().Description, spanAttr(sp, "error.type"), typ)
	}
}

// describe lists spans for failure messages.
func describe(sps []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, sp := range sps {
		fmt.Fprintf(&b, "\n  %s %q on %s span %s parent %s", sp.SpanKind(), sp.Name(), spanAttr(sp, "shardhost.runner"), sp.SpanContext().SpanID(), sp.Parent().SpanID())
	}
	return b.String()
}

// tracee is the entity of the tracing tests.
type tracee struct {
	id  string
	env *traceeEnv
}

type traceeEnv struct {
	ticks    chan string   // timer ticks: the entity's ID
	release  chan struct{} // blocked handlers return
	started  chan string   // a blocked handler started: the entity's ID
	relay    *entity.MethodRef[tracee, relayReq, relayResp]
	reminder *entity.ReminderRef[tracee, int]
}

type relayReq struct {
	To    string // ask the tracee To (on whatever runner owns it) first
	Panic bool
	Block bool // wait, ignoring the context, until the test releases it
}

type relayResp struct{ Runners []string }

var errRelay = errors.New("relay failed")

func (e *tracee) Relay(ctx context.Context, r relayReq) (relayResp, error) {
	info, _ := runner.ShardInfoFrom(ctx)
	out := relayResp{Runners: []string{info.Runner}}
	switch {
	case r.Panic:
		panic("tracee told to panic")
	case r.Block:
		e.env.started <- e.id
		select {
		case <-e.env.release:
		case <-time.After(10 * time.Second):
		}
	case r.To != "":
		s, ok := runner.SenderFrom(ctx)
		if !ok {
			return out, errRelay
		}
		next, err := e.env.relay.Ask(ctx, s, r.To, relayReq{})
		if err != nil {
			return out, err
		}
		out.Runners = append(out.Runners, next.Runners...)
	}
	return out, nil
}

type traceArmReq struct{}

// Arm (a signal) starts the entity's timer, which fires at once.
func (e *tracee) Arm(ctx context.Context, _ traceArmReq) error {
	return traceeTimer.After(ctx, "t", 0, 1)
}

func (e *tracee) Tick(_ context.Context, _ entity.TimerTick[int]) error {
	e.env.ticks <- e.id
	return nil
}

// Remind (a signal) registers a one-shot reminder, due at once.
func (e *tracee) Remind(ctx context.Context, _ traceArmReq) error {
	return e.env.reminder.Register(ctx, "r", entity.Schedule{First: time.Now()}, 1)
}

func (e *tracee) Reminded(_ context.Context, _ entity.ReminderTick[int]) error {
	e.env.ticks <- e.id
	return nil
}

var (
	traceeEnvs     = &traceeEnv{ticks: make(chan string, 16), release: make(chan struct{}), started: make(chan string, 1)}
	traceeKind     = entity.NewKind("tracee", func(id string) *tracee { return &tracee{id: id, env: traceeEnvs} })
	traceeRelay    = entity.Method(traceeKind, "relay", (*tracee).Relay)
	traceeArm      = entity.Signal(traceeKind, "arm", (*tracee).Arm)
	traceeTimer    = entity.Timer(traceeKind, "tick", (*tracee).Tick)
	traceeRemind   = entity.Signal(traceeKind, "remind", (*tracee).Remind)
	traceeReminder = entity.Reminder(traceeKind, "reminded", (*tracee).Reminded)
)

func init() { traceeEnvs.relay, traceeEnvs.reminder = traceeRelay, traceeReminder }

// spanKeys lists the attribute keys of spans and their events.
func spanKeys(sps []sdktrace.ReadOnlySpan) map[string]bool {
	out := map[string]bool{}
	add := func(kvs []attribute.KeyValue) {
		for _, kv := range kvs {
			out[string(kv.Key)] = true
		}
	}
	for _, sp := range sps {
		add(sp.Attributes())
		for _, ev := range sp.Events() {
			add(ev.Attributes)
		}
	}
	return out
}
