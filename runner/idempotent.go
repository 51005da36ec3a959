package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/hosting"
)

// sendIdempotent sends c, a call of an entity.Idempotent method whose
// first attempt failed with ErrMaybeDelivered (first), again and again
// after every ErrMaybeDelivered — the connection to the owner failed after
// sending, or the owner withheld a stale result — with jittered
// exponential backoff, until an attempt succeeds or fails otherwise, or
// ctx ends. Then it returns ctx's error joined with the last attempt's.
// Running an idempotent handler more than once is harmless by definition.
func (r *Runner) sendIdempotent(ctx context.Context, c entity.Call, first error) (any, error) {
	last := first
	bo := newBackoff()
	timer := time.NewTimer(bo.NextBackOff())
	defer timer.Stop()
	for attempt := 1; ; attempt++ {
		r.log.Debug("idempotent call may have run; sending it again", "kind", c.Kind.Name(), "method", c.Handler.Name(),
			"attempt", attempt, "err", last)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("runner: idempotent %s.%s %q: %w (last attempt: %w)",
				c.Kind.Name(), c.Handler.Name(), c.Entity, hosting.ContextError(ctx), last)
		case <-timer.C:
		}
		r.met.sendRetries.Add(context.Background(), 1, r.met.attrs)
		v, err := r.sendOnce(ctx, c)
		if err == nil || !errors.Is(err, ErrMaybeDelivered) || ctx.Err() != nil {
			return v, err
		}
		last = err
		timer.Reset(bo.NextBackOff())
	}
}
