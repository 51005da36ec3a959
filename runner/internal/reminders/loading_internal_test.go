package reminders

import (
	"context"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestLoadingCountsTheSetsNotLoadedYet: Loading counts the owned shards
// whose sets wait for their first load — up at an acquisition, down at the
// load or when the set stops first — and agrees with Sets at every step.
func TestLoadingCountsTheSetsNotLoadedYet(t *testing.T) {
	const n = 40
	c := memory.NewCluster()
	defer c.Close()
	st := c.NewStore("a")
	s := newTestService(t, st)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	agree := func(want int) {
		t.Helper()
		_, loading := s.Sets()
		if got := s.Loading(); got != int64(want) || loading != want {
			t.Fatalf("Loading() = %d, Sets' loading %d, want %d", got, loading, want)
		}
	}
	agree(0)
	for i := range n {
		s.Acquired(sharding.ShardID(i), storage.Epoch(1), ctx)
	}
	agree(n)
	// A shard released before its load, and one acquired again at a
	// later epoch (its earlier set stops): each counts once.
	s.Stop(0, storage.Epoch(1), false)
	s.Acquired(1, storage.Epoch(2), ctx)
	agree(n - 1)
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	deadline := time.Now().Add(time.Minute)
	for s.Loading() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sets still loading after a minute", s.Loading())
		}
		time.Sleep(time.Millisecond)
	}
	agree(0)
	if loaded, _ := s.Sets(); loaded != n-1 {
		t.Fatalf("%d sets loaded, want %d", loaded, n-1)
	}
	s.StopAll()
	agree(0)
	cancel()
	<-done
}
