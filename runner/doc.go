// Package runner hosts the shards of a shardhost cluster in one process: it
// registers the runner under a lease, computes the shard assignment from the
// membership, acquires, verifies and releases shard locks in batches, hosts
// the entities of its shards, routes messages to the owner of any shard, hands
// shards over to their new owner on planned moves, and detaches —
// interrupting everything it hosts — before its lease can expire on the
// server.
//
// A program makes a Runner with New (a storage.Store and a Config), registers
// its entity kinds (package entity) and its workers, calls Run, and sends
// with the typed Ask and Tell of the kinds' method references, passing the
// runner as the entity.Sender (Example). A ClientOnly runner — a gateway —
// routes without hosting anything.
//
// # Guarantees
//
// Each is stated in full in docs/guarantees.md; in short:
//
//   - Single owner. A shard is owned only while its lock exists under the
//     runner's lease at the epoch the runner installed, between its
//     ShardAcquired and ShardReleased/ShardLost events; no handler starts
//     after the detach instant, even after a long pause (each message is
//     checked against the monotonic clock before it runs).
//   - What a paused or slow owner can and cannot do. A frozen process may
//     finish a handler it was running, but it cannot start one after the
//     detach instant, cannot have a result acknowledged after its shard
//     moved (the caller gets a *StaleResultError, matching
//     ErrMaybeDelivered), and cannot write under its stale epoch (fenced
//     writes). A detached runner re-attaches only after RecoverWindow of
//     health its probes observed.
//   - Detach before expiry. The runner detaches no later than
//     lease deadline - DetachMargin, the deadline counted from the send time
//     of the last acknowledged renewal on the monotonic clock; on the
//     transition, before any further store call, the owned set is cleared
//     and every shard context is cancelled with cause ErrDetached. It also
//     detaches after StorageErrorThreshold consecutive failures of one kind
//     of store call and on a lost lease.
//   - Health checks follow the detach rule. CheckLiveness reads memory only,
//     never the store: a runner cut off from etcd detaches and stays live.
//     CheckReadiness holds while a hosting runner is attached, not draining
//     and owns every shard the assignment gives it.
//   - One lock, one shard. An owned lock changed behind the runner's back
//     costs that shard only (ShardLost, a WARN naming the key); a lock
//     without a lease is never an owner.
//   - Fresh epochs after re-attach. Locks that survived a detach are
//     rewritten before they are owned again.
//   - No lost request on planned moves. A shard assigned to another live
//     runner moves by handoff: the new owner warms while the old one
//     serves; the old one stops admitting (senders wait), lets running
//     handlers finish, runs the Release hooks and ReleaseShard while its
//     epoch is valid, and moves the lock in one transaction. Shutdown hands
//     every shard off this way first.
//   - Operator drains. While a drain request for its ID exists
//     (cmd/shardhostctl drain), a runner is assigned no shard.
//   - Fast reaction. Lock deletions of assigned shards wake the acquirer
//     through the watch at once.
//   - Reads only what it wrote. Keys and values are decoded strictly;
//     anything else is ignored and logged once per key, or is
//     storage.ErrCorrupt.
//   - A self-repairing registration. A runner rewrites its own record if it
//     is deleted or changed while its lease lives, and never replaces
//     another live process's: a second live process with the same ID fails
//     with ErrDuplicateRunnerID (see Config.ID).
//
// # Entities
//
// An entity lives on the owner of the shard its ID hashes to, is created on
// its first message, runs one message at a time on a goroutine that exists
// only while its mailbox is non-empty, and is passivated after its kind's
// IdleAfter or when MaxResidentEntities is exceeded (least recently used
// first). A handler's context is the shard's context — cancelled with
// ErrDetached, ErrShardMoved or ErrShutdown when the shard leaves, and
// carrying ShardInfo — bounded by the asker's deadline, if it has one, with
// cause ErrCallerDeadline (a remote asker's deadline travels with its
// request; signals carry none). A panic fails its message with an
// *entity.PanicError and restarts the instance. The Reason of a passivated
// entity's Release hook says which passivation it was: ErrIdleExpired or
// ErrEvicted, both matching ErrPassivated; delete state on the first only
// (ExampleErrIdleExpired).
//
// # Sending
//
// Runner.Send states the send contract once: admission, which failures it
// retries, at most once per call, and the idempotent methods that are sent
// again. The typed calls are the common case; the variants keep the contract:
//
//   - through a handle: Runner.Ref, for a sender that calls one entity often
//     (ExampleRunner_Ref);
//   - without waiting: MethodRef.AskAsync and SignalRef.TellAsync over
//     Runner.SendAsync, which report the outcome to a callback
//     (ExampleRunner_SendAsync);
//   - from a handler: SenderFrom(ctx) gives the runner hosting it, no runner
//     kept in a global (ExampleSenderFrom).
//
// docs/guide.md lists the errors a caller can act on.
//
// # Routing and delivery
//
// A runner sends a shard's messages to itself when it owns the shard, else
// one hop to the owner it knows of, else to the runner the assignment
// names, which holds an ask while it acquires the shard. docs/how-it-works.md
// gives the order of the routes, what an ask waits for after its owner
// crashes, and the control loop that acquires, hands off and releases
// shards (work per event proportional to what the event changed; the
// membership-storm rule, whose unit is Config.RebalanceDebounce).
//
// # Sending from a handler
//
// A synchronous Ask or Tell holds the calling handler, and so its entity's
// mailbox, until it returns — after a crash of the target's runner, about
// LeaseTTL plus an acquisition, and a signal handler's context has no
// deadline to cut it short. AskAsync and TellAsync do not hold it (at most
// Config.MaxAsyncSends in flight, not ordered among themselves); through a
// handler's sender (SenderFrom) they keep its trace and baggage, not its
// cancellation: they may outlive the handler. Two
// entities that ask each other synchronously wait for each other until a
// context ends. docs/how-it-works.md says what blocks, and for how long.
//
// # Timers, reminders, singletons, shard workers, remembered entities
//
// Timers (entity.Timer) live in one heap for the whole runner and end with
// the entity's instance; reminders (entity.Reminder) are stored under the
// entity's shard, written fenced by its epoch, fired only by its owner,
// exactly once across planned moves and at least once after a crash
// (Example_timersAndReminders; docs/time.md). A singleton (RunSingleton)
// runs once in the cluster on the owner of SingletonShard(name), a shard
// worker (RunPerShard) once per owned shard, both under the shard's
// context with Work.Epoch as a fencing token; a remembered entity
// (entity.Remembered) is activated without a message by its shard's owner
// until it calls entity.Forget, and Runner.Remember remembers one before
// any message (ExampleRunner_RunSingleton,
// ExampleRunner_RunPerShard, Example_rememberedEntity; docs/always-on.md).
//
// # Starting
//
// Every runner of a cluster must agree on NumShards, and hosting runners on
// the Strategy: the first publishes them in the cluster record and a runner
// that differs fails Run with a *ClusterMismatchError. Run waits for the
// store up to Config.StartTimeout (then ErrStartTimeout), ends at once on
// storage.ErrPermissionDenied, and a hosting runner without a transport
// fails with ErrNoTransport once the cluster holds a runner of another
// process. docs/guide.md has each mistake and what it prints; SECURITY.md
// the etcd roles and TLS.
//
// # Observability
//
// Logs go to Config.Logger with runner=<ID> on every line; a healthy
// runner logs nothing at WARN. Metrics come from Config.MeterProvider and
// traces from Config.TracerProvider, under the scope
// "github.com/shardhost/shardhost"; no metric carries an entity ID.
// docs/observability.md lists every instrument and span attribute (the
// tables TestMetricsDocumented and TestSpanAttributesDocumented check
// against the code) and the log levels; docs/tracing.md says which span a
// runner makes and when. Tracing off (a no-op provider, or none set) costs
// one test per send and no allocation.
//
// DebugHandler returns an http.Handler (mounted like net/http/pprof) that
// shows the runner and the cluster as it sees it, and the same data as JSON
// (DebugState). It has no authentication of its own and shows the cluster's
// topology to whoever reaches it: serve it on an internal address or behind
// the program's own authentication (ExampleRunner_DebugHandler;
// docs/operating.md, SECURITY.md).
//
// # Structure
//
// Package runner is the public face and the wiring; each part with a
// guarantee of its own lives in a package of its own, which this one
// feeds through a small interface and whose public errors and types it
// re-exports. They live under runner/internal/ (so Go lets only this
// package use them): hosting, routing, registration, control, handoff,
// reminders, schedule, tracing, eventhub and debugpage; README's Layout
// table says what each holds, and each one's doc.go states its guarantees.
// What stays here shares the runner's one view of the cluster (clusterView,
// kept by the watches) under its mutex: the watches, gathering each dirty
// shard's state for control.Decide and carrying the decisions out (the
// store calls), and detachment — the detach rule (clear owned, cancel every
// shard context, before any further store call) is detachLocked in
// detach.go, and only there.
//
// # Concurrency
//
// A Runner is safe for concurrent use. Run starts its goroutines (lease
// keeper, membership, lock and handoff watches, control loop, watchdog,
// janitor, record guard, transport server, start-up checks) and waits for
// all of them before returning. Sends may start before Run (they wait for
// it); Ready tells when the runner is up. Shutdown and Close are idempotent
// and may be called from any goroutine. Events are delivered through
// Subscribe without ever blocking the runner.
//
// The transport server bounds what a connection costs: 5 s to complete the
// TLS and HTTP/2 handshake, 5 min without calls, a ping after 30 s of
// silence answered within 10 s, clients pinging at most every 5 s, and at
// most Config.MaxConnections connections at once.
package runner
