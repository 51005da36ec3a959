package linearize

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

func TestOutcomeOfSendErrors(t *testing.T) {
	notOwner := &runner.NotOwnerError{Shard: 3, OwnerHint: "r2"}
	undelivered := &runner.UndeliveredError{Shard: 3, Cause: runner.ErrShardMoved}
	stale := &runner.StaleResultError{Shard: 3, Runner: "r1", Epoch: 10, Newer: 12, Cause: runner.ErrShardMoved}
	maybe := fmt.Errorf("to r1: %w", runner.ErrMaybeDelivered)
	for _, tc := range []struct {
		name string
		err  error
		want Outcome
	}{
		{"nil", nil, OK},
		{"not owner", notOwner, Failed},
		{"undelivered", undelivered, Failed},
		{"no owner", fmt.Errorf("shard 3 unowned for 2s: %w", runner.ErrNoOwner), Failed},
		{"not sent", fmt.Errorf("%w: connection refused", runner.ErrNotSent), Failed},
		{"too many waiting", runner.ErrTooManyWaiting, Failed},
		{"mailbox full", fmt.Errorf("%w (on r1)", entity.ErrMailboxFull), Failed},
		{"closed", runner.ErrClosed, Failed},
		{"context ended between undelivered attempts", fmt.Errorf("runner: not delivered: %w (last attempt: %w)", context.DeadlineExceeded, notOwner), Failed},
		{"maybe delivered", maybe, Unknown},
		{"stale result", stale, Unknown},
		{"timed out waiting for the answer", fmt.Errorf("runner: ask timed out (%w): %w", runner.ErrMaybeDelivered, context.DeadlineExceeded), Unknown},
		{"maybe delivered wins over an earlier attempt's not-owner", errors.Join(notOwner, maybe), Unknown},
		{"a handler error from another runner", &runner.RemoteError{Runner: "r1", Message: "storage: fenced"}, Unknown},
		{"a handler panic", &entity.PanicError{Kind: "k", Method: "m", Entity: "e", Value: "boom"}, Unknown},
		{"a bare context error", context.DeadlineExceeded, Unknown},
		{"anything else", errors.New("something"), Unknown},
	} {
		if got := OutcomeOf(tc.err); got != tc.want {
			t.Errorf("%s: OutcomeOf(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
