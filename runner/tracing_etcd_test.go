package runner_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// TestEtcdTraceCrossesRunners: a gateway (client-only) and two hosting
// runners on a real etcd, delivering over real gRPC, each with its own
// tracer provider. Each request is one trace whose spans link across the
// processes' hops:
//
//   - an ask sent before any runner owns a shard retries (no owner yet),
//     each retry an event of the client span, and its handler's span is a
//     child of the owner's server span, a child of the gateway's client
//     span;
//   - an ask whose handler asks an entity of the other runner is one trace
//     of six spans (plus the activations) across the three runners;
//   - an ask whose caller gives up while its handler runs ends with
//     ErrMaybeDelivered, recorded on the client span as an error.
func TestEtcdTraceCrossesRunners(t *testing.T) {
	c := startEtcdCluster(t)
	s := newSpans(t)
	const n = 8
	setup := func(r *runner.Runner) error { return r.Register(traceeKind) }
	gw := c.startWith(s.traced(t, runner.Config{ID: "gw", NumShards: n, ClientOnly: true, LeaseTTL: 3 * time.Second}), setup)

	// 1. Sent before anyone owns a shard: retried until an owner appears.
	type outcome struct {
		resp relayResp
		err  error
	}
	first := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := traceeRelay.Ask(ctx, gw, "early", relayReq{})
		first <- outcome{resp, err}
	}()
	waitFor(t, 10*time.Second, "the early ask's client span to start", func() bool {
		for _, sp := range s.rec.Started() {
			if sp.Name() == "tracee/relay" {
				return true
			}
		}
		return false
	})
	a := c.startWith(s.traced(t, runner.Config{ID: "a", NumShards: n, ListenAddr: "127.0.0.1:0", LeaseTTL: 3 * time.Second}), setup)
	b := c.startWith(s.traced(t, runner.Config{ID: "b", NumShards: n, ListenAddr: "127.0.0.1:0", LeaseTTL: 3 * time.Second}), setup)
	var early outcome
	select {
	case early = <-first:
	case <-time.After(40 * time.Second):
		t.Fatal("the early ask never returned")
	}
	if early.err != nil {
		t.Fatalf("early ask: %v", early.err)
	}
	client := s.waitEnded(t, "the early ask's client span", named("tracee/relay", trace.SpanKindClient, "gw"))
	var retries []string
	for _, ev := range client.Events() {
		if ev.Name == "shardhost.retry" {
			for _, kv := range ev.Attributes {
				if kv.Key == "shardhost.retry.reason" {
					retries = append(retries, kv.Value.AsString())
				}
			}
		}
	}
	if len(retries) == 0 || !strings.Contains(retries[0], "no owner") {
		t.Errorf("retry events of the early ask: %q; want at least one, the first for no owner", retries)
	}
	t.Logf("early ask: answered by %v after %d retries: %q", early.resp.Runners, len(retries), retries)
	owner := early.resp.Runners[0]
	hasAttrs(t, client, "shardhost.owner", owner, "rpc.system", "shardhost", "shardhost.entity", "early")
	if got, _ := strconv.Atoi(spanAttr(client, "shardhost.attempts")); got != len(retries)+1 {
		t.Errorf("early ask made %d attempts with %d retries", got, len(retries))
	}
	if spanAttr(client, "server.address") != "127.0.0.1" || spanAttr(client, "server.port") == "" {
		t.Errorf("client span's server.address %q, server.port %q", spanAttr(client, "server.address"), spanAttr(client, "server.port"))
	}
	// Every attempt that reached a runner is a server span, a child of
	// the client span; the handler's span is a child of the last one's.
	handler := s.waitEnded(t, "the early ask's handler span", func(sp sdktrace.ReadOnlySpan) bool {
		return sp.Name() == "handle tracee/relay" && sp.SpanContext().TraceID() == client.SpanContext().TraceID()
	})
	var server sdktrace.ReadOnlySpan
	for _, sp := range s.trace(client.SpanContext().TraceID()) {
		if sp.SpanKind() != trace.SpanKindServer {
			continue
		}
		childOf(t, sp, client)
		hasAttrs(t, sp, "shardhost.sender", "gw", "shardhost.entity", "early")
		if sp.SpanContext().SpanID() == handler.Parent().SpanID() {
			server = sp
		}
	}
	if server == nil {
		t.Fatalf("the early ask's handler span has parent %s, no server span of its trace:%s", handler.Parent().SpanID(), describe(s.trace(client.SpanContext().TraceID())))
	}
	hasAttrs(t, server, "shardhost.runner", owner)
	hasAttrs(t, handler, "shardhost.runner", owner)

	// 2. A hop from a handler on one runner to an entity of the other.
	c.waitPartition([]*etcdRunner{a, b}, n, 20*time.Second)
	owned := map[string]sharding.ShardID{}
	for _, r := range []*etcdRunner{a, b} {
		for id := range r.Owned() {
			owned[r.ID()] = id
		}
	}
	x, y := idFor(owned["a"], n, "x"), idFor(owned["b"], n, "y")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := traceeRelay.Ask(ctx, gw, x, relayReq{To: y})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(resp.Runners, ",") != "a,b" {
		t.Fatalf("relay ran on %v, want a then b", resp.Runners)
	}
	cx := s.waitEnded(t, "the relay's client span", func(sp sdktrace.ReadOnlySpan) bool {
		return named("tracee/relay", trace.SpanKindClient, "gw")(sp) && spanAttr(sp, "shardhost.entity") == x
	})
	id := cx.SpanContext().TraceID()
	var got []sdktrace.ReadOnlySpan
	waitFor(t, 10*time.Second, "the relay's 8 spans", func() bool { got = s.trace(id); return len(got) >= 8 })
	find := func(name string, k trace.SpanKind, runnerID, entity string) sdktrace.ReadOnlySpan {
		t.Helper()
		var out []sdktrace.ReadOnlySpan
		for _, sp := range got {
			if sp.Name() == name && sp.SpanKind() == k && (runnerID == "" || spanAttr(sp, "shardhost.runner") == runnerID) && spanAttr(sp, "shardhost.entity") == entity {
				out = append(out, sp)
			}
		}
		if len(out) != 1 {
			t.Fatalf("%d spans %s %q on %s for %s in the trace:%s", len(out), k, name, runnerID, entity, describe(got))
		}
		return out[0]
	}
	sx := find("tracee/relay", trace.SpanKindServer, "a", x)
	hx := find("handle tracee/relay", trace.SpanKindInternal, "a", x)
	ax := find("activate tracee", trace.SpanKindInternal, "", x)
	cy := find("tracee/relay", trace.SpanKindClient, "a", y)
	sy := find("tracee/relay", trace.SpanKindServer, "b", y)
	hy := find("handle tracee/relay", trace.SpanKindInternal, "b", y)
	ay := find("activate tracee", trace.SpanKindInternal, "", y)
	t.Logf("the relay's trace %s:%s", id, describe(got))
	if len(got) != 8 {
		t.Errorf("the relay's trace has %d spans, want 8:%s", len(got), describe(got))
	}
	if cx.Parent().IsValid() {
		t.Errorf("the gateway's client span has a parent: %v", cx.Parent())
	}
	childOf(t, sx, cx)
	childOf(t, hx, sx)
	childOf(t, ax, hx)
	childOf(t, cy, hx)
	childOf(t, sy, cy)
	childOf(t, hy, sy)
	childOf(t, ay, hy)
	if client.SpanContext().TraceID() == id {
		t.Errorf("two requests share trace %s", id)
	}
	for _, sp := range s.ended() { // one trace per request: none of its spans elsewhere
		if e := spanAttr(sp, "shardhost.entity"); (e == x || e == y) && sp.SpanContext().TraceID() != id {
			t.Errorf("span %s %q of %s on %s is in trace %s, not the request's %s", sp.SpanKind(), sp.Name(), e, spanAttr(sp, "shardhost.runner"), sp.SpanContext().TraceID(), id)
		}
	}

	// 3. The caller gives up while the handler runs (a cancellation does
	// not travel to the owner: its handler goes on).
	bctx, bcancel := context.WithCancel(context.Background())
	blocked := make(chan error, 1)
	go func() {
		_, err := traceeRelay.Ask(bctx, gw, y, relayReq{Block: true})
		blocked <- err
	}()
	<-traceeEnvs.started
	bcancel()
	err = <-blocked
	traceeEnvs.release <- struct{}{}
	if !errors.Is(err, runner.ErrMaybeDelivered) {
		t.Fatalf("ask cancelled while its handler ran: %v, want ErrMaybeDelivered", err)
	}
	cb := s.waitEnded(t, "the blocked ask's client span", func(sp sdktrace.ReadOnlySpan) bool {
		return named("tracee/relay", trace.SpanKindClient, "gw")(sp) && spanAttr(sp, "shardhost.entity") == y && sp.Status().Description != ""
	})
	failedWith(t, cb, "maybe_delivered")
	if !strings.Contains(cb.Status().Description, runner.ErrMaybeDelivered.Error()) {
		t.Errorf("the client span's status %q does not say %q", cb.Status().Description, runner.ErrMaybeDelivered)
	}
	s.waitEnded(t, "the blocked handler's span, in the ask's trace", func(sp sdktrace.ReadOnlySpan) bool {
		return named("handle tracee/relay", trace.SpanKindInternal, "b")(sp) && sp.SpanContext().TraceID() == cb.SpanContext().TraceID()
	})
}

