package runner_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// A call whose context already ended is never delivered on the local path:
// the handler does not run, and the error matches the context's
// (context.Canceled, context.DeadlineExceeded, the cause), not
// ErrMaybeDelivered.
func TestEndedContextNeverRunsHandlerLocally(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		_, r, _ := startHosting(t, k, runner.Config{})
		ctx := t.Context()
		if n, err := k.inc.Ask(ctx, r, "x", incReq{By: 1}); err != nil || n != 1 {
			t.Fatalf("Ask = %d, %v", n, err)
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
		defer cancel2()
		gone := errors.New("caller gone")
		caused, cancel3 := context.WithCancelCause(ctx)
		cancel3(gone)
		for _, tc := range []struct {
			name string
			ctx  context.Context
			want []error
		}{
			{"cancelled", cancelled, []error{context.Canceled}},
			{"expired", expired, []error{context.DeadlineExceeded}},
			{"cancelled with a cause", caused, []error{context.Canceled, gone}},
		} {
			_, err := k.inc.Ask(tc.ctx, r, "x", incReq{By: 1000})
			errT := k.add.Tell(tc.ctx, r, "x", incReq{By: 1000})
			for _, e := range []error{err, errT} {
				for _, w := range tc.want {
					if !errors.Is(e, w) {
						t.Errorf("%s: send = %v, want it to match %v", tc.name, e, w)
					}
				}
				if errors.Is(e, runner.ErrMaybeDelivered) {
					t.Errorf("%s: send = %v: maybe delivered, but nothing may have been", tc.name, e)
				}
			}
		}
		synctest.Wait()
		if n, err := k.inc.Ask(ctx, r, "x", incReq{}); err != nil || n != 1 {
			t.Fatalf("counter = %d, %v; want 1 (no send with an ended context ran)", n, err)
		}
	})
}

// An ask whose context ends while it waits in the mailbox is not run when
// its turn comes (its caller already returned).
func TestQueuedAskWhoseContextEndsIsNotRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		_, r, _ := startHosting(t, k, runner.Config{})
		ctx := t.Context()
		started, release := make(chan struct{}, 1), make(chan struct{})
		blocked := make(chan error, 1)
		go func() {
			_, err := k.block.Ask(ctx, r, "q", blockReq{Started: started, Release: release})
			blocked <- err
		}()
		<-started
		qctx, cancel := context.WithCancel(ctx)
		queued := make(chan error, 1)
		go func() {
			_, err := k.inc.Ask(qctx, r, "q", incReq{By: 1000})
			queued <- err
		}()
		synctest.Wait() // queued behind the blocked handler
		cancel()
		if err := <-queued; !errors.Is(err, context.Canceled) {
			t.Fatalf("queued ask = %v, want context.Canceled", err)
		}
		close(release)
		if err := <-blocked; err != nil {
			t.Fatal(err)
		}
		if n, err := k.inc.Ask(ctx, r, "q", incReq{}); err != nil || n != 0 {
			t.Fatalf("counter = %d, %v; want 0 (the abandoned ask never ran)", n, err)
		}
	})
}

// The remote path: a gateway never sends a call whose context ended, and
// says so (not a stale connection state such as "still CONNECTING after
// 1s" when it returned at once).
func TestEndedContextNeverSentRemotely(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	k := newTestKind(false)
	owner := start(t, c, nil, runner.Config{ID: "owner", NumShards: 8, ListenAddr: "127.0.0.1:0"})
	gw := start(t, c, nil, runner.Config{ID: "gw", NumShards: 8, ClientOnly: true})
	for _, r := range []*started{owner, gw} {
		if err := r.Register(k.kind); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the gateway routes to the owner", func() bool {
		o, _ := gw.OwnerOf(sharding.ShardOf("x", 8))
		return o == "owner" && len(owner.Owned()) == 8
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := k.inc.Ask(ctx, gw, "x", incReq{By: 1}); err != nil || n != 1 {
		t.Fatalf("Ask through the gateway = %d, %v", n, err)
	}
	cancelled, cancel2 := context.WithCancel(ctx)
	cancel2()
	expired, cancel3 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel3()
	for _, tc := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {expired, context.DeadlineExceeded}} {
		_, err := k.inc.Ask(tc.ctx, gw, "x", incReq{By: 1000})
		if !errors.Is(err, tc.want) || errors.Is(err, runner.ErrMaybeDelivered) || strings.Contains(err.Error(), "after") {
			t.Errorf("remote Ask with an ended context = %v, want %v and nothing about a connection", err, tc.want)
		}
	}
	if n, err := k.inc.Ask(ctx, gw, "x", incReq{}); err != nil || n != 1 {
		t.Fatalf("counter = %d, %v; want 1", n, err)
	}
}

