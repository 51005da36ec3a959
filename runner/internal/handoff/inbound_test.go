package handoff

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/storage"
)

var (
	t0  = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	old = storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "a", Address: "a:1"}, Lease: 10}
)

// TestInboundEndCancelsItsContext: a takeover's context lives while it is
// warming or ready and ends with it (cutover, abort, acquisition), or with
// its parent (the attachment).
func TestInboundEndCancelsItsContext(t *testing.T) {
	for _, end := range []Phase{Cutover, Aborted, Acquired} {
		in := NewInbound(t.Context(), old, 7, t0)
		for _, p := range []Phase{Warming, Ready} {
			if err := in.Advance(p, nil); err != nil || in.Context().Err() != nil {
				t.Fatalf("%v: %v, context %v", p, err, in.Context().Err())
			}
		}
		if err := in.Advance(end, nil); err != nil {
			t.Fatal(err)
		}
		if in.Context().Err() == nil || in.Phase() != end {
			t.Errorf("ended %v: context not cancelled (phase %v)", end, in.Phase())
		}
	}
	parent, cancel := context.WithCancel(t.Context())
	in := NewInbound(parent, old, 7, t0)
	cancel()
	if in.Context().Err() == nil {
		t.Error("the takeover outlives its attachment's context")
	}
	if in.From() != old || in.FromEpoch() != 7 || !in.Started().Equal(t0) || in.Phase() != Planned {
		t.Errorf("NewInbound: from %+v epoch %d started %v phase %v", in.From(), in.FromEpoch(), in.Started(), in.Phase())
	}
}

// TestInboundReportsOnlyLegalTransitions: report runs for a legal
// transition and never for a refused one; a late abort (the takeover
// already ended) is refused as ErrEnded and reported nowhere.
func TestInboundReportsOnlyLegalTransitions(t *testing.T) {
	in := NewInbound(t.Context(), old, 7, t0)
	var reported []Phase
	report := func(p Phase) func() { return func() { reported = append(reported, p) } }
	if err := in.Advance(Ready, report(Ready)); !errors.Is(err, ErrIllegal) {
		t.Errorf("ready before warming: %v, want ErrIllegal", err)
	}
	for _, p := range []Phase{Warming, Ready, Cutover} {
		if err := in.Advance(p, report(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := in.Advance(Aborted, report(Aborted)); !errors.Is(err, ErrEnded) {
		t.Errorf("abort after cutover: %v, want ErrEnded", err)
	}
	if want := []Phase{Warming, Ready, Cutover}; len(reported) != len(want) || reported[0] != want[0] || reported[1] != want[1] || reported[2] != want[2] {
		t.Errorf("reported %v, want %v", reported, want)
	}
}

// TestInboundEndsOnceUnderConcurrentReports: of many goroutines ending
// one takeover at once (an abort by the round, one by the goroutine
// running it, the lock arriving), exactly one end is reported, and it is
// the takeover's phase.
func TestInboundEndsOnceUnderConcurrentReports(t *testing.T) {
	for range 50 {
		in := NewInbound(t.Context(), old, 7, t0)
		_ = in.Advance(Warming, nil)
		var mu sync.Mutex
		var ends []Phase
		var wg sync.WaitGroup
		for i := range 12 {
			p := []Phase{Aborted, Cutover, Acquired}[i%3]
			wg.Go(func() {
				_ = in.Advance(p, func() { mu.Lock(); ends = append(ends, p); mu.Unlock() })
			})
		}
		wg.Wait()
		if len(ends) != 1 || in.Phase() != ends[0] {
			t.Fatalf("ends reported %v, phase %v; want one, the phase", ends, in.Phase())
		}
	}
}

// TestInboundWarmedInstancesAreTakenOnce: instances warmed before the
// install are handed over once; those warmed later are dropped.
func TestInboundWarmedInstancesAreTakenOnce(t *testing.T) {
	in := NewInbound(t.Context(), old, 7, t0)
	k1, k2 := hosting.EntityKey{Kind: "k", ID: "1"}, hosting.EntityKey{Kind: "k", ID: "2"}
	in.Warmed(k1, "one")
	w := in.TakeWarmed()
	if len(w) != 1 || w[k1] != "one" {
		t.Fatalf("TakeWarmed() = %v, want k/1", w)
	}
	in.Warmed(k2, "two") // late: dropped
	if w := in.TakeWarmed(); w != nil {
		t.Errorf("a second TakeWarmed() = %v, want nil", w)
	}
	if len(w) != 1 {
		t.Errorf("a late warm result changed the instances handed over: %v", w)
	}
}

// TestInboundRestartsWhenTheLockChangedHandsOrWasRewritten: a takeover
// starts over when the shard's lock is under another lease (with the new
// holder named) or was rewritten under the same lease (with both epochs),
// and goes on while the lock is the one it started from.
func TestInboundRestartsWhenTheLockChangedHandsOrWasRewritten(t *testing.T) {
	in := NewInbound(t.Context(), old, 10, t0)
	for _, tc := range []struct {
		l       storage.Lock
		holder  string
		restart bool
		why     string
	}{
		{storage.Lock{Shard: 3, Lease: 10, Epoch: 10}, "a", false, ""},
		{storage.Lock{Shard: 3, Lease: 11, Epoch: 10}, "b", true, "the old owner changed to b"},
		{storage.Lock{Shard: 3, Lease: 11, Epoch: 12}, "b", true, "the old owner changed to b"},
		{storage.Lock{Shard: 3, Lease: 10, Epoch: 12}, "a", true, "the old owner rewrote its lock (epoch 12, was 10)"},
		{storage.Lock{Shard: 3, Lease: 10, Epoch: 11}, "a", true, "the old owner rewrote its lock (epoch 11, was 10)"},
	} {
		why, restart := in.Restart(tc.l, tc.holder)
		if restart != tc.restart || why != tc.why {
			t.Errorf("Restart(%+v, %q) = %q, %v; want %q, %v", tc.l, tc.holder, why, restart, tc.why, tc.restart)
		}
	}
}
