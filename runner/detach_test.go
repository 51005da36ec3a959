package runner_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TTL 15s, renew every 5s, and the defaults derived from the TTL: margin
// 5s, recover window 5s (the arithmetic of these tests is written for them).
func detachCfg(id string) runner.Config {
	return runner.Config{ID: id, NumShards: 8, LeaseTTL: 15 * time.Second, LeaseRenewInterval: 5 * time.Second}
}

// startOwningAll starts one runner on a fresh memory cluster, registers
// kinds and waits until it owns all its shards.
func startOwningAll(t *testing.T, cfg runner.Config, kinds ...entity.Descriptor) (*memory.Cluster, *started, *recorder) {
	t.Helper()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	rec := newRecorder(t)
	r := start(t, c, rec, cfg)
	if len(kinds) > 0 {
		if err := r.Register(kinds...); err != nil {
			t.Fatal(err)
		}
	}
	// 5 s, and 1 ms more per shard: 16 384 shards under -race on a loaded
	// 2-core machine took over 5 s.
	n := r.Config().NumShards
	waitFor(t, 5*time.Second+time.Duration(n)*time.Millisecond, "owning all shards", func() bool { return len(r.Owned()) == n })
	return c, r, rec
}

func detachedEvents(evs []runner.Event) []runner.Detached {
	var out []runner.Detached
	for _, ev := range evs {
		if d, ok := ev.(runner.Detached); ok {
			out = append(out, d)
		}
	}
	return out
}

func waitDetached(t *testing.T, rec *recorder, d time.Duration) runner.Detached {
	t.Helper()
	var got []runner.Detached
	waitFor(t, d, "a Detached event", func() bool { got = detachedEvents(rec.all()); return len(got) > 0 })
	return got[0]
}

func TestDetachAtDeadlineMinusMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		c, r, rec := startOwningAll(t, detachCfg("a"))
		ctxs := map[sharding.ShardID]context.Context{}
		for id := range r.Owned() {
			ctx, _, _ := r.ShardContext(id)
			ctxs[id] = ctx
		}
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond))) // renewal at 5s succeeded
		r.store.FailKeepAlive(true)
		d := waitDetached(t, rec, 20*time.Second)
		if d.Reason != detachment.ReasonLeaseDeadline {
			t.Fatalf("reason = %v, want lease deadline", d.Reason)
		}
		// Last acknowledged renewal sent at t0+5s; TTL 15s; margin 5s.
		if want := t0.Add(15 * time.Second); !d.Time.Equal(want) {
			t.Errorf("detached at t0+%v, want t0+15s", d.Time.Sub(t0))
		}
		if want := t0.Add(20 * time.Second); !d.Deadline.Equal(want) {
			t.Errorf("deadline t0+%v, want t0+20s", d.Deadline.Sub(t0))
		}
		if len(r.Owned()) != 0 {
			t.Fatalf("still owns %v after detaching", r.Owned())
		}
		for id, ctx := range ctxs {
			if !errors.Is(context.Cause(ctx), runner.ErrDetached) {
				t.Errorf("shard %d context cause = %v, want ErrDetached", id, context.Cause(ctx))
			}
		}
		lost := 0
		for _, ev := range rec.all() {
			if l, ok := ev.(runner.ShardLost); ok {
				lost++
				if !errors.Is(l.Cause, runner.ErrDetached) || l.Time.After(d.Time) {
					t.Errorf("ShardLost %+v, want cause ErrDetached no later than the Detached event", l)
				}
			}
		}
		if lost != 8 {
			t.Errorf("%d ShardLost events, want 8", lost)
		}
		// The server still holds the lease: the runner stopped first.
		if _, ok := c.Get("runners/a"); !ok {
			t.Error("runner record already gone at detach time")
		}
		if !r.Status().Detached {
			t.Error("Status().Detached = false")
		}
	})
}

