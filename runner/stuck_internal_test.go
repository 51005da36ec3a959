package runner

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/shardhost/shardhost/storage/memory"
)

// A stuck shard's lock watch that is stopped and started again while the
// first watch's goroutine is still ending: that goroutine must not forget
// the second watch (its shard would look unwatched while it is, and a
// stop would no longer reach it).
func TestStuckWatchEndingLateKeepsTheNextWatchOfItsShard(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	r, err := New(c.NewStore("a"), Config{ID: "a", NumShards: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.view.stuck.watch(3, 1) // watch 1
	r.view.stuck.unwatch(3)  // stopped; its goroutine still runs
	r.view.stuck.watch(3, 1) // watch 2
	second := r.view.stuck.watched[3]
	r.mu.Unlock()
	if second != 2 {
		t.Fatalf("the second watch of shard 3 is number %d, want 2", second)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	r.watchStuck(ended, 3, 1, 1) // watch 1's goroutine ends now
	r.mu.Lock()
	got, ok := r.view.stuck.watched[3]
	r.mu.Unlock()
	if !ok || got != second {
		t.Fatalf("after the first watch ended: shard 3 watched %v (number %d), want watch %d kept", ok, got, second)
	}
	r.watchStuck(ended, 3, 1, second)
	r.mu.Lock()
	_, ok = r.view.stuck.watched[3]
	r.mu.Unlock()
	if ok {
		t.Fatal("after the second watch ended: shard 3 still watched")
	}
}
