package runner_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// waiter's handler blocks until its context ends and reports what it saw.
type ctxWaiter struct{ seen chan<- ctxSeen }

type ctxSeen struct {
	cause    error
	deadline time.Time
	hasDL    bool
	info     runner.ShardInfo
}

type waitCtxReq struct{}

func (w *ctxWaiter) Wait(ctx context.Context, _ waitCtxReq) (string, error) {
	dl, ok := ctx.Deadline()
	info, _ := runner.ShardInfoFrom(ctx)
	<-ctx.Done()
	w.seen <- ctxSeen{cause: context.Cause(ctx), deadline: dl, hasDL: ok, info: info}
	return "", context.Cause(ctx)
}

func newCtxWaiterKind() (*entity.Kind[ctxWaiter], *entity.MethodRef[ctxWaiter, waitCtxReq, string], <-chan ctxSeen) {
	seen := make(chan ctxSeen, 4)
	k := entity.NewKind("ctxwaiter", func(string) *ctxWaiter { return &ctxWaiter{seen: seen} })
	return k, entity.Method(k, "wait", (*ctxWaiter).Wait), seen
}

// nextSeen waits (fake time in a bubble) for the handler's report.
func nextSeen(t *testing.T, seen <-chan ctxSeen) ctxSeen {
	t.Helper()
	select {
	case got := <-seen:
		return got
	case <-time.After(time.Minute):
		t.Fatal("the handler's context was not cancelled")
		return ctxSeen{}
	}
}

// TestHandlerContextCarriesCallerDeadline: a local asker's deadline bounds
// its handler, which sees ErrCallerDeadline as the cause (and still its
// ShardInfo).
func TestHandlerContextCarriesCallerDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, wait, seen := newCtxWaiterKind()
		_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4}, k)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		want, _ := ctx.Deadline()
		// The asker gives up, or gets the handler's answer, at the same instant.
		_, err := wait.Ask(ctx, r, "e", waitCtxReq{})
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, runner.ErrCallerDeadline) {
			t.Fatalf("Ask = %v, want the caller's deadline", err)
		}
		got := nextSeen(t, seen)
		if !errors.Is(got.cause, runner.ErrCallerDeadline) || !got.hasDL || !got.deadline.Equal(want) {
			t.Errorf("handler saw cause %v, deadline %v (%v); want ErrCallerDeadline at %v", got.cause, got.deadline, got.hasDL, want)
		}
		if got.info.Runner != "a" || got.info.Shard != sharding.ShardOf("e", 4) {
			t.Errorf("handler's ShardInfo = %+v", got.info)
		}
	})
}

// TestHandlerContextKeepsShardCauses: a shard that leaves first still
// cancels the handler with the shard's cause, also under a caller deadline.
func TestHandlerContextKeepsShardCauses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, wait, seen := newCtxWaiterKind()
		_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4}, k)
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		errc := make(chan error, 1)
		go func() { _, err := wait.Ask(ctx, r, "e", waitCtxReq{}); errc <- err }()
		synctest.Wait() // the handler blocks
		r.Detach()
		if got := nextSeen(t, seen); !errors.Is(got.cause, runner.ErrDetached) {
			t.Errorf("handler saw cause %v, want ErrDetached", got.cause)
		}
		if err := <-errc; !errors.Is(err, runner.ErrMaybeDelivered) {
			t.Errorf("Ask = %v, want a withheld result (ErrMaybeDelivered)", err)
		}
	})
}

// TestRemoteHandlerContextCarriesCallerDeadline: the deadline travels with
// a remote ask (the frame's timeout) and bounds the owner's handler.
func TestRemoteHandlerContextCarriesCallerDeadline(t *testing.T) {
	t.Parallel()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	k, wait, seen := newCtxWaiterKind()
	owner := start(t, c, nil, runner.Config{ID: "owner", NumShards: 4, ListenAddr: "127.0.0.1:0"})
	gw := start(t, c, nil, runner.Config{ID: "gw", NumShards: 4, ClientOnly: true})
	for _, r := range []*started{owner, gw} {
		if err := r.Register(k); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the gateway routes to the owner, which owns the shard", func() bool {
		o, _ := gw.OwnerOf(sharding.ShardOf("e", 4))
		_, owned := owner.Owned()[sharding.ShardOf("e", 4)]
		return o == "owner" && owned
	})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := wait.Ask(ctx, gw, "e", waitCtxReq{}); err == nil {
		t.Fatal("Ask succeeded, want the caller's deadline")
	}
	select {
	case got := <-seen:
		if !errors.Is(got.cause, runner.ErrCallerDeadline) || !got.hasDL || got.info.Runner != "owner" {
			t.Errorf("remote handler saw cause %v (deadline %v) on %q, want ErrCallerDeadline on owner", got.cause, got.hasDL, got.info.Runner)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the remote handler was not cancelled by the caller's deadline")
	}
}
