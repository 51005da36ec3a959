package runner_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// eventNames lists the names of sp's events, in order.
func eventNames(sp sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, ev := range sp.Events() {
		out = append(out, ev.Name)
	}
	return out
}

// eventAttr returns attribute key of sp's first event name ("" when absent).
func eventAttr(sp sdktrace.ReadOnlySpan, name, key string) (string, bool) {
	for _, ev := range sp.Events() {
		if ev.Name != name {
			continue
		}
		for _, kv := range ev.Attributes {
			if string(kv.Key) == key {
				return kv.Value.Emit(), true
			}
		}
		return "", true
	}
	return "", false
}

// hasEvents checks that sp's events are want, in this order.
func hasEvents(t *testing.T, sp sdktrace.ReadOnlySpan, want ...string) {
	t.Helper()
	if got := eventNames(sp); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("span %q on %s: events %v, want %v", sp.Name(), spanAttr(sp, "shardhost.runner"), got, want)
	}
}

// rootSpan checks that sp starts a trace of its own.
func rootSpan(t *testing.T, sp sdktrace.ReadOnlySpan) {
	t.Helper()
	if sp.Parent().IsValid() {
		t.Errorf("span %q has parent %v; want a root span", sp.Name(), sp.Parent())
	}
	if sp.SpanKind() != trace.SpanKindInternal {
		t.Errorf("span %q is of kind %v; want internal", sp.Name(), sp.SpanKind())
	}
}

// shardSpan matches the spans named name of runner id about shard.
func shardSpan(name, id string, shard sharding.ShardID) func(sdktrace.ReadOnlySpan) bool {
	return func(sp sdktrace.ReadOnlySpan) bool {
		return named(name, trace.SpanKindInternal, id)(sp) && spanAttr(sp, "shardhost.shard") == strconv.Itoa(int(shard))
	}
}

func epochText(e storage.Epoch) string { return strconv.FormatInt(int64(e), 10) }

// TestHandoffTracedOnBothSides: a planned move of a shard between two
// runners is a "handoff warm" span on the new owner (from the takeover to
// the lock's arrival: the record written, the warm hooks run, ready) and a
// "handoff release" span on the old one (admission stopped, drained,
// ReleaseShard run, reminder progress recorded, the lock moved), each a
// root span naming the shard, its own epoch, the peer and the peer's
// epoch, so the two sides correlate; the entity's first activation on the
// new owner says it came by handoff, from a warmed instance, and restored
// its checkpoint (8 bytes) as an event.
func TestHandoffTracedOnBothSides(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		net := transport.NewInmemNetwork()
		s := newSpans(t)
		hooks := &hookTrace{}
		kind := entity.NewKind("acct", func(id string) *acct { return &acct{id: id, hooks: hooks} })
		inc := entity.Method(kind, "inc", (*acct).Inc)
		release := func(context.Context, sharding.ShardID, string) error { return nil }
		a := runWith(t, c.NewStore("a"), s.traced(t, runner.Config{ID: "a", NumShards: 2, Transport: net.Transport("a:7100"), ReleaseShard: release}))
		if err := a.Register(kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a owns both shards", func() bool { return len(a.Owned()) == 2 })
		ids := []string{idFor(0, 2, "e"), idFor(1, 2, "e")}
		for _, id := range ids {
			if _, err := inc.Ask(t.Context(), a, id, acctReq{By: 1}); err != nil {
				t.Fatal(err)
			}
		}
		before := a.Owned()
		b := runWith(t, c.NewStore("b"), s.traced(t, runner.Config{ID: "b", NumShards: 2, Transport: net.Transport("b:7100")}))
		if err := b.Register(kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "b owns one shard", func() bool { return len(b.Owned()) == 1 && len(a.Owned()) == 1 })
		var moved sharding.ShardID
		var epoch storage.Epoch
		for id, e := range b.Owned() {
			moved, epoch = id, e
		}
		warm := s.waitEnded(t, "b's warm span", shardSpan("handoff warm", "b", moved))
		rel := s.waitEnded(t, "a's release span", shardSpan("handoff release", "a", moved))
		rootSpan(t, warm)
		rootSpan(t, rel)
		hasAttrs(t, warm, "shardhost.peer", "a", "shardhost.peer.epoch", epochText(before[moved]), "shardhost.epoch", epochText(epoch),
			"shardhost.outcome", "cutover", "shardhost.warmed", "1")
		hasEvents(t, warm, "shardhost.handoff.warming", "shardhost.handoff.warmed", "shardhost.handoff.ready")
		hasAttrs(t, rel, "shardhost.peer", "b", "shardhost.epoch", epochText(before[moved]), "shardhost.peer.epoch", epochText(epoch),
			"shardhost.outcome", "cutover")
		hasEvents(t, rel, "shardhost.handoff.admission_stopped", "shardhost.handoff.drained", "shardhost.handoff.release_shard",
			"shardhost.handoff.progress_recorded")
		for _, sp := range []sdktrace.ReadOnlySpan{warm, rel} {
			if sp.Status().Code == codes.Error {
				t.Errorf("span %q of a completed move has an error status %q", sp.Name(), sp.Status().Description)
			}
		}
		if !rel.EndTime().Before(warm.EndTime()) && !rel.EndTime().Equal(warm.EndTime()) {
			t.Errorf("the release span ended at %v, after the warm span (%v): the lock moves before the new owner has it", rel.EndTime(), warm.EndTime())
		}
		if n := len(s.ended()); n == 0 {
			t.Fatal("no span")
		}
		for _, sp := range s.ended() {
			if (sp.Name() == "handoff warm" || sp.Name() == "handoff release") && spanAttr(sp, "shardhost.shard") != strconv.Itoa(int(moved)) {
				t.Errorf("a handoff span of shard %s, which did not move:%s", spanAttr(sp, "shardhost.shard"), describe([]sdktrace.ReadOnlySpan{sp}))
			}
		}

		// The moved entity activates on b from the checkpoint a's Release
		// hook wrote.
		got, err := inc.Ask(t.Context(), b, ids[moved], acctReq{By: 1})
		if err != nil || got.N != 2 || got.Runner != "b" {
			t.Fatalf("ask after the move = %+v, %v; want N 2 on b", got, err)
		}
		act := s.waitEnded(t, "the activation on b", func(sp sdktrace.ReadOnlySpan) bool {
			return named("activate acct", trace.SpanKindInternal, "b")(sp) && spanAttr(sp, "shardhost.entity") == ids[moved]
		})
		hasAttrs(t, act, "shardhost.activate.reason", "handoff", "shardhost.activate.warmed", "true")
		if found, _ := eventAttr(act, "shardhost.restore", "shardhost.restore.found"); found != "true" {
			t.Errorf("activation events %v: no restore event that found the checkpoint", act.Events())
		}
		if n, _ := eventAttr(act, "shardhost.restore", "shardhost.restore.bytes"); n != "8" {
			t.Errorf("restore event bytes = %q, want 8", n)
		}
		keysKnown(t, s.ended())
	})
}

