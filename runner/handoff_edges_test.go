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
	"github.com/shardhost/shardhost/transport"
)

// ambStore commits the first Transfer but reports a lost reply.
type ambStore struct {
	*memory.Store
	done atomic.Bool
}

func (s *ambStore) Transfer(ctx context.Context, reqs []storage.TransferRequest) ([]storage.TransferResult, error) {
	res, err := s.Store.Transfer(ctx, reqs)
	if err == nil && res[0].Err == nil && s.done.CompareAndSwap(false, true) {
		time.Sleep(50 * time.Millisecond) // the reply is lost; the call times out a bit later
		err = fmt.Errorf("reply lost: %w", storage.ErrUnavailable)
		for i := range res {
			res[i] = storage.TransferResult{Shard: reqs[i].Shard, Err: err}
		}
	}
	return res, err
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
	waitRunning(t, r)
	t.Cleanup(func() { r.Close(); <-done })
	return r
}

// A cutover whose Transfer committed but whose reply was lost must not
// reopen the shard on the old owner (the new owner serves it): the outcome
// is resolved with a read before anything else happens.
func TestAmbiguousTransferResolvedBeforeReopening(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		_, k, do := newWho()
		as := &ambStore{Store: c.NewStore("a")}
		a := runWith(t, as, runner.Config{ID: "a", NumShards: 2})
		if err := a.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 2 })
		b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 2})
		if err := b.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "b owns one", func() bool { return len(b.Owned()) == 1 })
		var s sharding.ShardID
		for id := range b.Owned() {
			s = id
		}
		time.Sleep(200 * time.Millisecond)
		if !as.done.Load() {
			t.Fatalf("shard %d reached b without a committed Transfer from a: the lost reply was never injected", s)
		}
		_, aOwns := a.Owned()[s]
		id := idFor(s, 2, "e")
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		ra, errA := do.Ask(ctx, a, id, whoReq{})
		rb, errB := do.Ask(ctx, b, id, whoReq{})
		t.Logf("a owns %d too: %v; ask via a -> %+v %v; ask via b -> %+v %v", s, aOwns, ra, errA, rb, errB)
		if errB != nil || rb.Runner != "b" {
			t.Errorf("ask via the new owner b = %+v, %v; want served by b", rb, errB)
		}
		if aOwns || ra.Runner == "a" {
			t.Errorf("shard %d reopened on a after an ambiguous Transfer (a owns it: %v; ask via a served by %q)", s, aOwns, ra.Runner)
		}
		if a.Status().Detached {
			t.Errorf("a detached after an ambiguous transfer: %+v", a.Status())
		}
	})
}

// A handler that outlives DrainTimeout (and ignores its context) must not
// overlap with the same entity on the new owner.
func TestHandlerPastDrainTimeoutNeverOverlapsNewOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		env, k, do := newWho()
		a := runWith(t, c.NewStore("a"), runner.Config{ID: "a", NumShards: 1, DrainTimeout: 300 * time.Millisecond, HandoffWait: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))})
		if err := a.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 1 })
		id := idFor(0, 1, "e")
		type result struct {
			resp whoResp
			err  error
			at   time.Duration
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			results = map[string]result{}
		)
		t0 := time.Now()
		ask := func(name string, r *runner.Runner, req whoReq) {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				resp, err := do.Ask(ctx, r, id, req)
				mu.Lock()
				results[name] = result{resp, err, time.Since(t0)}
				mu.Unlock()
			})
		}
		ask("long on a", a, whoReq{Sleep: 5 * time.Second, IgnoreCt: true}) // outlives every drain
		time.Sleep(10 * time.Millisecond)
		ask("queued on a", a, whoReq{}) // queued behind it
		b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 1})
		if err := b.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "b owns the shard", func() bool { return len(b.Owned()) == 1 })
		t.Logf("%v: b owns the shard", time.Since(t0))
		ask("via b", b, whoReq{})
		wg.Wait()
		for name, r := range results {
			t.Logf("%s: after %v: %+v %v", name, r.at, r.resp, r.err)
		}
		// Both handlers ran, so the overlap check below is not vacuous.
		if r := results["long on a"]; r.err != nil || r.resp.Runner != "a" {
			t.Errorf("long ask on a = %+v, %v; want it finished on a", r.resp, r.err)
		}
		if r := results["via b"]; r.err != nil || r.resp.Runner != "b" {
			t.Errorf("ask via b = %+v, %v; want it served by b", r.resp, r.err)
		}
		env.mu.Lock()
		defer env.mu.Unlock()
		if len(env.overlap) > 0 {
			t.Errorf("handlers of %s overlapped across runners: %v", id, env.overlap)
		}
	})
}

