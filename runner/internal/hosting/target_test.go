package hosting

import (
	"context"
	"slices"
	"testing"
	"time"
)

func TestTargetIsNotCurrentWhileItsShardStopsAdmitting(t *testing.T) {
	f, k, add, get := newSeqFixture(t)
	if res := f.shard.Deliver(context.Background(), k, add, "s", seqReq{N: 1}, true, false, false); res.Err != nil {
		t.Fatal(res)
	}
	tg := f.host.Target(1, k, "s")
	if tg == nil {
		t.Fatal("no target for a resident entity")
	}
	if tg.Kind() != k {
		t.Fatalf("target kind %v, want %v", tg.Kind(), k)
	}
	tell := func(n int) (Result, bool) { return tg.Deliver(context.Background(), add, seqReq{N: n}) }
	if res, current := tell(2); !current || res.Err != nil {
		t.Fatalf("tell through a current target = %+v, current %v", res, current)
	}
	f.shard.BeginCutover("b")
	if res, current := tell(3); current {
		t.Fatalf("tell through a target whose shard is cutting over = %+v, current: want not current (sent by ID)", res)
	}
	if f.host.Target(1, k, "s") != nil {
		t.Error("Target found an entity of a shard not admitting")
	}
	f.shard.Reopen() // the handoff failed: the same instance serves again
	if res, current := tell(4); !current || res.Err != nil {
		t.Fatalf("tell through the target after Reopen = %+v, current %v", res, current)
	}
	res := f.shard.Deliver(context.Background(), k, get, "s", struct{}{}, false, false, false)
	if got := res.V.([]int); res.Err != nil || !slices.Equal(got, []int{1, 2, 4}) {
		t.Fatalf("entity ran %v (%v), want [1 2 4]: the tell refused while cutting over never ran", got, res.Err)
	}
}

func TestTargetOfAPassivatedEntityIsNotCurrent(t *testing.T) {
	f, k, add, get := newSeqFixture(t)
	if res := f.shard.Deliver(context.Background(), k, add, "s", seqReq{N: 1}, true, false, false); res.Err != nil {
		t.Fatal(res)
	}
	tg := f.host.Target(1, k, "s")
	waitIdleEntity(t, tg.e)
	if !f.shard.retire(tg.e, ErrPassivated) {
		t.Fatal("the idle entity was not retired")
	}
	if res, current := tg.Deliver(context.Background(), add, seqReq{N: 2}); current {
		t.Fatalf("tell through the target of a passivated entity = %+v, current: want not current", res)
	}
	// By ID, a new instance activates; the target found now is its own.
	res := f.shard.Deliver(context.Background(), k, get, "s", struct{}{}, false, false, false)
	if got := res.V.([]int); res.Err != nil || len(got) != 0 {
		t.Fatalf("new instance holds %v (%v), want nothing: the refused tell never ran", got, res.Err)
	}
	if again := f.host.Target(1, k, "s"); again == nil || again.e == tg.e {
		t.Fatalf("Target after the passivation = %v, want the new instance", again)
	}
}

// TestStoppingAdmissionWaitsForATargetPushInProgress proves the barrier
// of stopAdmittingLocked: a sender through a target holds its entity's
// lock, not the shard's, from its admission check to its push; turning
// admission off returns only once such a push completed, as it would wait
// for a sender by ID holding the shard's lock (read).
func TestStoppingAdmissionWaitsForATargetPushInProgress(t *testing.T) {
	f, k, add, get := newSeqFixture(t)
	if res := f.shard.Deliver(context.Background(), k, add, "s", seqReq{N: 1}, true, false, false); res.Err != nil {
		t.Fatal(res)
	}
	tg := f.host.Target(1, k, "s")
	waitIdleEntity(t, tg.e)
	// A sender through the target, between its admission check and its
	// push (Target.enqueue).
	tg.e.mu.Lock()
	if !f.shard.open.Load() {
		t.Fatal("admission off before the cutover")
	}
	cut := make(chan struct{})
	go func() { defer close(cut); f.shard.BeginCutover("b") }()
	select {
	case <-cut:
		tg.e.mu.Unlock()
		t.Fatal("BeginCutover returned while a push that saw admission on was in progress")
	case <-time.After(100 * time.Millisecond):
	}
	start, err := tg.e.pushLocked(&message{h: add, req: seqReq{N: 2}})
	tg.e.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if start {
		tg.e.start()
	}
	wait(t, cut, "BeginCutover after the push")
	if res, current := tg.Deliver(context.Background(), add, seqReq{N: 3}); current {
		t.Fatalf("tell through the target after the cutover began = %+v, current: want not current", res)
	}
	f.shard.Reopen()
	res := f.shard.Deliver(context.Background(), k, get, "s", struct{}{}, false, false, false)
	if got := res.V.([]int); res.Err != nil || !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("entity ran %v (%v), want [1 2]", got, res.Err)
	}
}

// waitIdleEntity waits until e has no goroutine and no message.
func waitIdleEntity(t *testing.T, e *resident) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !e.idle(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the entity never went idle")
		}
	}
}
