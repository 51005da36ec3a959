package runner_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

func TestLocalAskAndTell(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		_, r, _ := startHosting(t, k, runner.Config{})
		ctx := t.Context()
		for i := 1; i <= 3; i++ {
			n, err := k.inc.Ask(ctx, r, "c1", incReq{By: 2})
			if err != nil || n != int64(2*i) {
				t.Fatalf("Ask #%d = %d, %v; want %d", i, n, err, 2*i)
			}
		}
		if err := k.add.Tell(ctx, r, "c1", incReq{By: 10}); err != nil {
			t.Fatal(err)
		}
		if n, err := k.inc.Ask(ctx, r, "c1", incReq{}); err != nil || n != 16 {
			t.Fatalf("after Tell: %d, %v; want 16", n, err)
		}
		if n, _ := k.inc.Ask(ctx, r, "c2", incReq{By: 1}); n != 1 {
			t.Fatalf("entities share state: c2 = %d", n)
		}
		acts := k.log.activations()
		if len(acts) != 2 || acts[0].Reason != entity.ActivateNew || acts[0].Epoch <= 0 || acts[0].Shard != sharding.ShardOf("c1", 8) {
			t.Fatalf("activations = %+v, want one per entity, reason new, with shard and epoch", acts)
		}
		if r.Status().Entities != 2 {
			t.Fatalf("EntityCount = %d, want 2", r.Status().Entities)
		}
	})
}

func TestUnknownKind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		_, r, _ := startHosting(t, k, runner.Config{})
		other := newTestKind(false)
		otherKind := entity.NewKind("other", func(string) *testEntity { return &testEntity{log: other.log} })
		otherInc := entity.Method(otherKind, "inc", (*testEntity).Inc)
		if _, err := otherInc.Ask(t.Context(), r, "x", incReq{}); !errors.Is(err, entity.ErrUnknownKind) {
			t.Fatalf("Ask(unregistered kind) = %v, want ErrUnknownKind", err)
		}
		// Same name, different definition: refused.
		dup := entity.NewKind("test", func(string) *testEntity { return &testEntity{} })
		if err := r.Register(dup); !errors.Is(err, entity.ErrInvalidKind) {
			t.Fatalf("Register(conflicting kind) = %v, want ErrInvalidKind", err)
		}
	})
}

func TestNotOwnerForUnownedShard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 8})
		for _, r := range []*started{a, b} {
			if err := r.Register(k.kind); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 5*time.Second, "partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 8); return ok })
		// An entity whose shard b owns.
		var id string
		for s := range b.Owned() {
			id = idFor(s, 8, "e")
			break
		}
		// Neither serves a transport (one process): a says who owns the
		// shard and that it cannot be reached.
		_, err := k.inc.Ask(t.Context(), a, id, incReq{By: 1})
		if !errors.Is(err, runner.ErrNoTransport) || !strings.Contains(err.Error(), fmt.Sprintf(`shard %d is assigned to runner "b"`, sharding.ShardOf(id, 8))) {
			t.Fatalf("Ask via the non-owner = %v, want ErrNoTransport naming the shard and b", err)
		}
		if n, err := k.inc.Ask(t.Context(), b, id, incReq{By: 1}); err != nil || n != 1 {
			t.Fatalf("Ask via the owner = %d, %v", n, err)
		}
		if len(k.log.activations()) != 1 {
			t.Fatalf("the non-owner activated the entity: %+v", k.log.activations())
		}
	})
}

func TestMailboxFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false, entity.Mailbox(2))
		_, r, _ := startHosting(t, k, runner.Config{})
		ctx := t.Context()
		started, release := make(chan struct{}, 1), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			_, err := k.block.Ask(ctx, r, "m", blockReq{Started: started, Release: release})
			done <- err
		}()
		<-started // the handler runs; the mailbox is empty again
		for i := range 2 {
			if err := k.add.Tell(ctx, r, "m", incReq{By: 1}); err != nil {
				t.Fatalf("Tell #%d = %v", i, err)
			}
		}
		if err := k.add.Tell(ctx, r, "m", incReq{By: 1}); !errors.Is(err, entity.ErrMailboxFull) {
			t.Fatalf("third queued Tell = %v, want ErrMailboxFull", err)
		}
		if _, err := k.inc.Ask(ctx, r, "m", incReq{}); !errors.Is(err, entity.ErrMailboxFull) {
			t.Fatalf("Ask on a full mailbox = %v, want ErrMailboxFull", err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// The answer comes before the entity's goroutine goes on to the
		// two queued signals: wait until it has run them (the mailbox is
		// still full until then).
		synctest.Wait()
		if n, err := k.inc.Ask(ctx, r, "m", incReq{}); err != nil || n != 2 {
			t.Fatalf("after draining: %d, %v; want the 2 accepted signals", n, err)
		}
	})
}

