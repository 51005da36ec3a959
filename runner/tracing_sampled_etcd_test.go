package runner_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// witness is the entity of TestEtcdHandlersSampledWithTheirSender: it
// notes the span context and baggage its handlers run with, and sends
// asynchronously from a handler.
type witness struct{ seen *witnessLog }

type witnessReq struct{ Token string }

// witnessFanReq asks a witness to send Token to the witness To asynchronously
// (AskAsync when Ask, else TellAsync) from its handler.
type witnessFanReq struct {
	To, Token string
	Ask       bool
}

// witnessSeen is what a witness's handler saw of one token's message.
type witnessSeen struct {
	span    trace.SpanContext
	tenant  string // the "tenant" member of its baggage
	runner  string
	sendErr error // the outcome of an asynchronous send (Fan)
}

type witnessLog struct {
	mu   sync.Mutex
	seen map[string]witnessSeen // by token
}

func (l *witnessLog) note(ctx context.Context, token string) {
	info, _ := runner.ShardInfoFrom(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.seen[token]
	s.span, s.tenant, s.runner = trace.SpanContextFromContext(ctx), baggage.FromContext(ctx).Member("tenant").Value(), info.Runner
	l.seen[token] = s
}

func (l *witnessLog) failed(token string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.seen[token]
	s.sendErr = err
	l.seen[token] = s
}

// get returns what the handler of token saw, or the failure of its
// asynchronous send; done is false while neither is known.
func (l *witnessLog) get(token string) (s witnessSeen, done bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s = l.seen[token]
	return s, s.span.IsValid() || s.sendErr != nil
}

func (p *witness) Note(ctx context.Context, r witnessReq) (string, error) {
	p.seen.note(ctx, r.Token)
	return r.Token, nil
}

func (p *witness) Noted(ctx context.Context, r witnessReq) error {
	p.seen.note(ctx, r.Token)
	return nil
}

func (p *witness) Fan(ctx context.Context, r witnessFanReq) (struct{}, error) {
	s, ok := runner.SenderFrom(ctx)
	if !ok {
		return struct{}{}, fmt.Errorf("no sender in a handler's context")
	}
	if r.Ask {
		witnessNote.AskAsync(s, r.To, witnessReq{Token: r.Token}, 20*time.Second, func(_ string, err error) {
			if err != nil {
				p.seen.failed(r.Token, err)
			}
		})
	} else {
		witnessNoted.TellAsync(s, r.To, witnessReq{Token: r.Token}, 20*time.Second, func(err error) {
			if err != nil {
				p.seen.failed(r.Token, err)
			}
		})
	}
	return struct{}{}, nil
}

var (
	witnesses    = &witnessLog{seen: map[string]witnessSeen{}}
	witnessKind  = entity.NewKind("witness", func(string) *witness { return &witness{seen: witnesses} })
	witnessNote  = entity.Method(witnessKind, "note", (*witness).Note)
	witnessNoted = entity.Signal(witnessKind, "noted", (*witness).Noted)
	witnessFan   = entity.Method(witnessKind, "fan", (*witness).Fan)
)

// sampledBy returns cfg with a tracer provider recording into s whose
// sampler is sampler, and the W3C propagators.
func (s *spans) sampledBy(t *testing.T, cfg runner.Config, sampler sdktrace.Sampler) runner.Config {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.rec), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return cfg
}

