package main

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner"
)

// TestDemo runs both scenarios on an embedded etcd with short traffic
// phases and checks what the demo claims: no failed or stale read and
// exact views in both; the old owners ran ReleaseShard for every moved
// partition in both; with handoff the new owners warmed every moved
// partition and no read on them replayed a partition's log, without
// handoff they started cold. No goleak here: the embedded etcd server
// leaves goroutines behind after Close.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd and two clusters")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	o := defaults()
	o.steady, o.after, o.readers = time.Second, time.Second, 4
	o.out, o.logs = &bytes.Buffer{}, io.Discard
	s, err := run(ctx, o)
	t.Log("\n" + o.out.(*bytes.Buffer).String())
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(s.Problems) > 0 {
		t.Errorf("problems: %q", s.Problems)
	}
	if len(s.Scenarios) != 2 {
		t.Fatalf("%d scenarios, want 2", len(s.Scenarios))
	}
	h, p := s.Scenarios[0], s.Scenarios[1]
	for _, sc := range s.Scenarios {
		if len(sc.Moved) == 0 || sc.OnNew.N == 0 {
			t.Fatalf("%s: %d partitions moved, %d reads on their new owner: nothing to compare", sc.Name, len(sc.Moved), sc.OnNew.N)
		}
		if len(sc.FirstOnNew) != len(sc.Moved) {
			t.Errorf("%s: %d of the %d moved partitions read on their new owner in the move window", sc.Name, len(sc.FirstOnNew), len(sc.Moved))
		}
		// The old owner runs ReleaseShard for every moved shard, on a
		// handoff's cutover and on a plain release alike.
		if sc.Releases < len(sc.Moved) {
			t.Errorf("%s: %d ReleaseShard calls for %d moved partitions, want one per moved partition", sc.Name, sc.Releases, len(sc.Moved))
		}
	}

	// With handoff: every moved partition was warmed to its head and cut
	// over, and no read on a new owner had to replay the log.
	if !h.Handoff || p.Handoff {
		t.Fatalf("scenario order: %q then %q", h.Name, p.Name)
	}
	if h.Cold != 0 {
		t.Errorf("handoff: %d reads on new owners replayed >= %d records, want 0 (the view was warmed)", h.Cold, h.ColdRecords)
	}
	if got := maxReplayed(h.FirstOnNew); got >= h.ColdRecords {
		t.Errorf("handoff: a first read on a new owner replayed %d records", got)
	}
	complete := 0
	for _, w := range h.Warms {
		if w.Err == nil && w.Complete && w.Records >= int64(o.history) {
			complete++
		}
	}
	if complete < len(h.Moved) {
		t.Errorf("handoff: %d complete WarmShard calls of >= %d records for %d moved partitions: %+v", complete, o.history, len(h.Moved), h.Warms)
	}
	for _, ph := range []string{runner.PhaseWarming, runner.PhaseReady, runner.PhaseDrained, runner.PhaseCutover} {
		if h.Phases[ph] < len(h.Moved) {
			t.Errorf("handoff: %d %q events for %d moved partitions", h.Phases[ph], ph, len(h.Moved))
		}
	}

	// Without handoff: nothing warmed, and the moved partitions' first
	// reads on their new owner replayed the whole log.
	if len(p.Warms) != 0 || len(p.Phases) != 0 {
		t.Errorf("DisableHandoff: %d WarmShard calls and handoff events %v, want none", len(p.Warms), p.Phases)
	}
	if p.Cold == 0 {
		t.Errorf("DisableHandoff: no read on a new owner replayed the log: the demo shows no cost of starting cold")
	}
	if got := maxReplayed(p.FirstOnNew); got < int64(o.history) {
		t.Errorf("DisableHandoff: the first reads on new owners replayed at most %d records, want >= %d", got, o.history)
	}
	if p.Cold <= h.Cold {
		t.Errorf("cold reads on new owners: %d with handoff, %d without", h.Cold, p.Cold)
	}
}