// TestEtcdHandoffTraced: on a real etcd and gRPC, the shards a joining
// runner takes over in a planned move are each a "handoff warm" span on
// it and a "handoff release" span on the old owner, with the shard, the
// two epochs (each side's own and the peer's) and the peer; the moved
// entity's first activation on the new owner restores the checkpoint its
// Release hook wrote on the old one (a restore event of 8 bytes).
func TestEtcdHandoffTraced(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	s := newSpans(t)
	const n = 4
	hooks := &hookTrace{}
	kind := entity.NewKind("acct", func(id string) *acct { return &acct{id: id, hooks: hooks} })
	inc := entity.Method(kind, "inc", (*acct).Inc)
	setup := func(r *runner.Runner) error { return r.Register(kind) }
	release := func(context.Context, sharding.ShardID, string) error { return nil }
	a := c.startWith(s.traced(t, runner.Config{ID: "a", NumShards: n, ListenAddr: "127.0.0.1:0", LeaseTTL: 3 * time.Second, ReleaseShard: release}), setup)
	waitFor(t, 10*time.Second, "a owns every shard", func() bool { return len(a.Owned()) == n })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = idFor(sharding.ShardID(i), n, "e")
		if _, err := inc.Ask(ctx, a, ids[i], acctReq{By: 1}); err != nil {
			t.Fatal(err)
		}
	}
	before := a.Owned()
	b := c.startWith(s.traced(t, runner.Config{ID: "b", NumShards: n, ListenAddr: "127.0.0.1:0", LeaseTTL: 3 * time.Second}), setup)
	waitFor(t, 30*time.Second, "b owns half the shards", func() bool { return len(b.Owned()) == n/2 && len(a.Owned()) == n/2 })
	for id, epoch := range b.Owned() {
		warm := s.waitEnded(t, fmt.Sprintf("b's warm span of shard %d", id), shardSpan("handoff warm", "b", id))
		rel := s.waitEnded(t, fmt.Sprintf("a's release span of shard %d", id), shardSpan("handoff release", "a", id))
		rootSpan(t, warm)
		rootSpan(t, rel)
		hasAttrs(t, warm, "shardhost.peer", "a", "shardhost.peer.epoch", epochText(before[id]), "shardhost.epoch", epochText(epoch), "shardhost.outcome", "cutover")
		hasAttrs(t, rel, "shardhost.peer", "b", "shardhost.epoch", epochText(before[id]), "shardhost.peer.epoch", epochText(epoch), "shardhost.outcome", "cutover")
		hasEvents(t, rel, "shardhost.handoff.admission_stopped", "shardhost.handoff.drained", "shardhost.handoff.release_shard",
			"shardhost.handoff.progress_recorded")
		got, err := inc.Ask(ctx, a, ids[id], acctReq{By: 1}) // through a: one hop to b
		if err != nil || got.N != 2 || got.Runner != "b" {
			t.Fatalf("ask of %s after the move = %+v, %v; want N 2 on b", ids[id], got, err)
		}
		act := s.waitEnded(t, "the activation on b", func(sp sdktrace.ReadOnlySpan) bool {
			return named("activate acct", trace.SpanKindInternal, "b")(sp) && spanAttr(sp, "shardhost.entity") == ids[id]
		})
		hasAttrs(t, act, "shardhost.activate.reason", "handoff")
		if bytes, _ := eventAttr(act, "shardhost.restore", "shardhost.restore.bytes"); bytes != "8" {
			t.Errorf("activation of %s on b: restore event bytes %q, want 8 (events %v)", ids[id], bytes, act.Events())
		}
	}
	for _, sp := range s.ended() {
		if sp.Name() == "handoff warm" && spanAttr(sp, "shardhost.runner") == "a" || sp.Name() == "handoff release" && spanAttr(sp, "shardhost.runner") == "b" {
			t.Errorf("a handoff span the wrong way round:%s", describe([]sdktrace.ReadOnlySpan{sp}))
		}
	}
	keysKnown(t, s.ended())
}