// Ask and Tell on a runner that is not running — stopped before Run, or
// Run returned — fail at once with ErrClosed, also a send that was waiting
// for an owner when Run returned. (A send before Run waits for it:
// TestAskRightAfterGoRun.)
func TestSendOnRunnerNotRunningFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		k := newTestKind(false)
		store := c.NewStore("a")
		r, err := runner.New(store, runner.Config{ID: "a", NumShards: 8, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		check := func(when string) {
			t.Helper()
			if _, err := k.inc.Ask(ctx, r, "x", incReq{}); !errors.Is(err, runner.ErrClosed) {
				t.Errorf("Ask %s = %v, want ErrClosed", when, err)
			}
			if err := k.add.Tell(ctx, r, "x", incReq{}); !errors.Is(err, runner.ErrClosed) {
				t.Errorf("Tell %s = %v, want ErrClosed", when, err)
			}
			if ctx.Err() != nil {
				t.Fatalf("a send %s waited for its context", when)
			}
		}
		store.Partition(true) // no owner will be known: sends wait
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		waitRunning(t, r)
		waiting := make(chan error, 1)
		go func() {
			_, err := k.inc.Ask(ctx, r, "x", incReq{})
			waiting <- err
		}()
		synctest.Wait()
		r.Close()
		<-done
		if err := <-waiting; !errors.Is(err, runner.ErrClosed) {
			t.Errorf("send waiting for an owner when Run returned = %v, want ErrClosed", err)
		}
		check("after Run returned")
	})
}

// New applies the store's rule to the ID, and a negative value is reported
// under the name of the field the user set (not a field derived from it).
func TestNewValidatesIDAndNamesTheNegativeField(t *testing.T) {
	s := memory.New()
	defer s.Cluster().Close()
	for _, id := range []string{"a/b\x01", "a/b", "a\x01", "a\x7f", strings.Repeat("x", 129), "\xff"} {
		if _, err := runner.New(s, runner.Config{ID: id}); !errors.Is(err, runner.ErrInvalidConfig) || !strings.Contains(err.Error(), "ID") {
			t.Errorf("New(ID %q) = %v, want ErrInvalidConfig naming ID", id, err)
		}
	}
	cfgT := reflect.TypeFor[runner.Config]()
	for i := range cfgT.NumField() {
		f := cfgT.Field(i)
		var cfg runner.Config
		cfg.ID = "a"
		v := reflect.ValueOf(&cfg).Elem().Field(i)
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			if f.Name == "AcquireRetryWindow" || f.Name == "StartTimeout" { // negative is SingleAttempt, WaitForever
				continue
			}
			v.SetInt(int64(-time.Second))
		case f.Type.Kind() == reflect.Int:
			v.SetInt(-1)
		default:
			continue
		}
		_, err := runner.New(s, cfg)
		if !errors.Is(err, runner.ErrInvalidConfig) || !strings.Contains(err.Error(), f.Name+" ") {
			t.Errorf("New(%s = -1) = %v, want ErrInvalidConfig naming %s", f.Name, err, f.Name)
		}
		for j := range cfgT.NumField() {
			if other := cfgT.Field(j).Name; other != f.Name && strings.Contains(err.Error(), other+" ") {
				t.Errorf("New(%s = -1) = %v: names %s, a field the user did not set", f.Name, err, other)
			}
		}
	}
	if _, err := runner.New(s, runner.Config{ID: "a", Weight: sharding.MaxWeight + 1}); !errors.Is(err, runner.ErrInvalidConfig) {
		t.Errorf("New(Weight > MaxWeight) = %v, want ErrInvalidConfig", err)
	}
	if _, err := runner.New(s, runner.Config{ID: "a", AcquireRetryWindow: runner.SingleAttempt}); err != nil {
		t.Errorf("New(SingleAttempt) = %v", err)
	}
	if _, err := runner.New(s, runner.Config{ID: fmt.Sprintf("pod-%d.ünïcode", 7)}); err != nil {
		t.Errorf("New(valid ID) = %v", err)
	}
}
