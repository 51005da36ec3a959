package control

import (
	"testing"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestLockViewHoldsOneLockPerShard: a shard is held once a lock is set for
// it, and free again after Del or Reset; setting one shard's lock touches
// no other shard.
func TestLockViewHoldsOneLockPerShard(t *testing.T) {
	v := NewLockView(3)
	for id := range 3 {
		if l, held := v.Get(sharding.ShardID(id)); held || l != (storage.Lock{}) {
			t.Fatalf("Get(%d) on a new view = %+v, %v; want no lock", id, l, held)
		}
	}
	want := storage.Lock{Shard: 1, Lease: 7, Epoch: 12}
	v.Set(want)
	if l, held := v.Get(1); !held || l != want {
		t.Errorf("Get(1) = %+v, %v; want %+v, true", l, held, want)
	}
	if _, held := v.Get(0); held {
		t.Error("setting shard 1's lock made shard 0 held")
	}
	v.Del(1)
	if _, held := v.Get(1); held {
		t.Error("Get(1) after Del: held")
	}
	// A key without a lease is still a lock (never an owner's, but the
	// shard is not free: it is taken over, not acquired).
	v.Set(storage.Lock{Shard: 0, Lease: storage.NoLease, Epoch: 5})
	if _, held := v.Get(0); !held {
		t.Error("a lock without a lease: not held")
	}
	v.Set(want)
	v.Set(storage.Lock{Shard: 2, Lease: 8, Epoch: 13})
	v.Reset()
	for id := range 3 {
		if _, held := v.Get(sharding.ShardID(id)); held {
			t.Errorf("Get(%d) after Reset: held", id)
		}
	}
}

// TestEmptyRunnerJoiningASettledClusterActsLikeAnOwner: a runner that owns
// nothing waits the long quiet of a cold start only while some shard is
// free or held by no live runner; once every shard is locked by another
// live runner it follows the owners' rule.
func TestEmptyRunnerJoiningASettledClusterActsLikeAnOwner(t *testing.T) {
	const self = storage.LeaseID(7)
	v := NewLockView(4)
	live := map[storage.LeaseID]storage.Runner{
		1:    {RunnerRecord: storage.RunnerRecord{ID: "a"}, Lease: 1},
		self: {RunnerRecord: storage.RunnerRecord{ID: "self"}, Lease: self},
	}
	if v.SettledElsewhere(self, live) {
		t.Fatal("no shard locked: settled")
	}
	for id := range 4 {
		v.Set(storage.Lock{Shard: sharding.ShardID(id), Lease: 1, Epoch: storage.Epoch(10 + id)})
	}
	if !v.SettledElsewhere(self, live) {
		t.Fatal("every shard locked by a live runner: not settled")
	}
	v.Set(storage.Lock{Shard: 2, Lease: 9, Epoch: 20}) // a lease with no live runner
	if v.SettledElsewhere(self, live) {
		t.Fatal("a shard held by a gone runner: settled")
	}
	v.Set(storage.Lock{Shard: 2, Lease: self, Epoch: 21}) // our own
	if v.SettledElsewhere(self, live) {
		t.Fatal("a shard locked by this runner: settled (it owns something)")
	}
	v.Del(2)
	if v.SettledElsewhere(self, live) {
		t.Fatal("a free shard: settled")
	}
	if NewLockView(0).SettledElsewhere(self, live) {
		t.Fatal("a view of no shards: settled")
	}
}

// TestEpochOfFindsTheListedEpoch: EpochOf returns the epoch a shard is
// listed at, 0 for a shard not listed.
func TestEpochOfFindsTheListedEpoch(t *testing.T) {
	held := []storage.Held{{Shard: 3, Epoch: 30}, {Shard: 1, Epoch: 10}}
	for _, tc := range []struct {
		id   sharding.ShardID
		want storage.Epoch
	}{{3, 30}, {1, 10}, {2, 0}} {
		if got := EpochOf(held, tc.id); got != tc.want {
			t.Errorf("EpochOf(%v, %d) = %d, want %d", held, tc.id, got, tc.want)
		}
	}
}
