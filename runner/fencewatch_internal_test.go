package runner

import (
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestFencedWriteDropsTheShard: an entity's checkpoint write refused
// because the shard's lock was rewritten behind the runner's back (under
// its own lease: still attached to it, so the verification by lease keys
// cannot see it) drops that shard at once, as the lock watch did; a write
// refused for its checkpoint's revision (the lock unchanged) does not.
func TestFencedWriteDropsTheShard(t *testing.T) {
	r := attachedRunner(t, 0)
	ctx := t.Context()
	l, err := r.store.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.store.Acquire(ctx, l.ID, r.owner(), []sharding.ShardID{1, 2})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.att.lease = l.ID
	for _, a := range res {
		r.installWithLocked(a.Shard, a.Epoch, entity.ActivateNew, nil)
	}
	r.mu.Unlock()
	fw := fenceWatch{r.store, r}

	// Shard 2: a checkpoint changed since (prev 0 is stale), lock unchanged.
	if _, err := fw.WriteCheckpoint(ctx, 2, "x", res[1].Epoch, storage.AnyRevision, []byte("v")); err != nil {
		t.Fatal(err)
	}
	if _, err := fw.WriteCheckpoint(ctx, 2, "x", res[1].Epoch, 0, []byte("w")); !errors.Is(err, storage.ErrCheckpointChanged) {
		t.Fatalf("write at a stale checkpoint revision = %v, want ErrCheckpointChanged", err)
	}
	// Shard 1: rewritten under our lease by somebody else.
	if _, err := r.store.Rewrite(ctx, l.ID, r.owner(), []sharding.ShardID{1}); err != nil {
		t.Fatal(err)
	}
	if _, err := fw.WriteCheckpoint(ctx, 1, "x", res[0].Epoch, storage.AnyRevision, []byte("v")); !errors.Is(err, storage.ErrFenced) {
		t.Fatalf("write at the dead epoch = %v, want ErrFenced", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shards.owner(1) != nil {
		t.Error("shard 1 still hosted after a write at its epoch was fenced")
	}
	if s := r.shards.owner(2); s == nil || s.epoch != res[1].Epoch {
		t.Error("shard 2 dropped by a refusal that says nothing about its lock")
	}
}

// TestRewriteOfAnInstalledShardReinstallsIt: an acquisition attempt that
// finds a lock already under this runner's lease rewrites it (a new epoch)
// before installing it; when the shard was installed meanwhile (a
// transfer's notice raced with the call), the rewrite killed the epoch it
// is hosted at, so it is dropped and installed again at the new epoch —
// never left serving at a dead epoch, where every fenced write fails (the
// simulation's reminders of such a shard never fired again).
func TestRewriteOfAnInstalledShardReinstallsIt(t *testing.T) {
	r := attachedRunner(t, 0)
	ctx := t.Context()
	l, err := r.store.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.store.Acquire(ctx, l.ID, r.owner(), []sharding.ShardID{3})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.att.lease = l.ID
	r.installWithLocked(3, res[0].Epoch, entity.ActivateNew, nil)
	r.mu.Unlock()
	rw, err := r.store.Rewrite(ctx, l.ID, r.owner(), []sharding.ShardID{3}) // the rewrite that raced with the install
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.installRewrittenLocked(rw)
	s := r.shards.owner(3)
	r.mu.Unlock()
	if s == nil || s.epoch <= res[0].Epoch {
		t.Fatalf("after the rewrite the shard is hosted at %v, want a new epoch above %d", s, res[0].Epoch)
	}
	if _, err := (fenceWatch{r.store, r}).WriteCheckpoint(ctx, 3, "x", s.epoch, storage.AnyRevision, []byte("v")); err != nil {
		t.Fatalf("a write at the hosted epoch = %v, want it accepted", err)
	}
}
