package runner

import (
	"github.com/shardhost/shardhost/runner/internal/eventhub"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Event is one entry of a runner's event stream. The concrete types are
// ShardAcquired, ShardReleased, ShardLost, RemindersUnrecorded,
// WorkerStarted, WorkerStopped, Registered, Detached, Reattached and
// HandoffPhase. Events of one runner are delivered in the order the state
// changed; Time is taken at the change (local clock, monotonic reading).
type Event interface {
	// Base returns the fields every event has.
	Base() EventBase
}

// EventBase is embedded in every event.
type EventBase struct {
	Runner string    // runner ID
	Time   time.Time // when the state changed
}

// Base implements Event.
func (b EventBase) Base() EventBase { return b }

// ShardAcquired: the runner started owning Shard at Epoch; its entities may
// run from now on.
type ShardAcquired struct {
	EventBase
	Shard sharding.ShardID
	Epoch storage.Epoch
}

// ShardReleased: the runner stopped owning Shard in a planned way (its
// entities were drained; the lock is being deleted or handed over).
type ShardReleased struct {
	EventBase
	Shard sharding.ShardID
	Epoch storage.Epoch
	// Interrupted counts the entities still busy when the drain ended
	// (DrainTimeout, a handler ignoring its context): they got no Release
	// hook, so whatever they did since their last checkpoint is lost.
	Interrupted int
}

// ShardLost: the runner stopped owning Shard without a planned release:
// Cause is ErrDetached (the whole runner detached), ErrShardMoved (this
// shard's lock was deleted, rewritten or taken behind its back),
// ErrShutdown (Close, or Run's context ended) or ErrDuplicateRunnerID (it
// gave its ID up to another process).
type ShardLost struct {
	EventBase
	Shard sharding.ShardID
	Epoch storage.Epoch
	Cause error
}

// RemindersUnrecorded: the runner released Shard (plainly) without being
// able to record which of its reminders' ticks had fired (Err: the store
// call failed, or a registration was still being written). The next owner
// fires each of them at least once instead of exactly once: the ticks it
// cannot be sure of arrive with ReminderTick.Redelivered.
type RemindersUnrecorded struct {
	EventBase
	Shard sharding.ShardID
	Epoch storage.Epoch
	Err   error
}

// WorkerStarted: a shard worker or singleton (Singleton set) started
// running for Shard at Epoch on this runner (again, after a restart).
type WorkerStarted struct {
	EventBase
	Name      string
	Singleton bool
	Shard     sharding.ShardID
	Epoch     storage.Epoch
}

// WorkerStopped: a shard worker or singleton returned (Err: its error or
// panic, nil when it returned nil or its context ended it).
type WorkerStopped struct {
	EventBase
	Name      string
	Singleton bool
	Shard     sharding.ShardID
	Epoch     storage.Epoch
	Err       error
}

// Registered: the runner registered under Lease (first start, or after its
// previous lease was lost).
type Registered struct {
	EventBase
	Lease storage.LeaseID
}

// Detached: the runner detached; every shard was dropped at Time.
type Detached struct {
	EventBase
	Reason   detachment.Reason
	Detail   string
	Deadline time.Time // the lease deadline known at the time
}

// Reattached: the runner re-attached after RecoverWindow of health.
type Reattached struct {
	EventBase
	Lease    storage.LeaseID
	NewLease bool // the old lease was lost and a new one granted
}

// Subscription receives a runner's events: Events returns the channel
// (closed after Close), Close ends the subscription and waits for its
// goroutine. Delivery never blocks the runner: undelivered events queue in
// memory until read or Close (internal/eventhub).
type Subscription = eventhub.Subscription[Event]
