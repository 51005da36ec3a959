package hosting

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// The causes a shard's or a handler's context ends with, and the outcomes
// of a delivery. Package runner re-exports every one of them under the
// same name: callers test them with errors.Is and errors.As there.
var (
	// ErrDetached: the runner detached from the cluster and stopped every
	// entity.
	ErrDetached = errors.New("runner: detached")
	// ErrShardMoved: the shard is no longer owned here (released or taken).
	ErrShardMoved = errors.New("runner: shard moved")
	// ErrPassivated: the entity was stopped while its shard stays here,
	// for one of two reasons that both match it with errors.Is:
	// ErrIdleExpired or ErrEvicted.
	ErrPassivated = errors.New("runner: entity passivated")
	// ErrIdleExpired: the entity received no message for its kind's
	// IdleAfter (errors.Is(err, ErrPassivated) holds). Nobody has used it
	// for that long: an entity whose state ends with disuse (a session)
	// may delete its state on this reason.
	ErrIdleExpired = fmt.Errorf("%w: idle for its kind's IdleAfter", ErrPassivated)
	// ErrEvicted: the entity was the least recently used idle one when the
	// runner held more than MaxResidentEntities (errors.Is(err,
	// ErrPassivated) holds). Memory pressure, not disuse: its state is
	// still wanted and must be kept (checkpointed), not deleted.
	ErrEvicted = fmt.Errorf("%w: evicted (MaxResidentEntities exceeded)", ErrPassivated)
	// ErrShutdown: the runner is shutting down.
	ErrShutdown = errors.New("runner: shut down")
	// ErrCallerDeadline: the asker's deadline passed while its handler ran.
	ErrCallerDeadline = errors.New("runner: the caller's deadline passed")
	// ErrMaybeDelivered: the message may have reached a handler (the
	// transport's sentinel, shared so both sides test the same value).
	ErrMaybeDelivered = transport.ErrMaybeDelivered
)

// UndeliveredError reports a message that never reached a handler: it was
// queued for a shard that left this runner before the message ran. It is
// safe to retry.
type UndeliveredError struct {
	Shard sharding.ShardID
	// Cause is ErrDetached, ErrShardMoved or ErrShutdown, or the context's
	// error when it ended before the message was admitted or run.
	Cause error
}

func (e *UndeliveredError) Error() string {
	return fmt.Sprintf("runner: message for shard %d not delivered: %v", e.Shard, e.Cause)
}

// Unwrap returns the cause.
func (e *UndeliveredError) Unwrap() error { return e.Cause }

// NotOwnerError reports that this runner does not own Shard at its current
// epoch. It is retryable: the message was not delivered. OwnerHint names the
// runner believed to own it ("" when unknown or unowned).
type NotOwnerError struct {
	Shard     sharding.ShardID
	OwnerHint string
}

func (e *NotOwnerError) Error() string {
	if e.OwnerHint == "" {
		return fmt.Sprintf("runner: shard %d not owned here (owner unknown)", e.Shard)
	}
	return fmt.Sprintf("runner: shard %d not owned here (owner %q)", e.Shard, e.OwnerHint)
}

// StaleResultError reports a handler that ran but whose result is withheld:
// the runner it ran on lost the shard while it ran (the detach instant
// passed, or the shard was taken, dropped or detached), or, when the reply
// arrived, the sender had already seen a newer epoch of the shard (through
// its lock watch or an earlier reply) and the owner's lease had ended. The
// handler's effects may exist — in the old owner's memory, never in fenced
// storage — so errors.Is(err, ErrMaybeDelivered) holds and the call is not
// retried.
type StaleResultError struct {
	Shard  sharding.ShardID
	Runner string        // the runner the handler ran on
	Epoch  storage.Epoch // the ownership epoch the handler ran under
	// Newer is the newer epoch the sender had seen; 0 when the owner
	// withheld the result itself.
	Newer  storage.Epoch
	Reason string
	// Cause is why the shard left: ErrDetached (also when the detach
	// instant passed), ErrShardMoved or ErrShutdown.
	Cause error
}

func (e *StaleResultError) Error() string {
	if e.Newer != 0 {
		return fmt.Sprintf("runner: result of shard %d from %s withheld (%v): it ran under epoch %d, epoch %d had already been seen",
			e.Shard, e.Runner, ErrMaybeDelivered, e.Epoch, e.Newer)
	}
	return fmt.Sprintf("runner: result of shard %d from %s withheld (%v): %s", e.Shard, e.Runner, ErrMaybeDelivered, e.Reason)
}

// Unwrap returns ErrMaybeDelivered and the cause.
func (e *StaleResultError) Unwrap() []error {
	if e.Cause == nil {
		return []error{ErrMaybeDelivered}
	}
	return []error{ErrMaybeDelivered, e.Cause}
}

// ContextError is ctx's error (context.Canceled or context.DeadlineExceeded,
// for errors.Is) together with its cause when that says more.
func ContextError(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// errRetired refuses a push to an instance that left its shard's table.
var errRetired = errors.New("runner: entity retired")
