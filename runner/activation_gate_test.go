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
	"github.com/shardhost/shardhost/storage/memory"
)

// slowStart is an entity whose Activate blocks (ignoring its context) until
// the test lets it go: a Restore read that hangs, or a process frozen
// between the admission check and the handler.
type slowStart struct {
	gate <-chan struct{}
	ran  *atomic.Int64
}

func (s *slowStart) Activate(context.Context, entity.ActivateInfo) error {
	<-s.gate
	return nil
}

func (s *slowStart) Do(context.Context, struct{}) (int64, error) { return s.ran.Add(1), nil }

// TestNoHandlerStartsAfterADetachDuringActivation: a message admitted
// before the detach instant whose entity is still activating when the
// runner detaches never runs its handler — the start gate is checked again
// between activation and the handler — and the sender learns it was not
// delivered (not "maybe delivered"): its ask, retried while no runner
// owns the shard, ends at the caller's deadline with the detach as the
// last attempt's reason.
func TestNoHandlerStartsAfterADetachDuringActivation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var ran atomic.Int64
		kind := entity.NewKind("slowstart", func(string) *slowStart { return &slowStart{gate: gate, ran: &ran} })
		do := entity.Method(kind, "do", (*slowStart).Do)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		s := c.NewStore("a")
		r := startOn(t, s, nil, runner.Config{ID: "a", NumShards: 4, LeaseTTL: 3 * time.Second})
		if err := r.Register(kind); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "a owns every shard", func() bool { return len(r.Owned()) == 4 })

		errc := make(chan error, 1)
		go func() {
			// Undelivered sends are retried until an owner takes the
			// message or the caller gives up: bound it.
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := do.Ask(ctx, r, "e", struct{}{})
			errc <- err
		}()
		synctest.Wait() // the ask is admitted; its entity blocks in Activate
		s.FailKeepAlive(true)
		waitFor(t, 10*time.Second, "a detaches", func() bool { return r.Status().Detached })
		close(gate)
		err := <-errc
		if ran.Load() != 0 {
			t.Fatalf("the handler ran after its runner detached (ask: %v)", err)
		}
		var und *runner.UndeliveredError
		if !errors.As(err, &und) || !errors.Is(err, runner.ErrDetached) || errors.Is(err, runner.ErrMaybeDelivered) {
			t.Fatalf("ask = %v, want an *UndeliveredError caused by ErrDetached", err)
		}
	})
}
