package runner

import (
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// TestRateSampler: rates are counter deltas over the interval between two
// samples at least rateInterval apart; samples in between reuse them.
func TestRateSampler(t *testing.T) {
	var s rateSampler
	t0 := time.Unix(1000, 0)
	if got := s.update(t0, map[string]uint64{"total": 100}); got != nil {
		t.Fatalf("first sample gave rates %v, want none", got)
	}
	if got := s.update(t0.Add(500*time.Millisecond), map[string]uint64{"total": 400}); got != nil {
		t.Fatalf("sample after 0.5 s gave rates %v, want none yet", got)
	}
	got := s.update(t0.Add(2*time.Second), map[string]uint64{"total": 700, "kind:a": 5})
	if got["total"] != 300 || len(got) != 1 {
		t.Fatalf("rates after 2 s = %v, want total 300/s only (kind:a has no earlier sample)", got)
	}
	if again := s.update(t0.Add(2500*time.Millisecond), map[string]uint64{"total": 9999}); again["total"] != 300 {
		t.Errorf("sample 0.5 s later gave %v, want the last rates", again)
	}
	got = s.update(t0.Add(4*time.Second), map[string]uint64{"total": 700, "kind:a": 25})
	if got["total"] != 0 || got["kind:a"] != 10 {
		t.Errorf("rates = %v, want total 0/s, kind:a 10/s", got)
	}
}

// TestEventRing: the ring keeps the last recentEvents events, newest first.
func TestEventRing(t *testing.T) {
	var ring eventRing
	if got := ring.last(10); len(got) != 0 {
		t.Fatalf("empty ring gave %d events", len(got))
	}
	for i := range recentEvents + 44 {
		ring.add(ShardAcquired{Shard: sharding.ShardID(i)})
	}
	got := ring.last(3)
	for i, want := range []int{recentEvents + 43, recentEvents + 42, recentEvents + 41} {
		if s := got[i].(ShardAcquired).Shard; int(s) != want {
			t.Errorf("last(3)[%d] = shard %d, want %d", i, s, want)
		}
	}
	all := ring.last(10 * recentEvents)
	if len(all) != recentEvents || int(all[len(all)-1].(ShardAcquired).Shard) != 44 {
		t.Errorf("last(all) = %d events ending at %v, want %d ending at shard 44", len(all), all[len(all)-1], recentEvents)
	}
}

// TestRunnerColors: colours are distinct within the palette, and a
// runner keeps its colour when another one leaves.
func TestRunnerColors(t *testing.T) {
	ids := []string{"runner-1", "runner-2", "runner-3", "a", "b", "c", "d", "e", "f", "g", "h", "i"}
	colors := runnerColors(ids)
	seen := map[string]string{}
	for i, c := range colors {
		if other, dup := seen[c]; dup {
			t.Errorf("%s and %s share colour %s", other, ids[i], c)
		}
		seen[c] = ids[i]
	}
	three := runnerColors(ids[:3])
	without2 := runnerColors([]string{"runner-1", "runner-3"})
	if without2[0] != three[0] || without2[1] != three[2] {
		t.Errorf("colours of runner-1, runner-3: %v with runner-2, %v without", []string{three[0], three[2]}, without2)
	}
	if more := runnerColors(append(ids, "j")); more[12] == "" || slices.Contains(debugPalette, more[12]) {
		t.Errorf("13th runner got %q, want a hue outside the palette", more[12])
	}
}
