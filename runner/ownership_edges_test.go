package runner_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// A shard assigned away and back while its drain is still running must be
// owned again once the drain ends (it is pending again, not forgotten).
func TestShardAssignedBackDuringDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		c, a, _ := startHosting(t, k, runner.Config{ID: "a", NumShards: 8})
		release := make(chan struct{})
		for s := range sharding.ShardID(8) {
			go func() { _, _ = k.block.Ask(context.Background(), a, idFor(s, 8, "blk"), blockReq{Release: release}) }()
		}
		synctest.Wait()
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 8})
		waitFor(t, 5*time.Second, "a draining shards for b", func() bool { return len(a.Assignment().ShardsOf("b")) > 0 })
		time.Sleep(100 * time.Millisecond)
		if err := b.Shutdown(context.Background()); err != nil { // assigned back to a
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		close(release) // the drains end; the locks are deleted
		waitFor(t, 10*time.Second, "a owning all 8 again", func() bool { return len(a.Owned()) == 8 })
	})
}

// A release whose store call fails leaves the lock under our lease; the
// control loop must delete it once the store works again, so the new
// assignee gets the shard.
func TestOrphanLockAfterFailedRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		waitFor(t, 5*time.Second, "a owns all", func() bool { return len(a.Owned()) == 8 })
		a.store.Fail(memory.OpRelease, storage.ErrUnavailable)
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 8})
		waitFor(t, 5*time.Second, "a gave up b's shards locally", func() bool { return len(a.Owned()) == 8-len(a.Assignment().ShardsOf("b")) && len(a.Owned()) < 8 })
		time.Sleep(3 * time.Second) // b's retry window is exhausted
		a.store.Fail(memory.OpRelease, nil)
		waitFor(t, 15*time.Second, "exact partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 8); return ok })
	})
}

func TestShutdownOrCloseBeforeRun(t *testing.T) {
	s := memory.New()
	defer s.Cluster().Close()
	r, err := runner.New(s, runner.Config{ID: "x"})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	r.Close()
	if err := r.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown after Close = %v", err)
	}
	if err := r.Run(context.Background()); !errors.Is(err, runner.ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
	r2, _ := runner.New(s, runner.Config{ID: "y"})
	if err := r2.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := r2.Run(context.Background()); !errors.Is(err, runner.ErrClosed) {
		t.Fatalf("Run after Shutdown = %v, want ErrClosed", err)
	}
	r2.Close()
}

type stubborn struct {
	log *[]string
	mu  *sync.Mutex
}

type waitReq struct {
	Until <-chan struct{} `json:"-"` // local calls only
}

// Wait ignores its context: a misbehaving handler.
func (s *stubborn) Wait(_ context.Context, r waitReq) (int, error) {
	<-r.Until
	s.mu.Lock()
	*s.log = append(*s.log, "old handler done")
	s.mu.Unlock()
	return 0, nil
}

func (s *stubborn) Mark(_ context.Context, _ struct{}) (int, error) {
	s.mu.Lock()
	*s.log = append(*s.log, "new message ran")
	s.mu.Unlock()
	return 1, nil
}

// After a detach and re-attach, a handler of the old epoch that ignored
// cancellation must finish before the same entity runs again here.
func TestStragglerBlocksNewEpochOfSameShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu  sync.Mutex
			log []string
		)
		kind := entity.NewKind("stubborn", func(string) *stubborn { return &stubborn{log: &log, mu: &mu} })
		wait := entity.Method(kind, "wait", (*stubborn).Wait)
		mark := entity.Method(kind, "mark", (*stubborn).Mark)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		r := start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		if err := r.Register(kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "owning", func() bool { return len(r.Owned()) == 8 })
		until := make(chan struct{})
		go func() { _, _ = wait.Ask(context.Background(), r, "s", waitReq{Until: until}) }()
		synctest.Wait()
		r.Detach()
		waitFor(t, 20*time.Second, "re-attached", func() bool { return len(r.Owned()) == 8 })
		done := make(chan error, 1)
		go func() { _, err := mark.Ask(context.Background(), r, "s", struct{}{}); done <- err }()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		mu.Lock()
		early := len(log)
		mu.Unlock()
		if early != 0 {
			t.Fatalf("the new epoch ran the entity while the old handler still ran: %v", log)
		}
		close(until)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(log) != 2 || log[0] != "old handler done" {
			t.Fatalf("order = %v", log)
		}
	})
}