func TestDetachOnFailureStreak(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		cfg := detachCfg("a")
		cfg.KeepAliveFailureThreshold = 3
		_, r, rec := startOwningAll(t, cfg)
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond)))
		r.store.FailKeepAlive(true)
		d := waitDetached(t, rec, 20*time.Second)
		// Failures at 10s, 10.25s, 10.5s.
		if d.Reason != detachment.ReasonKeepAliveStreak || !d.Time.Equal(t0.Add(10500*time.Millisecond)) {
			t.Fatalf("detached %+v at t0+%v, want keep-alive streak at t0+10.5s", d.Reason, d.Time.Sub(t0))
		}
	})
}

func TestDetachOnStorageErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(c *memory.Cluster, s *memory.Store)
	}{
		{"verify", func(_ *memory.Cluster, s *memory.Store) { s.Fail(memory.OpVerify, storage.ErrUnavailable) }},
		{"list", func(_ *memory.Cluster, s *memory.Store) {
			s.Fail(memory.OpList, storage.ErrUnavailable)
			s.BreakWatches()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, r, rec := startOwningAll(t, detachCfg("a"))
				tc.fault(c, r.store)
				d := waitDetached(t, rec, 30*time.Second)
				if d.Reason != detachment.ReasonStorageError {
					t.Fatalf("reason = %v (%s), want storage error", d.Reason, d.Detail)
				}
			})
		})
	}
}

// Acquire failures detach: a runner that must acquire and cannot. (The list
// and verify paths are in TestDetachOnStorageErrors.)
func TestDetachOnAcquireErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		rec := newRecorder(t)
		cfg := detachCfg("a")
		s := c.NewStore("a")
		s.Fail(memory.OpAcquire, storage.ErrUnavailable)
		r := startOn(t, s, rec, cfg)
		d := waitDetached(t, rec, 10*time.Second)
		if d.Reason != detachment.ReasonStorageError {
			t.Fatalf("reason = %v (%s), want storage error", d.Reason, d.Detail)
		}
		if got := r.store.Calls(memory.OpAcquire); got != 3 {
			t.Errorf("acquire calls before detaching = %d, want 3 (StorageErrorThreshold)", got)
		}
	})
}

// An owned lock deleted or taken behind the runner's back costs that shard
// only: it is lost (ErrShardMoved), the runner stays attached and keeps
// every other shard at its epoch; a deleted lock is acquired again. With a
// full lock view the watch shows the change at once; without one, the next
// verification (within VerifyInterval) finds the lock gone from the lease.
func TestOwnedLockLostCostsThatShardOnly(t *testing.T) {
	for _, how := range []string{"deleted", "taken", "deleted/scoped", "taken/scoped"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg, within := detachCfg("a"), time.Second
				cfg.FullLockView = !strings.HasSuffix(how, "/scoped")
				if !cfg.FullLockView {
					within = cfg.LeaseTTL/3 + time.Second // the default VerifyInterval, and a round
				}
				how, _, _ := strings.Cut(how, "/")
				c, r, rec := startOwningAll(t, cfg)
				before := r.Owned()
				var rev storage.Revision
				if how == "deleted" {
					// The delete's revision: read before it (the runner may
					// re-acquire before a read after it).
					rev = c.Revision() + 1
					c.Delete("shards/3")
				} else {
					other := c.NewStore("thief")
					l, err := other.Grant(t.Context(), time.Hour)
					if err != nil {
						t.Fatal(err)
					}
					if rev, err = c.Put("shards/3", []byte(`{"runnerID":"thief","incarnation":"1"}`), l.ID); err != nil {
						t.Fatal(err)
					}
				}
				waitFor(t, within, "shard 3 lost", func() bool {
					for _, ev := range rec.all() {
						if l, ok := ev.(runner.ShardLost); ok && l.Shard == 3 {
							return true
						}
					}
					return false
				})
				if how == "deleted" {
					waitFor(t, within, "shard 3 re-acquired", func() bool { return r.Owned()[3] > storage.Epoch(rev) })
				}
				time.Sleep(time.Minute) // fake time: verification and resyncs run
				for _, ev := range rec.all() {
					switch e := ev.(type) {
					case runner.Detached:
						t.Fatalf("detached (%v: %s): one lost lock must cost one shard", e.Reason, e.Detail)
					case runner.ShardLost:
						if e.Shard != 3 || !errors.Is(e.Cause, runner.ErrShardMoved) {
							t.Errorf("lost shard %d (%v), want only shard 3 with ErrShardMoved", e.Shard, e.Cause)
						}
					}
				}
				after := r.Owned()
				for id, e := range before {
					if id != 3 && after[id] != e {
						t.Errorf("shard %d at epoch %d, was %d: only shard 3 may change", id, after[id], e)
					}
				}
				if _, owned := after[3]; owned != (how == "deleted") {
					t.Errorf("shard 3 owned = %v after its lock was %s", owned, how)
				}
			})
		})
	}
}

