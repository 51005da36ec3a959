package runner

import (
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestStartedTakeoverRereadsItsLockWithoutAnotherEvent: without a full
// lock view, a runner may start a takeover from a holder that released
// the lock already (its view predates the release, told to another
// assignee). No cutover and no notice comes then; only the takeover's
// re-read of its lock (takeovers.go) finds the lock free. The round that
// starts the takeover must ask for that re-read itself: it relied on a
// later decision of the shard, which nothing may ever cause, and the
// shard stayed unowned (simulation seed 654378).
func TestStartedTakeoverRereadsItsLockWithoutAnotherEvent(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	r, l, from := leasedRunner(t, c.NewStore("me"), 2)
	if r.view.full {
		t.Fatal("the runner keeps a full lock view; the test needs a scoped one")
	}
	const id = sharding.ShardID(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	self := storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "me", Weight: 1, Incarnation: r.incarnation}, Lease: l.ID}
	r.view.members = map[string]storage.Runner{"me": self, from.ID: from}
	r.view.byLease = map[storage.LeaseID]storage.Runner{l.ID: self, from.Lease: from}
	r.view.assignment = control.CompactAssignment(sharding.Assignment{from.ID, "me"})
	// The stale lock: the old owner released it since, unbeknown to us.
	r.view.locks.Set(storage.Lock{Shard: id, Owner: storage.Owner{RunnerID: from.ID, Incarnation: from.Incarnation}, Lease: from.Lease, Epoch: 10})

	decide := func(now time.Time) plan {
		st := control.Round{Now: now, Self: "me", Lease: l.ID, Interval: r.cfg.AcquireRetryInterval, Registered: r.view.registered(r.cfg.ID, r.incarnation, r.att.lease)}
		var p plan
		r.decideLocked(id, &st, &p)
		return p
	}
	start := time.Now()
	if p := decide(start); len(p.inbound) != 1 || p.inbound[0].id != id {
		t.Fatalf("the round started takeovers %v; want shard %d's", p.inbound, id)
	}
	// Nothing else happens to the shard: only a timer of its own can
	// bring it back.
	due := r.shards.at(id).inbound.Started().Add(r.cfg.takeoverRecheck())
	r.work.Fire(due)
	if ids, all := r.work.Take(); all || !slices.Contains(ids, id) {
		t.Fatalf("shard %d is not decided again %v after its takeover started (marked %v, all %v): its lock is never re-read", id, r.cfg.takeoverRecheck(), ids, all)
	}
	if p := decide(due); !slices.Contains(p.recheck, id) {
		t.Fatalf("the round deciding shard %d again re-reads %v; want its lock", id, p.recheck)
	}
}
