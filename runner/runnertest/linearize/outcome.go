package linearize

import (
	"errors"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// OutcomeOf classifies the error of a runner's Send or Ask (nil is OK) by
// what it guarantees about the handler:
//
//   - Unknown, first: anything matching runner.ErrMaybeDelivered (the
//     connection failed after sending; the caller's context ended while
//     the request was out; a *runner.StaleResultError, whose handler ran
//     but whose owner lost the shard meanwhile), even when it also wraps
//     an error listed below;
//   - Failed: errors that prove no handler ran the call — a
//     *runner.NotOwnerError or *runner.UndeliveredError, runner.ErrNoOwner,
//     runner.ErrNotSent, runner.ErrTooManyWaiting, entity.ErrMailboxFull
//     (refused before admission), runner.ErrClosed (nothing sent), and the
//     context error Send returns when the caller's context ends between
//     such attempts (it wraps the last of them);
//   - Unknown: everything else — a *runner.RemoteError or
//     *entity.PanicError (the handler ran and failed: its writes may have
//     happened), a bare context error, any error not listed.
//
// The rule errs one way only: an error of unknown effect is never taken
// for a failure, so a history is never rejected because of a
// classification.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return OK
	}
	var (
		notOwner    *runner.NotOwnerError
		undelivered *runner.UndeliveredError
	)
	switch {
	case errors.Is(err, runner.ErrMaybeDelivered):
		return Unknown
	case errors.As(err, &notOwner), errors.As(err, &undelivered),
		errors.Is(err, runner.ErrNoOwner), errors.Is(err, runner.ErrNotSent),
		errors.Is(err, runner.ErrTooManyWaiting), errors.Is(err, entity.ErrMailboxFull),
		errors.Is(err, runner.ErrClosed):
		return Failed
	}
	return Unknown
}
