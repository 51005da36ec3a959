package runner_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// flaky's first call blocks until its shard leaves (the result is then
// withheld: ErrMaybeDelivered); later calls answer at once.
type flaky struct{ calls *atomic.Int64 }

type flakyReq struct{}

func (f *flaky) Read(ctx context.Context, _ flakyReq) (int64, error) {
	n := f.calls.Add(1)
	if n == 1 {
		<-ctx.Done()
	}
	return n, nil
}

// idempotentRun asks through a method defined with opts while the runner
// detaches under the first call, and returns the result and the calls.
func idempotentRun(t *testing.T, opts ...entity.MethodOption) (int64, error, int64) {
	var calls atomic.Int64
	k := entity.NewKind("flaky", func(string) *flaky { return &flaky{calls: &calls} })
	read := entity.Method(k, "read", (*flaky).Read, opts...)
	_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4}, k)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type result struct {
		n   int64
		err error
	}
	res := make(chan result, 1)
	go func() { n, err := read.Ask(ctx, r, "e", flakyReq{}); res <- result{n, err} }()
	synctest.Wait() // the first call blocks in its handler
	r.Detach()      // its shard leaves: the result is withheld
	got := <-res
	return got.n, got.err, calls.Load()
}

// TestIdempotentMethodRetriedAfterMaybeDelivered: an Ask of an Idempotent
// method whose handler ran on an owner that lost the shard (a withheld,
// stale result: ErrMaybeDelivered) is sent again and answered once the
// shard is owned again (here: after the re-attach).
func TestIdempotentMethodRetriedAfterMaybeDelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, err, calls := idempotentRun(t, entity.Idempotent())
		if err != nil || n != 2 || calls != 2 {
			t.Fatalf("idempotent Ask = %d, %v after %d calls; want 2, nil after 2 (retried after the withheld result)", n, err, calls)
		}
	})
}

// TestNonIdempotentMethodNotRetried: without the option the same call
// fails with ErrMaybeDelivered (at most once).
func TestNonIdempotentMethodNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, err, calls := idempotentRun(t)
		var stale *runner.StaleResultError
		if !errors.Is(err, runner.ErrMaybeDelivered) || !errors.As(err, &stale) || calls != 1 {
			t.Fatalf("Ask = %v after %d calls; want a *StaleResultError after 1 call", err, calls)
		}
	})
}

// TestIdempotentRetryEndsWithContext: retries stop when the caller's
// context ends; the error says both why it ended and what failed last.
func TestIdempotentRetryEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		k := entity.NewKind("flaky", func(string) *flaky { return &flaky{calls: &calls} })
		read := entity.Method(k, "read", (*flaky).Read, entity.Idempotent())
		_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4, RecoverWindow: time.Hour}, k)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		errc := make(chan error, 1)
		go func() { _, err := read.Ask(ctx, r, "e", flakyReq{}); errc <- err }()
		synctest.Wait()
		r.Detach() // and it stays detached for an hour
		err := <-errc
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, runner.ErrDetached) {
			t.Fatalf("Ask = %v, want the deadline and the last attempt's cause (detached)", err)
		}
	})
}

// TestIdempotentCallThatMayHaveRunNeverReportsUndelivered: once an attempt
// may have run the call, the error that ends the retries matches
// ErrMaybeDelivered, even when the last attempt proved only that it was
// not delivered itself (here: undelivered, the runner detached, until the
// deadline). A caller told "not delivered" would take a call that ran for
// one that did not.
func TestIdempotentCallThatMayHaveRunNeverReportsUndelivered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		k := entity.NewKind("flaky", func(string) *flaky { return &flaky{calls: &calls} })
		read := entity.Method(k, "read", (*flaky).Read, entity.Idempotent())
		_, r, _ := startOwningAll(t, runner.Config{ID: "a", NumShards: 4, RecoverWindow: time.Hour}, k)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		errc := make(chan error, 1)
		go func() { _, err := read.Ask(ctx, r, "e", flakyReq{}); errc <- err }()
		synctest.Wait()
		r.Detach() // the first call's result is withheld; later attempts are undelivered
		err := <-errc
		if calls.Load() != 1 || !errors.Is(err, runner.ErrMaybeDelivered) {
			t.Fatalf("Ask = %v after %d calls of the handler; want an error matching ErrMaybeDelivered after 1", err, calls.Load())
		}
	})
}
