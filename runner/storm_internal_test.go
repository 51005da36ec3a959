package runner

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestStormGateActsOnQuietViews: membership changes are acted on when the
// view has been quiet (the loop's timer: the debounce, 5 for a runner that
// owns nothing), an isolated departure at once, and in a storm at most
// every 10 debounces by a runner that owns shards, every 50 by one that
// owns none.
func TestStormGateActsOnQuietViews(t *testing.T) {
	const d = 100 * time.Millisecond
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	var g stormGate
	if now, _ := g.change(at(0), d, true, true); !now {
		t.Error("an isolated departure after a quiet period waits")
	}
	if now, _ := g.change(at(50), d, true, true); now {
		t.Error("a departure 50ms after another change is acted on at once")
	}
	g.settled()
	if now, quiet := g.change(at(1000), d, false, true); now || quiet != d {
		t.Errorf("a join: now %v, quiet %v; want the debounce", now, quiet)
	}
	g.settled()
	if now, quiet := g.change(at(2000), d, false, false); now || quiet != 5*d {
		t.Errorf("a join seen by a runner that owns nothing: now %v, quiet %v; want 5 debounces", now, quiet)
	}
	g.settled()

	// A storm: a change every 20ms.
	for _, tc := range []struct {
		owns  bool
		first int // ms of the first recompute the gate asks for
	}{{true, 1000}, {false, 5000}} {
		var g stormGate
		first := -1
		for ms := 0; ms <= 6000 && first < 0; ms += 20 {
			if now, _ := g.change(at(ms), d, false, tc.owns); now {
				first = ms
			}
		}
		if first != tc.first {
			t.Errorf("owns %v: storm acted on after %dms, want %dms", tc.owns, first, tc.first)
		}
	}
}

// TestEmptyRunnerJoiningASettledClusterActsLikeAnOwner: a runner that owns
// nothing waits the long quiet of a cold start only while some shard is
// free or held by no live runner; once every shard is locked by another
// live runner it follows the owners' rule.
func TestEmptyRunnerJoiningASettledClusterActsLikeAnOwner(t *testing.T) {
	r := &Runner{locks: make(lockView, 4), byLease: map[storage.LeaseID]storage.Runner{}, lease: 7}
	r.byLease[1] = storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "a"}, Lease: 1}
	r.byLease[7] = storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "self"}, Lease: 7}
	if r.clusterSettledLocked() {
		t.Fatal("no shard locked: settled")
	}
	for id := range 4 {
		r.locks.set(storage.Lock{Shard: sharding.ShardID(id), Lease: 1, Epoch: storage.Epoch(10 + id)})
	}
	if !r.clusterSettledLocked() {
		t.Fatal("every shard locked by a live runner: not settled")
	}
	r.locks.set(storage.Lock{Shard: 2, Lease: 9, Epoch: 20}) // a lease with no live runner
	if r.clusterSettledLocked() {
		t.Fatal("a shard held by a gone runner: settled")
	}
	r.locks.set(storage.Lock{Shard: 2, Lease: 7, Epoch: 21}) // our own
	if r.clusterSettledLocked() {
		t.Fatal("a shard locked by this runner: settled (it owns something)")
	}
	r.locks.del(2)
	if r.clusterSettledLocked() {
		t.Fatal("a free shard: settled")
	}
}