// slowWarm's first warmGate.quick Warm calls succeed at once; the later
// ones block, ignoring their context, until the test releases them.
type slowWarm struct {
	id   string
	n    int64
	warm *warmGate
}

type warmGate struct {
	quick             int64
	started, finished atomic.Int64
	release           chan struct{}
}

func (w *slowWarm) Do(ctx context.Context, r whoReq) (int64, error) { w.n++; return w.n, nil }
func (w *slowWarm) Warm(ctx context.Context, info entity.WarmInfo) error {
	defer w.warm.finished.Add(1)
	if w.warm.started.Add(1) > w.warm.quick {
		<-w.warm.release
	}
	return nil
}

// The new owner installs the shard (the old owner released it plainly after
// HandoffWait) with some entities warmed and other Warm hooks still
// running: under -race this catches any sharing of the warmed instances
// between warm goroutines and the host.
func TestWarmedInstancesNotSharedWithRunningWarms(t *testing.T) {
	t.Parallel()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	gate := &warmGate{quick: 8, release: make(chan struct{})}
	k := entity.NewKind("slow", func(id string) *slowWarm { return &slowWarm{id: id, warm: gate} })
	do := entity.Method(k, "do", (*slowWarm).Do)
	a := runWith(t, c.NewStore("a"), runner.Config{ID: "a", NumShards: 1, ListenAddr: "127.0.0.1:0", HandoffWait: time.Second})
	if err := a.Register(k); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 1 })
	ctx := context.Background()
	const hot = 32
	for i := range hot {
		if _, err := do.Ask(ctx, a, fmt.Sprint("w", i), whoReq{}); err != nil {
			t.Fatal(err)
		}
	}
	b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 1, ListenAddr: "127.0.0.1:0"})
	if err := b.Register(k); err != nil {
		t.Fatal(err)
	}
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(gate.release) }) }) // before b closes
	waitFor(t, 10*time.Second, "a to see b", func() bool { return len(a.Members()) == 2 })
	// a's Shutdown hands the shard to b; b never gets ready (its warms
	// block), so a releases it plainly after HandoffWait.
	if err := a.Shutdown(ctx); err != nil {
		t.Fatalf("a.Shutdown: %v", err)
	}
	waitFor(t, 10*time.Second, "b owns the shard", func() bool { return len(b.Owned()) == 1 })
	if s, f := gate.started.Load(), gate.finished.Load(); s <= f || f == 0 {
		t.Fatalf("b installed the shard with %d Warm hooks started and %d finished, want some finished and some still running", s, f)
	}
	// The warms finish while b serves, warmed entities and new ones.
	release.Do(func() { close(gate.release) })
	const asks = 2 * hot
	ok := 0
	for i := range asks {
		id := fmt.Sprint("w", i%hot)
		if i%2 == 1 {
			id = fmt.Sprint("x", i)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := do.Ask(cctx, b, id, whoReq{}); err != nil {
			t.Logf("ask %s via b: %v", id, err)
		} else {
			ok++
		}
		cancel()
	}
	if ok < asks/2 {
		t.Errorf("%d of %d asks via b succeeded, want most", ok, asks)
	}
}

