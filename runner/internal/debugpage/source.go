package debugpage

import (
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Source is what the page reads from a runner.
//
// The handler calls Snapshot once per request, from the request's
// goroutine; calls for concurrent requests overlap. Snapshot should not
// block beyond short critical sections, and returns data the page may keep
// and modify: copies, sharing nothing the runner still writes.
type Source interface {
	Snapshot() Snapshot
}

// MaxEvents is how many of the latest events a State carries; a Source
// returns at most that many in Snapshot.Events.
const MaxEvents = 100

// Snapshot is a runner's state as the page reads it: its identity and
// configuration, its own state, and its view of the cluster (its watch
// caches of the runner records, locks and handoff records, and the
// assignment it computed last).
type Snapshot struct {
	// Identity and configuration.
	ID           string
	Incarnation  string
	ClientOnly   bool
	NumShards    int
	Strategy     string // the sharding strategy's name
	Weight       int
	DetachMargin time.Duration

	// Its own state.
	Address  string    // where it serves ("" when it does not)
	Phase    string    // new, starting, attached, detached, stopping, stopped, or routing (a client-only runner serving)
	Attached bool      // Phase is attached
	Detached *Detach   // why it detached; nil unless Phase is detached
	Started  time.Time // when Run was called (zero before)
	// Lease is its lease (storage.NoLease before the first grant), with
	// the TTL the store granted and the time until which the lease is
	// known to live. A client-only runner's lease is not shown.
	Lease                  storage.LeaseID
	LeaseTTL               time.Duration
	LeaseDeadline          time.Time
	KeepAliveFailureStreak int // consecutive failed renewals
	Owned                  int // shards owned now
	Pending                int // assigned, being acquired
	Releasing              int // being released or handed off
	InboundHandoffs        int // being warmed here
	Entities               int // resident entities
	Kinds                  []KindCount
	Workers                []WorkerRun              // shard workers and singletons running here
	Remembered             map[sharding.ShardID]int // remembered entities of each owned shard that has some
	Events                 []Event                  // the latest, newest first; at most MaxEvents
	// Gateway is a client-only runner's view of the cluster as it routes
	// with it (nil for a hosting runner).
	Gateway *Gateway
	// NotStarted says why a runner that is not ready is not, once a start
	// call failed ("not started: etcd at ... unreachable since ..."); ""
	// otherwise.
	NotStarted string

	// Its view of the cluster.
	Members         []storage.Runner           // registered runners, by ID
	Locks           []storage.Lock             // shard locks held, any order
	ByLease         map[storage.LeaseID]string // the runner ID of each registration lease
	Handoffs        []storage.Handoff          // handoff records, by shard
	Assignment      sharding.Assignment        // runner ID by shard; "" or short: unassigned
	AssignmentError string                     // why the last assignment failed ("" when it did not)
}

// Gateway is the state of a client-only runner's routing: what its
// readiness check says and what its view holds.
type Gateway struct {
	Ready   bool   // its readiness check holds: the view is current and a hosting runner is registered
	Reason  string // the readiness check's reason ("routing to 2 runners", "store unreachable for ...")
	Members int    // hosting runners in its view
	Routes  int    // shards it has a route for: a live lock owner it knows, else a registered assignee
}

// WorkerRun is a shard worker or singleton running on the runner.
type WorkerRun struct {
	Name      string
	Singleton bool
	Shard     sharding.ShardID
	Epoch     storage.Epoch
	Since     time.Time // when its current run started
}

// KindCount is one registered kind's resident entities and message
// counters, in Snapshot.Kinds (by name).
type KindCount struct {
	Name     string
	Active   int    // resident instances
	Handled  uint64 // messages whose handler ran, since registration
	Rejected uint64 // messages refused by a full mailbox
}
