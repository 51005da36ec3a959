package runner

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// An acquire that finds the lock already under this runner's lease,
// written during this attachment and naming this incarnation — a
// handoff's transfer to it that landed before the call, its notice still
// on the way — installs the shard at that epoch, as the notice will. It
// must not rewrite the lock: the rewrite killed the epoch the notice then
// installed, and the shard was dropped and taken again (its handlers
// interrupted, its one-shot reminders fired twice:
// TestReminderMovesWithItsShardExactlyOnce, once in CI).
func TestAcquireFindingATransferToItKeepsItsEpoch(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	a := startTweaked(t, c, Config{ID: "a"}, nil)
	b := startTweaked(t, c, Config{ID: "b"}, nil)
	waitUntil(t, 30*time.Second, "a and b to share the shards", func() bool {
		return len(a.Owned())+len(b.Owned()) == 16 && len(a.Owned()) > 0 && len(b.Owned()) > 0
	})
	var x sharding.ShardID
	for id := range a.Owned() {
		x = id
		break
	}
	b.mu.Lock()
	gen, actx, lease, owner := b.att.gen, b.att.ctx, b.att.lease, b.owner()
	b.mu.Unlock()
	val, err := storage.EncodeOwner(owner)
	if err != nil {
		t.Fatal(err)
	}
	// What a's cutover writes: the lock under b's lease, naming b.
	rev, err := c.Put(storage.LockKey(x), val, lease)
	if err != nil {
		t.Fatal(err)
	}
	b.acquire(actx, gen, lease, []sharding.ShardID{x})
	b.mu.Lock()
	s := b.shards.owner(x)
	b.mu.Unlock()
	if s == nil || s.epoch != storage.Epoch(rev) {
		got := storage.Epoch(0)
		if s != nil {
			got = s.epoch
		}
		t.Fatalf("after the acquire, b owns shard %d at epoch %d, want the transfer's epoch %d (a rewrite would have dropped it)", x, got, rev)
	}
}