// With detachment disabled, a lost lease is replaced and the runner
// registers again at once. The loss caused by Shutdown's own Revoke must not
// do that: with a transport, Run (and so the watchdog) lingers after the
// revoke. TestShutdownReleasesAndRevokes covers the default configuration.
func TestShutdownRevokeDoesNotReregister(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	a := start(t, c, nil, runner.Config{ID: "a", NumShards: 16, DisableDetachment: true, ListenAddr: "127.0.0.1:0"})
	b := start(t, c, nil, runner.Config{ID: "b", NumShards: 16, DisableDetachment: true, ListenAddr: "127.0.0.1:0"})
	waitFor(t, 10*time.Second, "partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 16); return ok })
	grants, puts := b.store.Calls(memory.OpGrant), b.store.Calls(memory.OpPutRunner)
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Shutdown returned after Run and all its goroutines: b can register no
	// more, so what it did is all in the store's counters.
	if n := b.store.Calls(memory.OpGrant) - grants; n != 0 {
		t.Errorf("b granted %d new leases during its Shutdown, want none", n)
	}
	if kv, ok := c.Get("runners/b"); ok {
		ttl, _ := c.LeaseTTL(kv.Lease)
		t.Errorf("runner record of b survived Shutdown (lease %x, ttl %v)", kv.Lease, ttl)
	}
	t.Logf("b wrote its runner record %d times during Shutdown (draining)", b.store.Calls(memory.OpPutRunner)-puts)
	waitFor(t, 10*time.Second, "a alone, owning all", func() bool { return len(a.Members()) == 1 && len(a.Owned()) == 16 })
}

// A runner that owns nothing yet but warms inbound handoffs shuts down
// gracefully within its context (the warming is abandoned).
func TestShutdownWhileWarmingEndsInTime(t *testing.T) {
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

// TestHandoffSendsQueuedAsksToTheNewOwner: in a handoff the old owner's
// drain waits for the handlers running, not for the asks queued behind
// them: those go back to their senders undelivered and are served by the
// ready new owner. Five queued asks of 2 s each behind a running one would
// otherwise hold the drain past DrainTimeout (10 s) — as every checkpoint
// write stalling for its timeout during an etcd leader failover did (the
// fault suite's seed 106) — and the move would wait for DrainTimeout.
func TestHandoffSendsQueuedAsksToTheNewOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		net := transport.NewInmemNetwork()
		env, k, do := newWho()
		a := runWith(t, c.NewStore("a"), runner.Config{ID: "a", NumShards: 1, HandoffWait: time.Minute, Transport: net.Transport("a:7100")})
		if err := a.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 1 })
		id := idFor(0, 1, "e")
		type result struct {
			resp whoResp
			err  error
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			results = map[string]result{}
		)
		ask := func(name string, req whoReq) {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				resp, err := do.Ask(ctx, a, id, req)
				mu.Lock()
				results[name] = result{resp, err}
				mu.Unlock()
			})
			synctest.Wait() // admitted, in this order
		}
		ask("running", whoReq{Sleep: 2 * time.Second, IgnoreCt: true})
		for i := range 5 {
			ask(fmt.Sprint("queued ", i), whoReq{Sleep: 2 * time.Second, IgnoreCt: true})
		}
		t0 := time.Now()
		b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 1, Transport: net.Transport("b:7100")})
		if err := b.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "b owns the shard", func() bool { return len(b.Owned()) == 1 })
		t.Logf("b owned the shard %v after it started", time.Since(t0))
		if d := time.Since(t0); d > 4*time.Second {
			t.Errorf("b owned the shard %v after it started: the drain waited for the queue", d)
		}
		wg.Wait()
		if r := results["running"]; r.err != nil || r.resp.Runner != "a" {
			t.Errorf("running ask = %+v, %v; want it finished on a", r.resp, r.err)
		}
		for i := range 5 {
			if r := results[fmt.Sprint("queued ", i)]; r.err != nil || r.resp.Runner != "b" {
				t.Errorf("queued ask %d = %+v, %v; want it served by b", i, r.resp, r.err)
			}
		}
		env.mu.Lock()
		defer env.mu.Unlock()
		if len(env.overlap) > 0 {
			t.Errorf("handlers of %s overlapped across runners: %v", id, env.overlap)
		}
	})
}