func TestPanicIsolation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		_, r, _ := startHosting(t, k, runner.Config{})
		ctx := t.Context()
		if n, _ := k.inc.Ask(ctx, r, "p", incReq{By: 5}); n != 5 {
			t.Fatal("setup")
		}
		_, err := k.panic.Ask(ctx, r, "p", incReq{})
		var pe *entity.PanicError
		if !errors.As(err, &pe) || pe.Value != "boom" || pe.Method != "panic" || pe.Entity != "p" || pe.Stack == "" {
			t.Fatalf("Ask(panicking handler) = %v, want *PanicError", err)
		}
		// The instance was discarded: a fresh one, activated as a restart.
		if n, err := k.inc.Ask(ctx, r, "p", incReq{By: 1}); err != nil || n != 1 {
			t.Fatalf("after the panic: %d, %v; want a fresh instance (1)", n, err)
		}
		acts := k.log.activations()
		if len(acts) != 2 || acts[1].Reason != entity.ActivateRestart {
			t.Fatalf("activations = %+v, want new then restart", acts)
		}
		// Other entities and the runner are unaffected.
		if n, err := k.inc.Ask(ctx, r, "q", incReq{By: 1}); err != nil || n != 1 {
			t.Fatalf("other entity: %d, %v", n, err)
		}
		if r.Status().Detached || len(r.Owned()) != 8 {
			t.Fatal("a panic disturbed the runner")
		}
	})
}

func TestPassivationAfterIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(true, entity.IdleAfter(time.Minute))
		_, r, _ := startHosting(t, k, runner.Config{})
		ctx := t.Context()
		if _, err := k.inc.Ask(ctx, r, "idle", incReq{By: 7}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Second)
		if _, err := k.inc.Ask(ctx, r, "busy", incReq{By: 1}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(31 * time.Second) // idle: 61s unused; busy: 31s
		synctest.Wait()
		rels := k.log.releases()
		if len(rels) != 1 || rels[0].Entity != "idle" || !errors.Is(rels[0].Reason, runner.ErrPassivated) {
			t.Fatalf("releases = %+v, want idle passivated", rels)
		}
		if r.Status().Entities != 1 {
			t.Fatalf("EntityCount = %d, want 1 (busy)", r.Status().Entities)
		}
		// The next message activates a new instance, which restores the
		// checkpoint written in Release.
		if n, err := k.inc.Ask(ctx, r, "idle", incReq{By: 1}); err != nil || n != 8 {
			t.Fatalf("after passivation: %d, %v; want 8 (restored 7 + 1)", n, err)
		}
		if acts := k.log.activations(); len(acts) != 3 || acts[2].Reason != entity.ActivateNew {
			t.Fatalf("activations = %+v", acts)
		}
	})
}

func TestResidentCapEvictsLRU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		_, r, _ := startHosting(t, k, runner.Config{MaxResidentEntities: 3})
		ctx := t.Context()
		for _, id := range []string{"a", "b", "c"} {
			if _, err := k.inc.Ask(ctx, r, id, incReq{By: 1}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
		}
		if _, err := k.inc.Ask(ctx, r, "a", incReq{By: 1}); err != nil { // a is recent again
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if _, err := k.inc.Ask(ctx, r, "d", incReq{By: 1}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		rels := k.log.releases()
		if len(rels) != 1 || rels[0].Entity != "b" || !errors.Is(rels[0].Reason, runner.ErrPassivated) {
			t.Fatalf("releases = %+v, want b (least recently used) evicted", rels)
		}
		if r.Status().Entities != 3 {
			t.Fatalf("EntityCount = %d, want 3", r.Status().Entities)
		}
		if n, _ := k.inc.Ask(ctx, r, "a", incReq{}); n != 2 {
			t.Fatalf("a lost its state: %d", n)
		}
	})
}