// TestEtcdHandlersSampledWithTheirSender: two runners on a real etcd,
// delivering over real gRPC, each sampling 2 % of the traces it starts and
// following its parent's decision otherwise
// (ParentBased(TraceIDRatioBased(0.02))). For every way to send — Ask,
// Tell, and AskAsync and TellAsync from a handler (its runner's
// SenderFrom) — to an entity on the sender's runner and on the other:
//
//   - a send made in a sampled span has its handler's span recorded in
//     that span's trace, every span between them recorded too (the
//     trace is connected), and the handler sees the sender's baggage;
//   - a send made in a span that is not sampled has its handler run in
//     the same trace, not sampled (nothing of that trace recorded), with
//     the sender's baggage too.
func TestEtcdHandlersSampledWithTheirSender(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	s := newSpans(t)
	const n = 4
	sampler := sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.02))
	setup := func(r *runner.Runner) error { return r.Register(witnessKind) }
	a := c.startWith(s.sampledBy(t, runner.Config{ID: "a", NumShards: n, ListenAddr: "127.0.0.1:0", LeaseTTL: 3 * time.Second}, sampler), setup)
	b := c.startWith(s.sampledBy(t, runner.Config{ID: "b", NumShards: n, ListenAddr: "127.0.0.1:0", LeaseTTL: 3 * time.Second}, sampler), setup)
	c.waitPartition([]*etcdRunner{a, b}, n, 30*time.Second)
	var onA, onB sharding.ShardID
	for id := range a.Owned() {
		onA = id
	}
	for id := range b.Owned() {
		onB = id
	}
	src := idFor(onA, n, "src") // the async sends' sender, on a
	targets := map[string]string{"local": idFor(onA, n, "local"), "remote": idFor(onB, n, "remote")}

	// The spans the test sends in: sampled (recorded by s), or not.
	root := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = root.Shutdown(context.Background()) })
	tenant, err := baggage.NewMember("tenant", "t1")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(tenant)
	if err != nil {
		t.Fatal(err)
	}
	sendCtx := func(sampled bool) (context.Context, trace.TraceID, func()) {
		ctx := baggage.ContextWithBaggage(context.Background(), bag)
		if sampled {
			ctx, span := root.Tracer("test").Start(ctx, "sender")
			return ctx, span.SpanContext().TraceID(), func() { span.End() }
		}
		var tid trace.TraceID
		var sid trace.SpanID
		_, _ = rand.Read(tid[:])
		_, _ = rand.Read(sid[:])
		return trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid})), tid, func() {}
	}
	sends := map[string]func(ctx context.Context, to, token string) error{
		"ask": func(ctx context.Context, to, token string) error {
			_, err := witnessNote.Ask(ctx, a, to, witnessReq{Token: token})
			return err
		},
		"tell": func(ctx context.Context, to, token string) error {
			return witnessNoted.Tell(ctx, a, to, witnessReq{Token: token})
		},
		"async ask": func(ctx context.Context, to, token string) error {
			_, err := witnessFan.Ask(ctx, a, src, witnessFanReq{To: to, Token: token, Ask: true})
			return err
		},
		"async tell": func(ctx context.Context, to, token string) error {
			_, err := witnessFan.Ask(ctx, a, src, witnessFanReq{To: to, Token: token})
			return err
		},
	}
	handlerName := map[string]string{"ask": "handle witness/note", "tell": "handle witness/noted", "async ask": "handle witness/note", "async tell": "handle witness/noted"}
	const rounds = 10
	run := rand.Text() // tokens unique to this run (-count)
	type sent struct {
		how, where, token string
		trace             trace.TraceID
		sampled           bool
	}
	var all []sent
	for how, send := range sends {
		for where, to := range targets {
			for i := range 2 * rounds {
				sampled := i%2 == 0
				sctx, tid, end := sendCtx(sampled)
				token := fmt.Sprintf("%s/%s/%s/%d", run, how, where, i)
				tctx, cancel := context.WithTimeout(sctx, 20*time.Second)
				err := send(tctx, to, token)
				cancel()
				if err != nil {
					t.Fatalf("%s to %s (%s): %v", how, to, where, err)
				}
				end()
				all = append(all, sent{how, where, token, tid, sampled})
			}
		}
	}
	for _, m := range all {
		var seen witnessSeen
		waitFor(t, 20*time.Second, "the handler of "+m.token, func() bool {
			var done bool
			seen, done = witnesses.get(m.token)
			return done
		})
		if seen.sendErr != nil {
			t.Fatalf("%s: the asynchronous send failed: %v", m.token, seen.sendErr)
		}
		if want := map[string]string{"local": "a", "remote": "b"}[m.where]; seen.runner != want {
			t.Fatalf("%s ran on %q, want %q", m.token, seen.runner, want)
		}
		if seen.tenant != "t1" {
			t.Errorf("%s: the handler's baggage has tenant %q, want t1", m.token, seen.tenant)
		}
		if seen.span.TraceID() != m.trace || seen.span.IsSampled() != m.sampled {
			t.Errorf("%s: the handler's span is in trace %s, sampled %v; want the sender's, %s, sampled %v",
				m.token, seen.span.TraceID(), seen.span.IsSampled(), m.trace, m.sampled)
			continue
		}
		if !m.sampled {
			continue
		}
		h := s.waitEnded(t, m.token+"'s handler span", func(sp sdktrace.ReadOnlySpan) bool {
			return sp.SpanContext().SpanID() == seen.span.SpanID()
		})
		if h.Name() != handlerName[m.how] {
			t.Errorf("%s: the handler's span is %q, want %q", m.token, h.Name(), handlerName[m.how])
		}
		// Connected: each span's parent is in the trace, up to the sender's.
		waitFor(t, 10*time.Second, m.token+"'s trace connected", func() bool {
			byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
			for _, sp := range s.trace(m.trace) {
				byID[sp.SpanContext().SpanID()] = sp
			}
			for sp := h; sp.Parent().IsValid(); {
				var ok bool
				if sp, ok = byID[sp.Parent().SpanID()]; !ok {
					return false
				}
			}
			return true
		})
	}
	for _, sp := range s.ended() {
		for _, m := range all {
			if !m.sampled && sp.SpanContext().TraceID() == m.trace {
				t.Errorf("%s, sent in a span not sampled: span %q on %s recorded", m.token, sp.Name(), spanAttr(sp, "shardhost.runner"))
			}
		}
	}
}