// TestCutoverCutShortByTheDetachInstantIsRetriedSoon: a handoff's drain
// is bounded by the detach instant as well as DrainTimeout; while
// renewals fail (an etcd leader failover) the bound comes early and a
// handler stalled on etcd outlives it. The cutover is then retried after
// as long as the drain took, not after DrainTimeout: here the drain was
// cut after ≈ 2.5 s, the handler ended at t0+16 s and renewals recovered
// at t0+14 s, so b owns the shard by t0+19 s instead of after t0+25 s.
func TestCutoverCutShortByTheDetachInstantIsRetriedSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		net := transport.NewInmemNetwork()
		env, k, do := newWho()
		sa := c.NewStore("a")
		a := runWith(t, sa, runner.Config{ID: "a", NumShards: 1, LeaseTTL: 15 * time.Second, LeaseRenewInterval: 5 * time.Second,
			HandoffWait: time.Minute, Transport: net.Transport("a:7100")})
		if err := a.Register(k); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "a owns the shard", func() bool { return len(a.Owned()) == 1 })
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond))) // the renewal at t0+5s succeeded
		sa.FailKeepAlive(true)                                  // deadline t0+20s, detach instant t0+15s
		time.Sleep(time.Until(t0.Add(12 * time.Second)))
		id := idFor(0, 1, "e")
		done := make(chan error, 1)
		go func() {
			_, err := do.Ask(t.Context(), a, id, whoReq{Sleep: 4 * time.Second, IgnoreCt: true}) // ends at t0+16s
			done <- err
		}()
		synctest.Wait()
		b := runWith(t, c.NewStore("b"), runner.Config{ID: "b", NumShards: 1, LeaseTTL: 15 * time.Second, LeaseRenewInterval: 5 * time.Second,
			Transport: net.Transport("b:7100")})
		if err := b.Register(k); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(t0.Add(14 * time.Second)))
		sa.FailKeepAlive(false) // renewals recover before the detach instant
		waitFor(t, 20*time.Second, "b owns the shard", func() bool { return len(b.Owned()) == 1 })
		if at := time.Since(t0); at > 19*time.Second {
			t.Errorf("b owned the shard at t0+%v; want by t0+19s (the drain was cut short, the retry waited DrainTimeout)", at)
		}
		if err := <-done; err != nil {
			t.Errorf("the long ask on a: %v", err)
		}
		if a.Status().Detached {
			t.Error("a detached; this test needs it attached")
		}
		env.mu.Lock()
		defer env.mu.Unlock()
		if len(env.overlap) > 0 {
			t.Errorf("handlers of %s overlapped across runners: %v", id, env.overlap)
		}
	})
}

// TestCutoverOfAShardDoesNotWaitForAnotherShardsDrain: shards handed off
// together (a Shutdown hands both of a's over in one cutover) each go on
// once their own drain ends: a shard whose entities are idle is owned by
// its new owner while a handler of the other shard still runs on a (it
// waited for the batch's slowest drain: a singleton's handover waited
// for the 1 s handlers of other shards).
func TestCutoverOfAShardDoesNotWaitForAnotherShardsDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		_, k, do := newWho()
		recB := &recorder{}
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 4, DrainTimeout: 10 * time.Second})
		b := start(t, c, recB, runner.Config{ID: "b", NumShards: 4})
		for _, r := range []*started{a, b} {
			if err := r.Register(k); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 10*time.Second, "a and b own two shards each", func() bool { return len(a.Owned()) == 2 && len(b.Owned()) == 2 })
		var slow, fast sharding.ShardID
		first := true
		for s := range a.Owned() {
			if first {
				slow, first = s, false
			} else {
				fast = s
			}
		}
		busy := make(chan error, 1)
		go func() {
			_, err := do.Ask(t.Context(), a, idFor(slow, 4, "slow"), whoReq{Sleep: 2 * time.Second})
			busy <- err
		}()
		synctest.Wait() // the slow handler runs on a
		began := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- a.Shutdown(context.Background()) }()
		waitFor(t, 10*time.Second, "b owns a's idle shard", func() bool { _, ok := b.Owned()[fast]; return ok })
		if took := time.Since(began); took >= 2*time.Second {
			t.Errorf("the idle shard was owned by b %v after the Shutdown began, not before the other shard's handler returned (2 s)", took)
		}
		if err := <-busy; err != nil {
			t.Errorf("the slow handler's ask = %v, want served (its shard drains before it moves)", err)
		}
		if err := <-stopped; err != nil {
			t.Errorf("Shutdown = %v", err)
		}
		waitFor(t, 10*time.Second, "b owns all", func() bool { return len(b.Owned()) == 4 })
	})
}
