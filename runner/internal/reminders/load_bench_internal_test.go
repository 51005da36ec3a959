package reminders

import (
	"context"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// BenchmarkLoadShardsAtOnce: a runner acquiring 16 384 shards at once (a
// cold start) loads their reminder sets from the in-memory store, loadBatch
// shards per read: the set loop's work per round is proportional to the
// sets it calls for, not to the sets queued (a queue scanned whole each
// round took 8.9 s here).
func BenchmarkLoadShardsAtOnce(b *testing.B) {
	const n = 16384
	c := memory.NewCluster()
	defer c.Close()
	st := c.NewStore("a")
	for b.Loop() {
		s := newTestService(b, st)
		ctx, cancel := context.WithCancel(context.Background())
		for i := range n {
			s.Acquired(sharding.ShardID(i), storage.Epoch(1), ctx)
		}
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		for {
			if loaded, _ := s.Sets(); loaded == n {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
	}
}