func TestNoStorageWorkWhileDetached(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, r, rec := startOwningAll(t, detachCfg("a"))
		r.store.FailKeepAlive(true)
		waitDetached(t, rec, 30*time.Second)
		ops := []memory.Op{memory.OpAcquire, memory.OpVerify, memory.OpRelease, memory.OpRewrite, memory.OpPutRunner, memory.OpTransfer, memory.OpHandoff}
		before := map[memory.Op]int{}
		for _, op := range ops {
			before[op] = r.store.Calls(op)
		}
		probes := r.store.Calls(memory.OpKeepAlive)
		time.Sleep(60 * time.Second)
		for _, op := range ops {
			if got := r.store.Calls(op); got != before[op] {
				t.Errorf("%s calls while detached: %d -> %d", op, before[op], got)
			}
		}
		if got := r.store.Calls(memory.OpKeepAlive); got-probes < 60 {
			t.Errorf("only %d keep-alive probes in 60s detached, want about one per 500ms", got-probes)
		}
	})
}

func reattached(evs []runner.Event) []runner.Reattached {
	var out []runner.Reattached
	for _, ev := range evs {
		if a, ok := ev.(runner.Reattached); ok {
			out = append(out, a)
		}
	}
	return out
}

func TestReattachAfterRecoverWindowWithFreshEpochs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		_, r, rec := startOwningAll(t, detachCfg("a"))
		old := r.Owned()
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond)))
		r.store.FailKeepAlive(true)
		waitDetached(t, rec, 20*time.Second) // t0+15s; the server lease lives until t0+20s
		time.Sleep(time.Until(t0.Add(16 * time.Second)))
		r.store.FailKeepAlive(false)
		var ra []runner.Reattached
		waitFor(t, 20*time.Second, "re-attach", func() bool { ra = reattached(rec.all()); return len(ra) > 0 })
		if ra[0].NewLease {
			t.Error("re-attached with a new lease although the old one survived")
		}
		// Healthy from t0+16.x; window 5s; probes every 500ms.
		if at := ra[0].Time.Sub(t0); at < 21*time.Second || at > 22*time.Second {
			t.Errorf("re-attached at t0+%v, want t0+21s..22s", at)
		}
		waitFor(t, time.Second, "owning all again", func() bool { return len(r.Owned()) == 8 })
		for id, e := range r.Owned() {
			if e <= old[id] {
				t.Errorf("shard %d epoch %d after re-attach, want > pre-detach %d", id, e, old[id])
			}
		}
	})
}

func TestReattachWithNewLeaseAfterLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		c, r, rec := startOwningAll(t, detachCfg("a"))
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond)))
		r.store.Partition(true)
		waitDetached(t, rec, 20*time.Second)
		time.Sleep(time.Until(t0.Add(25 * time.Second))) // the server expired the lease at t0+20s
		if _, ok := c.Get("runners/a"); ok {
			t.Fatal("record survived the lease")
		}
		r.store.Partition(false)
		var ra []runner.Reattached
		waitFor(t, 20*time.Second, "re-attach", func() bool { ra = reattached(rec.all()); return len(ra) > 0 })
		if !ra[0].NewLease {
			t.Error("re-attached without a new lease")
		}
		if _, ok := c.Get("runners/a"); !ok {
			t.Error("not re-registered")
		}
		waitFor(t, 3*time.Second, "owning all again", func() bool { return len(r.Owned()) == 8 })
	})
}

func TestUnhealthySignalResetsRecoverWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		_, r, rec := startOwningAll(t, detachCfg("a"))
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond)))
		r.store.FailKeepAlive(true)
		waitDetached(t, rec, 20*time.Second)
		time.Sleep(time.Until(t0.Add(16 * time.Second)))
		r.store.FailKeepAlive(false)
		time.Sleep(2 * time.Second)
		r.store.FailKeepAlive(true) // t0+18s: inside the window
		time.Sleep(time.Second)
		r.store.FailKeepAlive(false) // t0+19s: the window starts over
		var ra []runner.Reattached
		waitFor(t, 20*time.Second, "re-attach", func() bool { ra = reattached(rec.all()); return len(ra) > 0 })
		if at := ra[0].Time.Sub(t0); at < 24*time.Second {
			t.Errorf("re-attached at t0+%v, want >= t0+24s (window restarted at t0+19s)", at)
		}
	})
}

func TestDisabledDetachmentOnlyLogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		cfg := detachCfg("a")
		cfg.DisableDetachment = true
		cfg.KeepAliveFailureThreshold = 2
		_, r, rec := startOwningAll(t, cfg)
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond)))
		r.store.FailKeepAlive(true)
		time.Sleep(time.Until(t0.Add(19 * time.Second))) // past deadline - margin, before expiry
		if d := detachedEvents(rec.all()); len(d) != 0 {
			t.Fatalf("detached with detachment disabled: %+v", d)
		}
		if n := len(r.Owned()); n != 8 {
			t.Fatalf("owns %d shards, want all 8 (disabled detachment only logs)", n)
		}
	})
}

// restorer is an entity whose activation restores a checkpoint.
type restorer struct{ n int }

func (e *restorer) Activate(ctx context.Context, info entity.ActivateInfo) error {
	_, _, err := info.Restore(ctx)
	return err
}

func (e *restorer) Get(ctx context.Context, _ struct{}) (int, error) { e.n++; return e.n, nil }

// TestAskWhoseActivationTheDetachCutShortIsNotDelivered: an ask whose
// entity was still activating (its Activate reading a checkpoint) when the
// runner detached ran no handler: it fails as not delivered (retryable),
// so its sender asks again once the runner owns the shard again and the
// ask succeeds within its deadline — not with the activation's error
// ("read checkpoint: context canceled").
func TestAskWhoseActivationTheDetachCutShortIsNotDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		kind := entity.NewKind("restorer", func(string) *restorer { return &restorer{} })
		get := entity.Method(kind, "get", (*restorer).Get)
		t0 := time.Now()
		_, r, rec := startOwningAll(t, detachCfg("a"), kind)
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond))) // renewal at 5s succeeded
		r.store.FailKeepAlive(true)                             // detach at t0+15s
		// Checkpoint reads answer after 30 s: the activation, begun 2 s
		// before the detach, is still reading (within its OpTimeout, 3 s)
		// when the runner detaches.
		time.Sleep(time.Until(t0.Add(13 * time.Second)))
		r.store.Delay(memory.OpCheckpoint, 30*time.Second)
		res := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_, err := get.Ask(ctx, r, "x", struct{}{})
			res <- err
		}()
		waitDetached(t, rec, 20*time.Second)
		r.store.Delay(memory.OpCheckpoint, 0)
		r.store.FailKeepAlive(false)
		if err := <-res; err != nil {
			t.Fatalf("Ask = %v, want the ask delivered once the runner owns the shard again", err)
		}
	})
}
