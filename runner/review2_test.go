package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// ambStore commits the first Transfer but reports a lost reply.
type ambStore struct {
	*memory.Store
	done atomic.Bool
}

func (s *ambStore) Transfer(ctx context.Context, req storage.TransferRequest) (storage.Epoch, error) {
	e, err := s.Store.Transfer(ctx, req)
	if err == nil && s.done.CompareAndSwap(false, true) {
		time.Sleep(50 * time.Millisecond) // the reply is lost; the call times out a bit later
		return 0, fmt.Errorf("reply lost: %w", storage.ErrUnavailable)
	}
	return e, err
}

func runWith(t *testing.T, s storage.Store, cfg runner.Config) *runner.Runner {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = logger(t)
	}
	r, err := runner.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	return r
}

// A cutover whose Transfer committed but whose reply was lost must not
// reopen the shard on the old owner (the new owner serves it): the outcome
// is resolved with a read before anything else happens.
func TestRegressionAmbiguousTransferReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		_, k, do := newWho()
		a := runWith(t, &ambStore{Store: c.NewStore("a")}, runner.Config{ID: "a", NumShards: 2})
		a.Register(k)
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 2 })
		b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 2})
		b.Register(k)
		waitFor(t, 30*time.Second, "b owns one", func() bool { return len(b.Owned()) == 1 })
		var s sharding.ShardID
		for id := range b.Owned() {
			s = id
		}
		time.Sleep(200 * time.Millisecond)
		_, aOwns := a.Owned()[s]
		id := idFor(s, 2, "e")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ra, errA := do.Ask(ctx, a, id, whoReq{})
		rb, errB := do.Ask(ctx, b, id, whoReq{})
		t.Logf("a owns %d too: %v; ask via a -> %+v %v; ask via b -> %+v %v", s, aOwns, ra, errA, rb, errB)
		if aOwns && ra.Runner == "a" && rb.Runner == "b" {
			t.Errorf("shard %d served by both a and b after an ambiguous Transfer (both answered N=%d/%d)", s, ra.N, rb.N)
		}
		if a.Status().Detached {
			t.Errorf("a detached after an ambiguous transfer: %+v", a.Status())
		}
	})
}

// A handler that outlives DrainTimeout (and ignores its context) must not
// overlap with the same entity on the new owner.
func TestRegressionCutoverAfterDrainTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		env, k, do := newWho()
		a := runWith(t, c.NewStore("a"), runner.Config{ID: "a", NumShards: 1, DrainTimeout: 300 * time.Millisecond, HandoffWait: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
		a.Register(k)
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 1 })
		id := idFor(0, 1, "e")
		var wg sync.WaitGroup
		results := make(chan string, 3)
		t0 := time.Now()
		ask := func(r *runner.Runner, req whoReq) {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				resp, err := do.Ask(ctx, r, id, req)
				results <- fmt.Sprintf("%v: %+v %v", time.Since(t0), resp, err)
			})
		}
		ask(a, whoReq{Sleep: 5 * time.Second, IgnoreCt: true}) // outlives every drain
		time.Sleep(10 * time.Millisecond)
		ask(a, whoReq{}) // queued behind it
		b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 1})
		b.Register(k)
		waitFor(t, 30*time.Second, "b owns the shard", func() bool { return len(b.Owned()) == 1 })
		t.Logf("%v: b owns the shard", time.Since(t0))
		ask(b, whoReq{})
		wg.Wait()
		close(results)
		for r := range results {
			t.Log(r)
		}
		env.mu.Lock()
		defer env.mu.Unlock()
		if len(env.overlap) > 0 {
			t.Errorf("handlers of %s overlapped across runners: %v", id, env.overlap)
		}
	})
}

type slowWarm struct {
	id string
	n  int64
}

func (w *slowWarm) Do(ctx context.Context, r whoReq) (int64, error) { w.n++; return w.n, nil }
func (w *slowWarm) Warm(ctx context.Context, info entity.WarmInfo) error {
	time.Sleep(time.Second) // ignores ctx, then succeeds
	return nil
}

// The new owner installs the shard (the old owner released it plainly after
// HandoffWait) while Warm hooks still run: under -race this catches any
// sharing of the warmed instances between warm goroutines and the host.
func TestRegressionWarmedMapRace(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	k := entity.NewKind("slow", func(id string) *slowWarm { return &slowWarm{id: id} })
	do := entity.Method(k, "do", (*slowWarm).Do)
	a := runWith(t, c.NewStore("a"), runner.Config{ID: "a", NumShards: 1, ListenAddr: "127.0.0.1:0", HandoffWait: 300 * time.Millisecond})
	a.Register(k)
	waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 1 })
	ctx := context.Background()
	for i := range 32 {
		if _, err := do.Ask(ctx, a, fmt.Sprint("w", i), whoReq{}); err != nil {
			t.Fatal(err)
		}
	}
	b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 1, ListenAddr: "127.0.0.1:0"})
	b.Register(k)
	time.Sleep(200 * time.Millisecond)
	go a.Shutdown(ctx)
	waitFor(t, 10*time.Second, "b owns the shard", func() bool { return len(b.Owned()) == 1 })
	deadline := time.Now().Add(1500 * time.Millisecond)
	n := 0
	for time.Now().Before(deadline) {
		for i := range 64 {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			if _, err := do.Ask(cctx, b, fmt.Sprint("x", n), whoReq{}); err != nil {
				t.Log(err)
			}
			n++
			cancel()
			_ = i
		}
		time.Sleep(time.Millisecond)
	}
}

// With detachment disabled, the lease loss caused by Shutdown's own Revoke
// must not make the watchdog register again.
func TestRegressionShutdownReregisters(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	a := start(t, c, nil, runner.Config{ID: "a", NumShards: 16, DisableDetachment: true, ListenAddr: "127.0.0.1:0"})
	b := start(t, c, nil, runner.Config{ID: "b", NumShards: 16, DisableDetachment: true, ListenAddr: "127.0.0.1:0"})
	waitFor(t, 10*time.Second, "partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 16); return ok })
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if kv, ok := c.Get("runners/b"); ok {
		ttl, _ := c.LeaseTTL(kv.Lease)
		t.Errorf("runner record of b survived Shutdown (lease %x, ttl %v)", kv.Lease, ttl)
	}
	time.Sleep(2 * time.Second)
	if _, ok := c.Get("runners/b"); ok {
		t.Error("b registered again after its Shutdown")
	}
	if n := len(a.Members()); n != 1 {
		t.Errorf("a sees %d members after b's Shutdown, want 1", n)
	}
	waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 16 })
}

// A runner that owns nothing yet but warms inbound handoffs shuts down
// gracefully within its context (the warming is abandoned).
func TestRegressionShutdownWhileWarming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 4})
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 4 })
		warming := make(chan struct{}, 4)
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 4, WarmTimeout: 10 * time.Second,
			WarmShard: func(ctx context.Context, s sharding.ShardID, from string) error {
				warming <- struct{}{}
				<-ctx.Done()
				return nil
			}})
		<-warming
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		err := b.Shutdown(ctx)
		_, reg := c.Get("runners/b")
		t.Logf("Shutdown -> %v after %v; b still registered: %v; b owned %d", err, time.Since(t0), reg, len(b.Owned()))
		if err != nil || reg {
			t.Errorf("Shutdown of a warming runner did not complete gracefully")
		}
	})
}