// TestWarmTimeoutTracedAsAbort: a takeover abandoned because warming
// exceeded WarmTimeout (AbortOnWarmTimeout) ends its warm span with an
// error status of error.type warm_timeout and outcome aborted, after a
// warm_timeout event.
func TestWarmTimeoutTracedAsAbort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		net := transport.NewInmemNetwork()
		s := newSpans(t)
		a := runWith(t, c.NewStore("a"), runner.Config{ID: "a", NumShards: 1, Transport: net.Transport("a:7100")})
		waitFor(t, 10*time.Second, "a owns the shard", func() bool { return len(a.Owned()) == 1 })
		stall := func(ctx context.Context, _ sharding.ShardID, _ string) error { <-ctx.Done(); return nil }
		b := runWith(t, c.NewStore("b"), s.traced(t, runner.Config{ID: "b", NumShards: 1, Transport: net.Transport("b:7100"),
			WarmShard: stall, WarmTimeout: time.Second, AbortOnWarmTimeout: true}))
		warm := s.waitEnded(t, "b's warm span", shardSpan("handoff warm", "b", 0))
		rootSpan(t, warm)
		failedWith(t, warm, "warm_timeout")
		hasAttrs(t, warm, "shardhost.outcome", "aborted", "shardhost.peer", "a")
		hasEvents(t, warm, "shardhost.handoff.warming", "shardhost.handoff.warm_timeout")
		if len(b.Owned()) != 0 {
			t.Errorf("b owns %v after its takeover was abandoned", b.Owned())
		}
		keysKnown(t, s.ended())
	})
}

