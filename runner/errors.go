package runner

import (
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/sharding"
)

// Sentinel errors. The cause errors (ErrDetached, ErrShardMoved,
// ErrPassivated, ErrShutdown) are what context.Cause returns for the context
// of a shard or entity handler that was interrupted.
var (
	// ErrDetached: the runner detached from the cluster (lease deadline,
	// storage failure, lost lock) and stopped every entity.
	ErrDetached = errors.New("runner: detached")
	// ErrShardMoved: the shard is no longer owned here (released or taken).
	ErrShardMoved = errors.New("runner: shard moved")
	// ErrPassivated: the entity was stopped for being idle or evicted.
	ErrPassivated = errors.New("runner: entity passivated")
	// ErrShutdown: the runner is shutting down.
	ErrShutdown = errors.New("runner: shut down")
	// ErrClosed: the runner is not running: Run was not called yet, or
	// returned (Shutdown, Close, its context ended). Send fails with it at
	// once.
	ErrClosed = errors.New("runner: closed")
	// ErrInvalidConfig: the configuration cannot work.
	ErrInvalidConfig = errors.New("runner: invalid config")
	// ErrAlreadyRunning: Run was called twice.
	ErrAlreadyRunning = errors.New("runner: already running")
	// ErrDuplicateRunnerID: another live process registered this runner's
	// ID (Config.ID); Run returns it after giving the ID up.
	ErrDuplicateRunnerID = errors.New("runner: another live process uses this runner ID")
)

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