// TestIdleExpiryAndEvictionHaveDistinctReasons: an entity passivated for
// being idle and one evicted by the resident cap reach Release with
// different reasons, ErrIdleExpired and ErrEvicted, each matching
// ErrPassivated and not the other, so an app can delete state on the first
// only.
func TestIdleExpiryAndEvictionHaveDistinctReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false, entity.IdleAfter(time.Minute))
		_, r, _ := startHosting(t, k, runner.Config{MaxResidentEntities: 1})
		ctx := t.Context()
		for _, id := range []string{"evicted", "idle"} {
			if _, err := k.inc.Ask(ctx, r, id, incReq{By: 1}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Second)
		}
		time.Sleep(time.Minute) // "idle" expires
		synctest.Wait()
		rels := k.log.releases()
		if len(rels) != 2 {
			t.Fatalf("releases = %+v, want evicted then idle", rels)
		}
		for _, c := range []struct {
			rel           entity.ReleaseInfo
			entity        string
			want, notWant error
		}{{rels[0], "evicted", runner.ErrEvicted, runner.ErrIdleExpired}, {rels[1], "idle", runner.ErrIdleExpired, runner.ErrEvicted}} {
			if c.rel.Entity != c.entity || !errors.Is(c.rel.Reason, c.want) || errors.Is(c.rel.Reason, c.notWant) ||
				!errors.Is(c.rel.Reason, runner.ErrPassivated) {
				t.Errorf("release of %s: reason %v; want %v (and ErrPassivated), not %v", c.rel.Entity, c.rel.Reason, c.want, c.notWant)
			}
		}
	})
}

func TestDetachInterruptsEveryEntity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		// RecoverWindow (TTL/3 = 5 s) outlasts the sends below.
		_, r, rec := startHosting(t, k, runner.Config{NumShards: 8, LeaseTTL: 15 * time.Second})
		ctx := t.Context()
		// Two handlers blocked, on entities of different shards, plus a
		// queued ask behind one of them.
		ids := []string{"x1", "x2"}
		if sharding.ShardOf("x1", 8) == sharding.ShardOf("x2", 8) {
			t.Fatal("pick entities on different shards")
		}
		errs := make(chan error, 3)
		for _, id := range ids {
			started := make(chan struct{}, 1)
			go func() {
				_, err := k.block.Ask(ctx, r, id, blockReq{Started: started})
				errs <- err
			}()
			<-started
		}
		go func() {
			// Undelivered messages are retried until the context ends:
			// give up before the runner re-attaches (RecoverWindow 5s).
			qctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			_, err := k.inc.Ask(qctx, r, "x1", incReq{By: 1})
			errs <- err
		}()
		synctest.Wait()
		r.Detach()
		for range 3 {
			err := <-errs
			var ud *runner.UndeliveredError
			switch {
			case errors.As(err, &ud):
				if !errors.Is(err, runner.ErrDetached) {
					t.Errorf("queued message failed with %v, want cause ErrDetached", err)
				}
			case !errors.Is(err, runner.ErrDetached):
				t.Errorf("blocked handler returned %v, want its context's cause ErrDetached", err)
			}
		}
		if d := waitDetached(t, rec, time.Second); d.Reason.String() != "manual" {
			t.Fatalf("reason %v", d.Reason)
		}
		// No new message starts while detached: sends wait (retrying) and
		// fail when their context ends first.
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := k.inc.Ask(dctx, r, "x1", incReq{}); !errors.Is(err, runner.ErrDetached) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Ask while detached = %v, want ErrDetached and the deadline", err)
		}
		tctx, tcancel := context.WithTimeout(ctx, time.Second) // dctx has ended: a send would not even be admitted
		defer tcancel()
		if err := k.add.Tell(tctx, r, "x3", incReq{}); !errors.Is(err, runner.ErrDetached) {
			t.Fatalf("Tell while detached = %v, want ErrDetached", err)
		}
		if r.Status().Entities != 0 {
			t.Fatalf("%d entities resident after detach", r.Status().Entities)
		}
		// After re-attaching (RecoverWindow), the same entity serves again.
		if n, err := k.inc.Ask(ctx, r, "x1", incReq{By: 1}); err != nil || n != 1 {
			t.Fatalf("Ask after re-attach = %d, %v", n, err)
		}
	})
}

func TestLostShardFailsQueuedWithCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		// A full lock view: the lock watch shows the theft at once.
		c, r, _ := startHosting(t, k, runner.Config{DisableDetachment: true, FullLockView: true})
		ctx := t.Context()
		started := make(chan struct{}, 1)
		blocked := make(chan error, 1)
		go func() {
			_, err := k.block.Ask(ctx, r, "L", blockReq{Started: started})
			blocked <- err
		}()
		<-started
		queued := make(chan error, 1)
		go func() {
			// The shard stays unowned (its lock was deleted and this
			// runner cannot re-acquire it): bound the retries.
			qctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
			defer cancel()
			_, err := k.inc.Ask(qctx, r, "L", incReq{By: 1})
			queued <- err
		}()
		synctest.Wait()
		// The lock is taken by another lease: this runner drops the shard
		// (and cannot take it back while that lease lives).
		thief := c.NewStore("thief")
		tl, err := thief.Grant(ctx, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put("shards/"+sharding.ShardOf("L", 8).String(), []byte(`{"runnerID":"thief","incarnation":"1"}`), tl.ID); err != nil {
			t.Fatal(err)
		}
		if err := <-blocked; !errors.Is(err, runner.ErrShardMoved) {
			t.Fatalf("running handler saw %v, want ErrShardMoved", err)
		}
		err = <-queued
		var ud *runner.UndeliveredError
		if !errors.As(err, &ud) || !errors.Is(err, runner.ErrShardMoved) {
			t.Fatalf("queued ask = %v, want *UndeliveredError caused by ErrShardMoved", err)
		}
		if len(r.Owned()) != 7 {
			t.Fatalf("owns %d shards, want 7", len(r.Owned()))
		}
	})
}

func TestShutdownDrainsThenReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(true)
		c, r, _ := startHosting(t, k, runner.Config{})
		ctx := t.Context()
		if _, err := k.inc.Ask(ctx, r, "s", incReq{By: 41}); err != nil {
			t.Fatal(err)
		}
		started, release := make(chan struct{}, 1), make(chan struct{})
		inflight := make(chan error, 1)
		go func() {
			_, err := k.block.Ask(ctx, r, "s", blockReq{Started: started, Release: release})
			inflight <- err
		}()
		<-started
		queued := make(chan int64, 1)
		go func() {
			n, _ := k.inc.Ask(ctx, r, "s", incReq{By: 1})
			queued <- n
		}()
		synctest.Wait()
		shut := make(chan error, 1)
		go func() { shut <- r.Shutdown(context.Background()) }()
		time.Sleep(time.Second)
		synctest.Wait()
		if len(k.log.releases()) != 0 {
			t.Fatal("Release ran while a message was in flight")
		}
		close(release)
		if err := <-inflight; err != nil {
			t.Fatalf("in-flight ask during Shutdown = %v", err)
		}
		if n := <-queued; n != 42 {
			t.Fatalf("queued ask during Shutdown = %d, want 42", n)
		}
		if err := <-shut; err != nil {
			t.Fatal(err)
		}
		rels := k.log.releases()
		if len(rels) != 1 || !errors.Is(rels[0].Reason, runner.ErrShutdown) {
			t.Fatalf("releases = %+v, want one with ErrShutdown", rels)
		}
		if _, ok := c.Get("checkpoints/" + sharding.ShardOf("s", 8).String() + "/test%2Fs"); !ok {
			t.Fatal("Release's checkpoint was not written")
		}
	})
}

// Shards moving between runners (plain release and acquire) keep entity
// state through the Release checkpoint and the Activate restore.
func TestRebalanceKeepsStateThroughCheckpoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(true)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		if err := a.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "a owns all", func() bool { return len(a.Owned()) == 8 })
		rs := []*started{a}
		ask := func(id string) int64 {
			t.Helper()
			for range 1000 {
				for _, r := range rs {
					n, err := k.inc.Ask(t.Context(), r, id, incReq{By: 1})
					if err == nil {
						return n
					}
					var no *runner.NotOwnerError
					if !errors.As(err, &no) && !errors.Is(err, runner.ErrNoTransport) { // the owner is another runner (no transport: one process)
						t.Fatalf("Ask(%s) via %s = %v", id, r.ID(), err)
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("Ask(%s): nobody owns its shard", id)
			return 0
		}
		const entities = 20
		want := map[string]int64{}
		for i := range entities {
			id := fmt.Sprintf("c%d", i)
			want[id] = ask(id)
		}
		b := start(t, c, nil, runner.Config{ID: "b", NumShards: 8})
		if err := b.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, b)
		waitFor(t, 10*time.Second, "partition", func() bool { ok, _ := partitionOK(rs, 8); return ok })
		for i := range entities {
			id := fmt.Sprintf("c%d", i)
			if got := ask(id); got != want[id]+1 {
				t.Errorf("%s = %d after moving, want %d", id, got, want[id]+1)
			}
		}
		if len(k.log.releases()) == 0 {
			t.Fatal("no Release hook ran although shards moved")
		}
	})
}
