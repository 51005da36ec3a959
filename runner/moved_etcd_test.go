package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// TestNewOwnerInstallsOnTheOldOwnersNoticeBeforeItsWatch: in a planned
// move, the old owner a tells the new owner b that its cutover moved the
// shard's lock to b; b reads the lock back and installs the shard at once,
// without waiting for its lock watch (held here for the whole move) to
// show the move. Ownership stays single throughout.
func TestNewOwnerInstallsOnTheOldOwnersNoticeBeforeItsWatch(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	const n = 2
	a := c.start(runner.Config{ID: "a", NumShards: n, ListenAddr: "127.0.0.1:0"})
	waitFor(t, 20*time.Second, "a owns every shard", func() bool { return len(a.Owned()) == n })
	warming := make(chan sharding.ShardID, n)
	proceed := make(chan struct{})
	b := c.start(runner.Config{ID: "b", NumShards: n, ListenAddr: "127.0.0.1:0", WarmTimeout: time.Minute,
		WarmShard: func(ctx context.Context, s sharding.ShardID, _ string) error {
			warming <- s
			select {
			case <-proceed:
			case <-ctx.Done():
			}
			return nil
		}})
	var id sharding.ShardID
	select {
	case id = <-warming:
	case <-time.After(30 * time.Second):
		t.Fatal("b never began a takeover from a")
	}
	release := b.HoldLockWatchForTest()
	t.Cleanup(release) // before the runners stop
	close(proceed)
	waitFor(t, 30*time.Second, "b owns the shard while its lock watch is held", func() bool {
		_, ok := b.Owned()[id]
		return ok
	})
	if _, ok := a.Owned()[id]; ok {
		t.Errorf("a still owns shard %d, which b installed", id)
	}
	release()
	waitFor(t, 30*time.Second, "a and b own every shard between them", func() bool {
		return len(a.Owned())+len(b.Owned()) == n && len(b.Owned()) > 0
	})
	checkSingleOwner(t, c.rec.all())
}
