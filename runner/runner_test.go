package runner_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestMain checks that no test leaks a goroutine.
//
// The tests that spend their time waiting — on a real etcd, on lease
// expiries, on processes, on Chromium — call t.Parallel, so that the
// package's wall time is not the sum of their waits (make test gives
// -parallel 6); they share nothing but the package's atomic counters. The
// etcd fault matrix runs in parallel with them but one of its tests at a
// time (oneFaultAtATime). Quick in-memory and synctest tests stay
// sequential: they run first, alone.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConvergesToExactPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		var rs []*started
		for i := range 3 {
			rs = append(rs, start(t, c, nil, runner.Config{ID: fmt.Sprintf("r%d", i), NumShards: 64}))
		}
		waitFor(t, 10*time.Second, "exact partition", func() bool { ok, _ := partitionOK(rs, 64); return ok })
		for _, r := range rs {
			if n := len(r.Owned()); n < 21 || n > 22 {
				t.Errorf("%s owns %d shards, want 21 or 22", r.ID(), n)
			}
		}
	})
}

func TestShutdownReleasesAndRevokes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 16})
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 16})
		waitFor(t, 10*time.Second, "partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 16); return ok })
		if err := b.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-b.done; err != nil {
			t.Fatalf("Run after Shutdown = %v", err)
		}
		b.done <- nil
		if _, ok := c.Get("runners/b"); ok {
			t.Fatal("runner record of b survived Shutdown")
		}
		start := time.Now()
		waitFor(t, 5*time.Second, "a owns all", func() bool { return len(a.Owned()) == 16 })
		if d := time.Since(start); d > time.Second {
			t.Errorf("takeover after graceful shutdown took %v, want well under the TTL", d)
		}
	})
}

func TestCrashTakeoverAfterTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 16})
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 16})
		waitFor(t, 10*time.Second, "partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 16); return ok })
		crashed := time.Now()
		b.Close()
		waitFor(t, 30*time.Second, "a owns all", func() bool { return len(a.Owned()) == 16 })
		// The last renewal was at most a renew interval before the crash.
		d, ttl, every := time.Since(crashed), runner.DefaultLeaseTTL, a.Config().LeaseRenewInterval
		if d < ttl-every || d > ttl+time.Second {
			t.Errorf("takeover after crash took %v, want after the lease expiry (%v..%v)", d, ttl-every, ttl)
		}
	})
}

func TestInvalidConfig(t *testing.T) {
	s := memory.New()
	defer s.Cluster().Close()
	bad := []runner.Config{
		{ID: "x", LeaseTTL: 9 * time.Second, DetachMargin: 9 * time.Second},
		{ID: "x", LeaseTTL: 9 * time.Second, LeaseRenewInterval: 4 * time.Second},
		{ID: "x", NumShards: -1},
		{ID: "x", Weight: -2},
		{ID: "x", LeaseTTL: 500 * time.Millisecond},
		{ID: "x", LeaseTTL: 9 * time.Second, DetachMargin: 5 * time.Second, LeaseRenewInterval: 3 * time.Second, KeepAliveRetryInterval: 3 * time.Second},
	}
	for _, cfg := range bad {
		if _, err := runner.New(s, cfg); !errors.Is(err, runner.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}