// TestDetachAndReattachTraced: a detach is a "detach" span listing the
// shards it interrupted, its reason (an error status with the reason as
// error.type) and the lease deadline, ending when the last interrupted
// handler returned (an entities_stopped event); the re-attachment is a
// "reattach" span linked to it, naming the lease kept and the shards it
// kept at new epochs.
func TestDetachAndReattachTraced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		s := newSpans(t)
		_, k, do := newWho()
		rec := newRecorder(t)
		r := start(t, c, rec, s.traced(t, detachCfg("a")))
		if err := r.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "owning all shards", func() bool { return len(r.Owned()) == 8 })
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond)))
		r.store.FailKeepAlive(true)
		// A handler that ignores its cancelled context: it returns 3 s
		// after the detach instant (t0+15s).
		done := make(chan error, 1)
		time.Sleep(time.Until(t0.Add(13 * time.Second)))
		go func() {
			_, err := do.Ask(t.Context(), r, idFor(3, 8, "e"), whoReq{Sleep: 5 * time.Second, IgnoreCt: true})
			done <- err
		}()
		d := waitDetached(t, rec, 20*time.Second)
		time.Sleep(time.Until(t0.Add(16 * time.Second)))
		r.store.FailKeepAlive(false)
		<-done
		var ra []runner.Reattached
		waitFor(t, 20*time.Second, "re-attach", func() bool { ra = reattached(rec.all()); return len(ra) > 0 })

		det := s.waitEnded(t, "the detach span", named("detach", trace.SpanKindInternal, "a"))
		rootSpan(t, det)
		failedWith(t, det, "lease_deadline")
		hasAttrs(t, det, "shardhost.detach.reason", d.Reason.String(), "shardhost.shard_count", "8",
			"shardhost.shards", "[0,1,2,3,4,5,6,7]", "shardhost.lease.deadline", d.Deadline.UTC().Format(time.RFC3339Nano))
		hasEvents(t, det, "shardhost.detach.entities_stopped")
		if n, _ := eventAttr(det, "shardhost.detach.entities_stopped", "shardhost.running"); n != "0" {
			t.Errorf("detach span: %s handlers still running at its end, want 0", n)
		}
		if took := det.EndTime().Sub(det.StartTime()); took < 2*time.Second || took > 4*time.Second {
			t.Errorf("the detach span lasted %v; want ≈ 3 s, until the handler that ignored its context returned", took)
		}

		re := s.waitEnded(t, "the reattach span", named("reattach", trace.SpanKindInternal, "a"))
		linkedTo(t, re, det)
		hasAttrs(t, re, "shardhost.lease.new", "false", "shardhost.shard_count", "8", "shardhost.shards", "[0,1,2,3,4,5,6,7]")
		hasEvents(t, re, "shardhost.reattach.registered", "shardhost.reattach.epochs_bumped")
		if re.Status().Code == codes.Error {
			t.Errorf("reattach span: error %q", re.Status().Description)
		}
		if !re.StartTime().After(det.StartTime()) {
			t.Errorf("reattach span started at %v, before the detach (%v)", re.StartTime(), det.StartTime())
		}
		if lease := spanAttr(re, "shardhost.lease"); lease == "" || lease == "0" {
			t.Errorf("reattach span: lease %q", lease)
		}
		keysKnown(t, s.ended())
	})
}

// TestCutoverWaitTraced: an ask that reaches the old owner while its
// shard's cutover runs waits there for the outcome, and its client span
// says so (a shardhost.cutover_wait event naming the shard and the new
// owner) before it is answered by the new owner.
func TestCutoverWaitTraced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		net := transport.NewInmemNetwork()
		s := newSpans(t)
		_, k, do := newWho()
		a := start(t, c, nil, s.traced(t, runner.Config{ID: "a", NumShards: 1, HandoffWait: time.Minute, Transport: net.Transport("a:7100")}))
		if err := a.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a owns the shard", func() bool { return len(a.Owned()) == 1 })
		warming, warm := make(chan struct{}, 1), make(chan struct{})
		hold := func(ctx context.Context, _ sharding.ShardID, _ string) error {
			warming <- struct{}{}
			<-warm
			return nil
		}
		b := start(t, c, nil, s.traced(t, runner.Config{ID: "b", NumShards: 1, Transport: net.Transport("b:7100"), WarmShard: hold}))
		if err := b.Register(k); err != nil {
			t.Fatal(err)
		}
		<-warming
		long := make(chan error, 1)
		go func() { // holds a's drain for 1 s (less than its bound, the detach instant)
			_, err := do.Ask(t.Context(), a, idFor(0, 1, "long"), whoReq{Sleep: time.Second, IgnoreCt: true})
			long <- err
		}()
		synctest.Wait()
		close(warm)
		time.Sleep(300 * time.Millisecond) // b is ready; a stopped admission and drains
		id := idFor(0, 1, "held")
		got, err := do.Ask(t.Context(), a, id, whoReq{})
		if err != nil || got.Runner != "b" {
			t.Fatalf("ask during the cutover = %+v, %v; want it served by b", got, err)
		}
		if err := <-long; err != nil {
			t.Fatalf("the long ask: %v", err)
		}
		client := s.waitEnded(t, "the held ask's client span", func(sp sdktrace.ReadOnlySpan) bool {
			return named("who/do", trace.SpanKindClient, "a")(sp) && spanAttr(sp, "shardhost.entity") == id
		})
		peer, ok := eventAttr(client, "shardhost.cutover_wait", "shardhost.peer")
		if !ok || peer != "b" {
			t.Errorf("client span events %v: want a shardhost.cutover_wait event naming b", client.Events())
		}
		if shard, _ := eventAttr(client, "shardhost.cutover_wait", "shardhost.shard"); shard != "0" {
			t.Errorf("cutover_wait event shard %q, want 0", shard)
		}
		keysKnown(t, s.ended())
	})
}
