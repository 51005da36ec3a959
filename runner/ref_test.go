package runner_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// TestRefFollowsItsShardWhenItMoves: refs taken on runner a, whose
// entities are resident there, keep working when a second runner takes
// some of their shards (planned moves on a real etcd): each next ask
// through a ref reaches the entity at its new owner, once, with the state
// the old owner checkpointed.
func TestRefFollowsItsShardWhenItMoves(t *testing.T) {
	t.Parallel()
	const shards = 16
	e := newHandoffEnv(t, shards, 0)
	a := e.start("a")
	e.c.waitPartition([]*etcdRunner{a}, shards, 30*time.Second)
	ask := func(ref *runner.Ref) acctResp {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := e.inc.Ask(ctx, ref, ref.Entity(), acctReq{By: 1})
		if err != nil {
			t.Fatalf("ask %s through its ref: %v", ref.Entity(), err)
		}
		return resp
	}
	refs := make([]*runner.Ref, 32)
	for i := range refs {
		refs[i] = a.Ref(e.kind, fmt.Sprintf("ref-%d", i))
		for want := int64(1); want <= 2; want++ { // the second through the ref's target
			if resp := ask(refs[i]); resp.N != want || resp.Runner != "a" {
				t.Fatalf("ask %d of %s = %+v, want N %d on a", want, refs[i].Entity(), resp, want)
			}
		}
	}
	b := e.start("b")
	e.c.waitPartition([]*etcdRunner{a, b}, shards, 60*time.Second)
	onB := b.Owned()
	moved := 0
	for round := int64(3); round <= 4; round++ {
		for _, ref := range refs {
			owner := "a"
			if _, ok := onB[sharding.ShardOf(ref.Entity(), shards)]; ok {
				owner = "b"
				moved++
			}
			if resp := ask(ref); resp.N != round || resp.Runner != owner {
				t.Fatalf("ask %d of %s after the move = %+v, want N %d on %s", round, ref.Entity(), resp, round, owner)
			}
		}
	}
	if moved == 0 {
		t.Fatal("no ref's shard moved to b")
	}
}

// refHandled counts refKind's handled tells (one test at a time).
var refHandled atomic.Int64

type refCounter struct{ n int64 }

var (
	refKind = entity.NewKind("ref-counter", func(string) *refCounter { return &refCounter{} })
	refTell = entity.Signal(refKind, "add", func(c *refCounter, _ context.Context, _ struct{}) error {
		refHandled.Add(1)
		c.n++
		return nil
	})
	refGet = entity.Method(refKind, "get", func(c *refCounter, _ context.Context, _ struct{}) (int64, error) {
		return c.n, nil
	})
)

// TestRefSendsAsynchronously: a Ref is a runner.Sender, so the typed
// asynchronous calls take it: TellAsync and AskAsync through it are each
// delivered once and report their outcome, and while the runner is
// detached they fail as by ID (the detach joined with their deadline)
// without running.
func TestRefSendsAsynchronously(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refHandled.Store(0)
		t0 := time.Now()
		_, r, rec := startOwningAll(t, detachCfg("a"), refKind)
		var ref runner.Sender = r.Ref(refKind, "x")
		told := make(chan error, 3)
		for range 3 {
			refTell.TellAsync(ref, "x", struct{}{}, time.Second, func(err error) { told <- err })
		}
		for range 3 {
			if err := <-told; err != nil {
				t.Fatal(err)
			}
		}
		asked := make(chan string, 1)
		refGet.AskAsync(ref, "x", struct{}{}, time.Second, func(n int64, err error) { asked <- fmt.Sprint(n, " ", err) })
		if got := <-asked; got != "3 <nil>" {
			t.Fatalf("AskAsync through the ref = %s, want 3 <nil>", got)
		}

		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond))) // renewal at 5s succeeded
		r.store.FailKeepAlive(true)
		waitDetached(t, rec, 20*time.Second)
		refTell.TellAsync(ref, "x", struct{}{}, time.Second, func(err error) { told <- err })
		if err := <-told; !errors.Is(err, runner.ErrDetached) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TellAsync through the ref while detached = %v, want its deadline joined with ErrDetached", err)
		}
		synctest.Wait()
		if n := refHandled.Load(); n != 3 {
			t.Fatalf("%d tells handled, want 3", n)
		}
	})
}

// TestRefTellAfterDetachIsNotDelivered: once the runner detached, a tell
// through a ref whose entity was resident is refused as by ID (the
// detach is its cause) and its handler never runs.
func TestRefTellAfterDetachIsNotDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refHandled.Store(0)
		t0 := time.Now()
		_, r, rec := startOwningAll(t, detachCfg("a"), refKind)
		ref := r.Ref(refKind, "x")
		ctx := context.Background()
		for range 2 { // by ID, then through the ref's target
			if err := refTell.Tell(ctx, ref, "x", struct{}{}); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if n := refHandled.Load(); n != 2 {
			t.Fatalf("%d tells handled, want 2", n)
		}
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond))) // renewal at 5s succeeded
		r.store.FailKeepAlive(true)
		waitDetached(t, rec, 20*time.Second)
		for _, via := range []struct {
			name string
			snd  entity.Sender
		}{{"ref", ref}, {"ID", r}} {
			tctx, cancel := context.WithTimeout(ctx, time.Second)
			err := refTell.Tell(tctx, via.snd, "x", struct{}{})
			cancel()
			if !errors.Is(err, runner.ErrDetached) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("tell by %s while detached = %v, want its deadline joined with ErrDetached", via.name, err)
			}
		}
		synctest.Wait()
		if n := refHandled.Load(); n != 2 {
			t.Fatalf("%d tells handled, want 2: a tell after the detach ran", n)
		}
	})
}
