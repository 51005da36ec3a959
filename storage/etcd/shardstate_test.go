package etcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// A shard's state is read serializably, from whichever member answers,
// but never below its floor: a member behind it reads again linearizably.
// Here the reading store's only member is a follower that was stopped
// while the write committed: each read right after its resume must see
// the write, whether that member had caught up or not.
func TestShardStateReadNeverReturnsStateOlderThanItsFloor(t *testing.T) {
	c := testenv.StartEtcdCluster(t, 3)
	leader := c.Leader(t)
	var follower *testenv.Etcd
	for _, m := range c.Members() {
		if m != leader {
			follower = m
			break
		}
	}
	ns := "floor"
	writer, err := etcd.New(testenv.NewEtcdClient(t, leader.Endpoint()), ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reader, err := etcd.New(testenv.NewEtcdClient(t, follower.Endpoint()), ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	l, err := writer.Grant(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	const shard = sharding.ShardID(5)
	acq, err := writer.Acquire(ctx, l.ID, storage.Owner{RunnerID: "w", Incarnation: "1"}, []sharding.ShardID{shard})
	if err != nil || acq[0].Status != storage.Acquired {
		t.Fatalf("Acquire = %+v, %v", acq, err)
	}
	const rounds = 8
	for i := range rounds {
		ref := storage.EntityRef{Kind: "k", ID: string(rune('a' + i))}
		follower.Pause()
		res, err := writer.WriteShardStates(ctx, []storage.ShardWrite{{Shard: shard, Epoch: acq[0].Epoch, PutRemembered: []storage.EntityRef{ref}}})
		follower.Resume()
		if err != nil || res[0].Err != nil {
			t.Fatalf("round %d: WriteShardStates = %+v, %v", i, res, err)
		}
		sts, err := reader.ReadShardStates(ctx, []sharding.ShardID{shard}, res[0].Revision)
		if err != nil {
			t.Fatalf("round %d: ReadShardStates: %v", i, err)
		}
		if got := len(sts[0].Remembered); got != i+1 || sts[0].Revision < res[0].Revision {
			t.Fatalf("round %d: read %d remembered entities at revision %d, want %d at %d or later (reads made again: %d)",
				i, got, sts[0].Revision, i+1, res[0].Revision, reader.Stats().StateReadsBehind)
		}
	}
	t.Logf("of %d reads right after the follower resumed, %d found it behind and read again", rounds, reader.Stats().StateReadsBehind)

	// A floor no member has reached yet: the read is made again
	// linearizably, and answers the latest state.
	before := reader.Stats().StateReadsBehind
	sts, err := reader.ReadShardStates(ctx, []sharding.ShardID{shard}, storage.Revision(acq[0].Epoch)+1_000_000)
	if err != nil || len(sts[0].Remembered) != rounds {
		t.Fatalf("ReadShardStates(floor ahead of the cluster) = %+v, %v", sts, err)
	}
	if got := reader.Stats().StateReadsBehind - before; got != 1 {
		t.Fatalf("a read whose floor is ahead of every member was made again %d times, want 1", got)
	}
	// The writer's own writes are its floor even with atLeast 0.
	before = writer.Stats().StateReadsBehind
	if sts, err := writer.ReadShardStates(ctx, []sharding.ShardID{shard}, 0); err != nil || len(sts[0].Remembered) != rounds {
		t.Fatalf("writer's ReadShardStates(0) = %+v, %v", sts, err)
	}
	if got := writer.Stats().StateReadsBehind - before; got != 0 {
		t.Fatalf("the leader, which applied every write, was found behind %d times", got)
	}
}
