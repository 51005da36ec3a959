package runner

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// TestMovedNoticeIsReadBackBeforeItIsTrusted: a notice that a shard's
// lock moved to this runner is a hint, not a proof. One naming another
// lease or incarnation, or a revision the lock watch has passed, is
// dropped without a read; one naming this runner's lease and incarnation
// at a revision the store does not hold it at (another runner holds the
// shard) is read back and refused: no install, and the lock view still
// names the real holder.
func TestMovedNoticeIsReadBackBeforeItIsTrusted(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	var aStore *memory.Store
	a := startTweaked(t, c, Config{ID: "a", ListenAddr: "127.0.0.1:0"}, func(r *Runner) { aStore = r.store.(*memory.Store) })
	b := startTweaked(t, c, Config{ID: "b", ListenAddr: "127.0.0.1:0"}, nil)
	waitUntil(t, 30*time.Second, "a and b own every shard between them", func() bool {
		return len(a.Owned())+len(b.Owned()) == 16 && len(a.Owned()) > 0 && len(b.Owned()) > 0
	})
	var id sharding.ShardID
	var bEpoch storage.Epoch
	for s, e := range b.Owned() {
		id, bEpoch = s, e
		break
	}
	a.mu.Lock()
	lease, inc, seen := a.lease, a.incarnation, a.view.seen.Locks
	a.mu.Unlock()
	future := uint64(seen) + 1000
	verifies := aStore.Calls(memory.OpVerify)
	for _, mv := range []transport.ShardMove{
		{Shard: uint32(id), Epoch: future, Lease: int64(lease) + 1, Incarnation: inc},     // another lease
		{Shard: uint32(id), Epoch: future, Lease: int64(lease), Incarnation: inc + "x"},   // another incarnation
		{Shard: uint32(id), Epoch: uint64(bEpoch), Lease: int64(lease), Incarnation: inc}, // a revision the watch passed
		{Shard: 16, Epoch: future, Lease: int64(lease), Incarnation: inc},                 // no such shard
	} {
		a.heardMoved("b", []transport.ShardMove{mv})
	}
	if n := aStore.Calls(memory.OpVerify) - verifies; n != 0 {
		t.Errorf("%d store reads for notices that cannot concern a; want none", n)
	}
	a.heardMoved("b", []transport.ShardMove{{Shard: uint32(id), Epoch: future, Lease: int64(lease), Incarnation: inc}})
	if n := aStore.Calls(memory.OpVerify) - verifies; n != 1 {
		t.Errorf("%d store reads for a notice naming a's lease and incarnation; want one", n)
	}
	if _, owned := a.Owned()[id]; owned {
		t.Fatalf("a owns shard %d (held by b at epoch %d) after a notice the store does not back", id, bEpoch)
	}
	a.mu.Lock()
	l, _ := a.view.locks.Get(id)
	a.mu.Unlock()
	if l.Lease != b.Status().Lease || l.Epoch != bEpoch {
		t.Errorf("a's lock view of shard %d = %+v after the notice; want b's lock at epoch %d", id, l, bEpoch)
	}
	if _, owned := b.Owned()[id]; !owned {
		t.Errorf("b lost shard %d", id)
	}
}
