// Package runner hosts the shards of a shardhost cluster in one process: it
// registers the runner under a lease, computes the shard assignment from the
// membership, acquires, verifies and releases shard locks in batches, hosts
// the entities of its shards, routes messages to the owner of any shard, hands
// shards over to their new owner on planned moves, and detaches —
// interrupting everything it hosts — before its lease can expire on the
// server.
//
// # Guarantees
//
//   - Single owner. A shard is owned by a runner only while its lock exists
//     under the runner's lease at the epoch the runner installed, and only
//     between its ShardAcquired and ShardReleased/ShardLost events. Ownership
//     is installed only while attached and before the detach instant; no
//     handler starts after the detach instant, even after a long pause (each
//     message is checked against the monotonic clock before it runs).
//   - What a paused or slow owner can and cannot do. A process frozen
//     (SIGSTOP, a long GC pause, a stalled VM) while a handler runs cannot
//     be stopped from finishing that handler after it resumes, and the
//     handler's effects stay in its memory. But it cannot start a handler
//     after the detach instant (checked before each message on the
//     monotonic clock); it cannot have a result acknowledged after its
//     shard moved — when an ask's handler returns, the owner checks the
//     detach instant again and that the shard is still hosted at the
//     handler's epoch (or being released with its lock kept until the
//     handler returns; a signal's handler, whose result goes to no one, is
//     checked for the latter only, without a clock read), and withholds
//     the result otherwise: the caller gets a *StaleResultError
//     (errors.Is ErrMaybeDelivered), the message is counted as dropped
//     (reason stale_result) and the instance is
//     discarded; and every reply carries the epoch its handler ran under,
//     so a sender that has already seen a newer epoch of the shard (lock
//     watch, earlier replies) withholds a result from an owner whose lease
//     has ended, closing the gap between the owner's check and its socket
//     write (a live owner moves a shard only after its drain, in which
//     every handler returned and every remote answer was written, so its
//     older-epoch results stay acknowledged: no request is lost on a
//     planned move; likewise after a clean Shutdown, which marks its
//     record Stopped just before it revokes its lease — never after a
//     detach under that lease — so a reply still in flight when its lease
//     ends is acknowledged too); and it cannot write under its stale epoch (fenced
//     writes). A detached runner re-attaches only after RecoverWindow of
//     health its probes observed: a pause between two probes starts the
//     window over.
//   - Detach before expiry. The runner detaches no later than
//     lease deadline - DetachMargin, where the deadline is the send time of
//     the last acknowledged renewal + the granted TTL (monotonic clock). On
//     the transition, before any further store call, the owned set is
//     cleared and every shard context is cancelled with cause ErrDetached.
//     It also detaches after StorageErrorThreshold consecutive failures of
//     one kind of store call, on a lost lease, and (optionally) on a
//     keep-alive failure streak.
//   - Health checks follow the detach rule. CheckLiveness
//     (LivenessHandler) reads memory only, never the store: a runner cut
//     off from etcd, or facing a slow one, detaches and stays live —
//     detaching, not a restart, answers a slow or absent store (a
//     restarted process would only wait for its old lease, and every
//     runner restarting through an etcd leader election would be a
//     restart storm). It fails once Run has ended other than by Shutdown
//     (a fatal error such as ErrDuplicateRunnerID or ErrStartTimeout,
//     Close, Run's context ended), or when the runner's state stays
//     locked for 2 s (stuck). CheckReadiness (ReadinessHandler) holds
//     while a hosting runner is attached, not draining, and owns every
//     shard an assignment computed with it as a member gives it; never
//     before Run, while starting, detached, draining (Shutdown's
//     handoffs, an operator's drain request) or stopping — from the
//     moment Shutdown is called. A ClientOnly runner (a gateway) holds no
//     lease and never attaches: it is ready once it has checked the
//     cluster record and listed the runners, while its membership view is
//     current and a hosting runner is registered. Its view is current
//     while its last probe of the store (a linearizable read of the
//     cluster record every ProbeInterval, bounded by OpTimeout) succeeded
//     — a watch cut off from etcd stalls without an error — and its
//     runners' watch has not failed since the last good listing. Both
//     handlers answer GET and HEAD with 200 or 503 and a JSON HealthCheck
//     (ok, runner, phase, reason, owned, assigned, assigned_owned) saying
//     why.
//   - One lock, one shard. An owned lock changed behind the runner's back
//     (deleted, rewritten under its lease, taken by another lease, replaced
//     by a key without a lease) costs that shard only: its context is
//     cancelled (ErrShardMoved) before anything else, it is dropped
//     (ShardLost) with a WARN naming the key, and the runner stays attached
//     with every other shard. If still assigned here, the shard is owned
//     again at a new epoch once the lock can be taken: a lock left under the
//     runner's lease is rewritten, a deleted one acquired, one held by
//     another lease waited for. A lock without a lease is never an owner
//     (it cannot expire): the assignee overwrites it, conditional in the
//     same transaction on it still having no lease, and logs a WARN.
//   - Fresh epochs after re-attach. Locks that survived a detach under the
//     same lease are rewritten (new epochs) before they are owned again; a
//     lost lease is replaced by a new one and the runner re-registers.
//   - No lost request on planned moves. A shard assigned to another live
//     runner moves by handoff: the new owner records the handoff, warms (the
//     WarmShard hook and the entities' Warm hooks for the old owner's hot
//     set) while the old owner serves, then marks itself ready; the old owner
//     stops admitting (senders wait), lets the handlers running finish —
//     asks queued behind them go back to their senders undelivered, so a
//     drain waits for one handler per entity, not for a queue; signals
//     already accepted run here — runs the entities' Release hooks and
//     ReleaseShard while its epoch is valid, and moves the lock in one
//     transaction. Waiting and returned senders are then told the new
//     owner and retry there. Shutdown hands every shard off this way
//     first (bounded by its context), then releases the rest plainly,
//     publishes its record Stopped (weight 0, draining) and revokes its
//     lease: senders acknowledge the replies of its drained handlers that
//     reach them after that (see "What a paused or slow owner can and
//     cannot do").
//   - Operator drains. While a drain request for its ID exists
//     (storage.KeyspaceDrains, written by cmd/shardhostctl drain), the
//     runner publishes its record with Draining set, weight kept; every
//     runner assigns a draining runner no shard, so its shards leave by
//     handoff. The request has no lease: a restarted, re-registered or
//     re-attached runner is drained again until the request is deleted.
//   - Fast reaction. Lock deletions of assigned shards wake the acquirer
//     through the watch at once; shards held by a dead incarnation are
//     retried every AcquireRetryInterval within AcquireRetryWindow.
//   - Reads only what it wrote. Every key and value read from the store is
//     decoded strictly: shard keys in canonical decimal (no sign, no leading
//     zero) below NumShards, values with their required members, typed and
//     valid. Anything else is ignored and logged once per key at WARN (a
//     corrupt lock value still counts by its lease); a runner record without
//     a lease is no member. Checkpoints that lack what a writer stores fail
//     with storage.ErrCorrupt instead of restoring an empty state.
//   - A self-repairing registration. The runner watches its own record,
//     runners/{ID}. Deleted or changed while its lease lives (garbage, a
//     wrong address, a write under its lease), it is rewritten, conditional
//     on the revision seen, with a WARN naming the key. A registration never
//     replaces another process's valid record: after a crash the restarted
//     process waits for the old lease to expire (at most its TTL + 2 s); a
//     record still renewed after that is a second live process with the same
//     ID, and Run fails with ErrDuplicateRunnerID (ERROR). If two live
//     processes both wrote the record, both log an ERROR and the one that
//     started first keeps the ID; the other drops its shards, revokes its
//     lease and returns ErrDuplicateRunnerID. See Config.ID.
//
// # The control loop
//
// Each runner's control loop is a controller over a work queue keyed by
// shard, so its work per event is proportional to what the event changed,
// not to the size of the cluster:
//
//   - Events become dirty shards in one place: a lock or handoff record
//     that concerns this runner changed (its notices, the handoff records
//     addressed to it, a member's lease that ended, its own calls'
//     results), an operation on a shard finished, a per-shard timer fired
//     (acquire retry, HandoffWait, a takeover's back-off). Changes of
//     other shards do not reach it (with Config.FullLockView, every lock
//     reaches it, and other runners' locks update its routing view only).
//   - A round decides each dirty shard once, with one small function per
//     concern: acquire it (free, or held by a dead incarnation), take it
//     over by handoff (held by a live runner), abandon a takeover, hand it
//     off or release it (owned, assigned elsewhere), delete an orphaned
//     lock or a stale handoff record of ours.
//   - Only a new assignment is O(shards), once: the strategy runs (outside
//     the runner's lock, and only when the runners or weights changed), and
//     the shards it gives to or takes from this runner are marked, with
//     everything this runner is busy with. Attach, a lock listing and the
//     periodic resync (ResyncInterval) mark every shard.
//   - Decisions are carried out batched: acquisitions, releases, transfers
//     and handoff records each take one transaction per 64 shards
//     (storage.MaxShardsPerTxn). Takeovers started in one round write their
//     warming records together, warm concurrently (16 shards at a time) and
//     mark themselves ready together; cutovers decided in one round drain
//     concurrently and move their locks in batched transfers.
//
// Membership storms: after a membership change a runner starts no new move
// (acquisition, takeover, release) until it has recomputed the assignment
// on a view that has been quiet for 2 x RebalanceDebounce — 5 x for a runner
// that owns nothing yet, which has nothing to hand over — or, in a long
// storm, 10 x RebalanceDebounce after the first change not acted on (50 x
// for a runner that owns nothing), so it never hands
// shards towards a runner while its own view is still changing; runners
// starting together therefore take their final shards directly. A runner
// that owns nothing but joins a settled cluster — every other member
// started at least max(1 s, 10 x RebalanceDebounce) before it (with
// Config.FullLockView: every shard is locked by a live runner) — follows
// the owners' rule (one debounce): no cold start is under way, and it can
// only take shards by handoff. An
// isolated departure (a runner's lease ended after a quiet period) is acted
// on at once: its shards are free.
//
// # Entities
//
// Register kinds (package entity) on every runner; send with the typed Ask
// and Tell of method references, passing the runner as the entity.Sender.
// An entity lives on the owner of the shard its ID hashes to, is created on
// its first message, runs one message at a time on a goroutine that exists
// only while its mailbox is non-empty, and is passivated after its kind's
// IdleAfter or when MaxResidentEntities is exceeded (least recently used
// first). A handler's context is the shard's context — cancelled with
// ErrDetached, ErrShardMoved or ErrShutdown when the shard leaves, and
// carrying ShardInfo — bounded by the asker's deadline, if it has one, with
// cause ErrCallerDeadline (a remote asker's deadline travels with its
// request; signals carry none): whichever ends first cancels the handler,
// with its own cause. A panic fails its message with an *entity.PanicError
// and restarts the instance. The handler's context also carries the
// entity's runtime (entity.RuntimeFrom): its timers and reminders.
// The Reason of a passivated entity's Release hook says which of the two
// passivations it was: ErrIdleExpired (no message for IdleAfter) or
// ErrEvicted (the resident cap), both matching ErrPassivated; delete state
// on the first only (see the example of ErrIdleExpired).
//
// # Timers and reminders
//
// Timers (entity.Timer) live in the runner's memory, in one heap for the
// whole runner (internal/schedule: no goroutine or runtime timer each).
// A timer's tick enters the entity's mailbox like a signal, one at a time
// with its other messages, and does not count as activity for idle
// passivation (unless the kind says entity.TicksAreActivity). Timers end
// with the entity's instance: when it passivates, is discarded after a
// panic, or its shard leaves the runner (moved, released, lost, detached).
//
// Reminders (entity.Reminder) are durable: each is a record
// reminders/{shard}/{kind/id}/{name} written — registered, replaced or
// cancelled — in one transaction fenced by the shard's epoch, so a handler
// whose shard moved cannot register one (its error matches ErrShardMoved
// or storage.ErrFenced). A runner's writes of a shard's state are also
// ordered (storage.StateOrderKey): one that failed as unavailable and that
// etcd applies later cannot undo a later one (a cancelled reminder put
// back, progress going backwards). The owner of a shard loads its reminders when it
// acquires the shard (batched, in the background: the shard's messages
// never wait for it) and fires each due tick by delivering it to the
// entity, activating it if it is not resident. What is guaranteed:
//
//   - Fired by the owner only. A tick passes the same start gate as every
//     handler: the shard still hosted at the epoch the reminder was loaded
//     under, the detach instant not passed. A tick counts as fired when its
//     handler starts; a handler error is logged like a signal's.
//   - Exactly once across planned moves. When a shard is handed off or
//     released with its entities drained, the old owner writes, fenced by
//     its epoch, before the lock moves or is deleted, a final record of
//     which ticks fired (reminders/{shard}); the new owner rewrites it as
//     not final, fenced by its own epoch, before it fires anything, and
//     continues with the next tick of each reminder. A cutover whose record
//     cannot be written is given up and tried again (the shard keeps
//     serving here); a plain release whose record cannot be written
//     publishes RemindersUnrecorded (the next owner fires at least once).
//   - At least once after an unplanned loss (a crash, a detach, a lost
//     lock): the new owner fires the ticks the store cannot show to have
//     fired, marked ReminderTick.Redelivered, with their number; a
//     periodic reminder's ticks due meanwhile are one fire with their count
//     in Missed (entity.FireOnce), or skipped (entity.Skip). A crashed
//     owner's reminders fire again as soon as the shard is re-owned (about
//     LeaseTTL after the crash) and its record is loaded. Reminders'
//     due times are wall times: the runners' clocks are assumed to agree
//     within reminders.MaxClockSkew (1 s), ticks due that close after an
//     acquisition are marked Redelivered too.
//   - No write per tick, no herd. A periodic reminder's next due time
//     follows from its first due time and period; only registration,
//     cancellation, the deletion of a one-shot reminder that fired and the
//     progress record of a planned move write. Reminders already due when
//     a shard is loaded fire through a queue drained at
//     ReminderCatchUpRate per runner; reminders due later fire on time.
//   - Fired again once the store answers: after a store outage (or writes
//     failing, late or refused), while the shard stays owned with no
//     cutover under way, every reminder fires within one period plus
//     1 s + OpTimeout (its set's pending store call is retried at most a
//     second apart, and at most a read and a rewrite stand between it
//     and firing; runner/internal/reminders states the rule and why it
//     holds). A tick also waits for its entity's running handler and,
//     after a failed activation, the activation's back-off. A shard
//     whose reminders could not fire for 30 s anyway is reloaded from
//     the store, logged (WARN) and counted (sharding.reminder_reloads).
//   - Bad records stay contained: a stored reminder that does not decode,
//     or names a kind or reminder this runner does not have, is logged
//     once with its key (WARN), counted (sharding.reminders_corrupt) and
//     skipped — one naming an unknown kind is tried again every minute (a
//     rolling upgrade may register it) —; the shard's other reminders fire.
//
// # Singletons, shard workers and remembered entities
//
// A shard worker (RunPerShard) runs once per owned shard; a singleton
// (RunSingleton) once in the cluster, on the owner of the shard
// SingletonShard(name) maps to. Both are registered on every runner
// before Run and run under the shard's context. What is guaranteed:
//
//   - Never two at once among instances that honour their context. A
//     worker counts in its shard's drain like a running handler (the drain
//     lets the handlers running finish first — they may wait for what a
//     worker produces — then cancels the workers): a handoff
//     moves the lock only after the old owner's instance returned (if it
//     does not return within the DrainTimeout the cutover is given up and
//     tried again; the shard keeps serving here), a plain release keeps
//     the lock until it returns, and the new owner starts its instance
//     after the handoff completed (after warming). At the detach instant
//     its context ends with ErrDetached like every handler's; an instance
//     that ignores it may outlive the lease (a handler's result would be
//     withheld; a worker's outside writes cannot be), which is what
//     Work.Epoch is for: the shard's ownership epoch, a fencing token the
//     outside system checks (refusing an epoch older than the newest seen).
//   - Running again after a crash as soon as the shard is re-owned (about
//     LeaseTTL after it), after a planned move once the handoff completed.
//   - Failures contained: an error or a panic restarts the worker after a
//     back-off (100 ms doubling to 30 s); returning nil ends it for this
//     ownership of the shard. WorkerStarted and WorkerStopped events, and
//     a singleton's record singletons/{shard}/{name} (runner, since when),
//     written fenced when it starts (and again, with a back-off, after a
//     write that failed, while the runner owns the shard), say where each
//     runs.
//
// A remembered entity (a kind with entity.Remembered) is kept running by
// its shard's owner:
//
//   - Recorded once: its first activation on a shard where it is not
//     remembered yet queues a marker remembered/{shard}/{kind/id}, written
//     fenced by the epoch, batched with the other shards' puts; a message or an activation
//     of an entity already remembered writes nothing. (An entity activated
//     and crashed before its marker landed is not remembered.)
//   - Activated without a message after its shard's state is loaded (after
//     a handoff's cutover, a takeover after a crash, a cold start), through
//     a queue drained at RememberedStartRate per runner, and again after
//     its instance panicked or its Activate failed, after a back-off (100 ms
//     doubling to 30 s). It runs under the single-writer rule of every
//     entity: on the shard's owner only, never on two runners at once.
//   - Never passivated (idle or by the resident cap) until it calls
//     entity.Forget, which deletes its marker (fenced); a later activation
//     remembers it again.
//   - Remembered without a message by Runner.Remember (entity.Remember from
//     a handler): routed like a call to the shard's owner, which activates
//     the entity and returns once the marker that activation queued is
//     stored — the same fenced, batched write.
//
// # Routing and delivery
//
// Send's contract — admission, routing, which failures it retries, at most
// once per call, and the idempotent methods that are sent again — is
// stated once, on Runner.Send. A ClientOnly runner routes without hosting
// anything.
//
// A runner watches the membership and its own keys, not every shard's
// lock (Config.FullLockView keeps the lock watch, for a gateway that
// wants it). It sends a shard's messages to, in order: itself when it
// owns the shard; the runner it just handed the shard to; the holder of
// the lock when it knows it (a shard it owns, acquires or takes over); the
// runner that last answered a send of the shard, or that another runner
// named in a "not the owner" answer (a bounded table of hints); for a
// shard the last assignment change moved, its previous assignee while it
// is still a member (and has been one for 5 x RebalanceDebounce: before,
// it owned nothing), for as long as a planned move may take
// (WarmTimeout + DrainTimeout) — it owns the shard until its handoff, and
// a send never waits on a new owner still warming; else the runner the
// assignment names — every runner, ClientOnly ones too, computes it from
// the membership, with the strategy the cluster record names. In a
// settled cluster the assignee is the owner: one hop. While a shard
// moves, a runner that does not own it answers "not the owner" naming
// the owner it knows of (one more hop, remembered as a hint), and the old
// owner, once it has handed the shard off, names the new one.
//
// A Ref (Runner.Ref) is a sender's handle on one entity: a call through it
// keeps Send's contract whole and, while the entity is resident here,
// skips the hash of its ID, the lookup of its kind and entity, and the
// shard's lock. Its contract — when it goes by ID instead — is stated on
// Ref.
//
// After the owner of a shard crashes, an ask to it waits, in turn: (1) for
// the owner's lease to expire — about LeaseTTL after its last renewal, when
// etcd deletes its record and its locks — while attempts to reach it fail
// before sending (a refused port at once; a connection that does not come,
// as to a black-holed host, within ConnectTimeout) and are retried with
// back-off, at most 250 ms (±50 %) apart, and at every routing change;
// (2) for another runner to acquire the shard: the membership watch shows
// the record gone, which every runner takes as the crashed runner's locks
// gone too (one revision deletes both), and its assignee acquires at once.
// A wait for a connection to the gone owner is abandoned as soon as the
// shard's route changes — never sent — and the back-off restarts from
// 5 ms. The ask then goes to the shard's new assignee, which holds it
// (parks it) while it acquires the shard and delivers it the moment the
// shard is installed there. The assignee answers "not the owner" instead
// (nothing ran; retried at the next back-off step, following its hint)
// when it cannot serve the shard: not acquiring it (the shard went
// elsewhere, or its own membership view lags the sender's by more than a
// second — the ask names the revision of the sender's view, and an
// assignee that has not seen as much yet waits up to a second for its
// watch to catch up before it decides), its lock held by another live
// runner, its acquisition's retry window ended, a detach or a stop, 256
// asks already parked on the shard or MaxWaitingSends on the runner; and
// after AcquireRetryWindow, or 50 ms before the ask's deadline. An ask
// parked at an assignee that crashes meanwhile fails like any ask in
// flight. An ask already sent to the crashed owner is not withdrawn (it
// may have run): it fails with ErrMaybeDelivered when its connection
// breaks (at once for a closed port, after gRPC's keepalive — up to about
// 12 s — for a black-holed host) or when its context ends. Figures:
// BENCHMARKS.md, "first ask after a crash".
//
// # Sending from a handler
//
// A handler (or lifecycle hook) finds the runner hosting it with
// SenderFrom(ctx) — no runner kept in a global — and sends to other
// entities with it like any caller. What blocks, and for how long:
//
//   - Ask and Tell (Send) hold the calling handler, and so its entity's
//     mailbox, until they return: a Tell until the target's owner accepted
//     the message in its mailbox, an Ask until the target's handler
//     answered (after what was queued before it). A full mailbox fails at
//     once (entity.ErrMailboxFull).
//   - While the target's shard has no live owner they retry, until the
//     calling context ends. After a crash of the target's runner that is
//     until its lease expires and another runner takes the shard: about
//     Config.LeaseTTL (5 s by default) plus an acquisition. The handler's
//     context bounds it by the asker's deadline, if any; a signal
//     handler's context has none, so a Tell or Ask from a signal handler
//     waits for the whole failover — unless the handler bounds it
//     (context.WithTimeout).
//   - SendAsync (entity.MethodRef.AskAsync, entity.SignalRef.TellAsync)
//     returns at once: a goroutine of the runner sends, bounded by its
//     timeout, and reports the outcome to a callback; the handler and its
//     mailbox go on. Asynchronous sends are not ordered among themselves;
//     at most Config.MaxAsyncSends are in flight.
//   - An entity that asks itself, or two that ask each other
//     synchronously, wait for each other until a context ends: use
//     SendAsync (or a Tell that does not wait for the answer) for such
//     cycles.
//
// # Starting
//
//   - The cluster record. Every runner of a cluster must agree on
//     NumShards, and hosting runners on the Strategy. The first runner to
//     start publishes them in the cluster record ({namespace}/cluster,
//     written once, conditionally); every later one compares its own
//     before it registers (hosting) or routes (client-only), and Run fails
//     with a *ClusterMismatchError naming both values — and so do sends —
//     instead of asks waiting for owners that never come.
//   - A store that cannot be reached at start delays the start; the first
//     failure is logged at WARN with the store's endpoints and the error —
//     for etcd, the connection's own (connection refused, a DNS or TLS
//     failure), not the call's "context deadline exceeded" — and a hint at
//     StartTimeout, then one WARN a minute; Status().NotStarted and the
//     debug page say "not started: etcd at ... unreachable since ...".
//     Ready is closed once the runner is up (hosting: registered;
//     client-only: the runners listed); Config.StartTimeout (default
//     DefaultStartTimeout, 1 min; WaitForever: no bound) ends Run with
//     ErrStartTimeout and the last failure when it is not up in time, so a
//     misconfigured process exits and its supervisor says so.
//   - A store that refuses the runner's credentials or permissions (with
//     etcd: a wrong or changed password, a role without readwrite on the
//     namespace's prefix; storage.ErrPermissionDenied) ends Run at once
//     with an error matching it, logged at ERROR. Refused while running,
//     the runner detaches (its renewals fail) and stays detached until the
//     permission is back: each refused call — its probes (a renewal, or a
//     read once the lease is gone) when the role lost read too, its
//     re-attach attempts (one per RecoverWindow of health) when it can
//     still read — is counted in sharding.storage_errors
//     (error.type=permission_denied) and logged at ERROR, the first at once
//     and then once a minute with the count. A
//     client-only runner only reads: a role granting read on the prefix is
//     enough for it (started before any hosting runner published the
//     cluster record, it waits for one, logged like an unreachable store
//     and bounded by StartTimeout).
//     SECURITY.md has the etcdctl lines.
//   - A hosting runner serves its shards to other runners only over its
//     transport (Config.ListenAddr, Address). Without one it is meant for a
//     cluster that lives in one process (tests, a single process): Run
//     fails with ErrNoTransport, giving its shards up, as soon as the
//     cluster holds a runner of another process, and senders routing to
//     such an owner get ErrNoTransport naming it. A transport listening
//     beyond loopback without TLS is refused by New
//     (*InsecureTransportError) unless Config.AllowInsecureTransport says
//     so.
//
// # Logs
//
// Logs go to Config.Logger with runner=<ID> on every line. A healthy
// runner is quiet: starting, serving, handing shards off and a graceful
// Shutdown log nothing at WARN (the lease a Shutdown revokes is not a lost
// lease, and no Detached event is published for it). INFO: lifecycle, and
// one "shard ownership changed" line per control round in which shards
// moved, with the counts acquired, by_handoff, released, handed_off, lost
// and owned. WARN: degraded (store failures at start — the first with the
// store's endpoints, then once a minute —, keep-alive failure streaks,
// detaches, locks lost, damaged records, a signal handler's error: at most
// one line per kind and signal every 10 s, with the count not logged).
// ERROR: an operator must act (a configuration that differs from the
// cluster's, a duplicate runner ID, a hosting runner without transport
// among other processes, not ready within StartTimeout, the store refusing
// the runner's credentials or permissions, handlers that ignore their
// cancelled context).
//
// # Metrics
//
// A runner creates its instruments once, in New, from Config.MeterProvider
// (default otel.GetMeterProvider()) under the instrumentation scope
// "github.com/shardhost/shardhost". Every data point carries the attribute
// runner (Config.ID); the attributes below come on top; none carries an
// entity ID. Units follow OpenTelemetry: s for seconds, {curly} for counted
// things (a Prometheus exporter names them sharding_shards_owned,
// sharding_acquire_latency_seconds, sharding_detaches_total, ...).
//
//	name                                     kind              unit       attributes    meaning
//	sharding.detached                        gauge             {runner}   -             1 while the runner is detached (owns nothing, probes the store), else 0; summed over runners: how many are detached
//	sharding.detaches                        counter           {detach}   reason        detach transitions; reason: lease deadline reached, keep-alive failure streak, storage error, lease lost, owned lock lost, manual
//	sharding.lease_deadline_lag              gauge (observed)  s          -             lease deadline minus now; the runner detaches when it falls to DetachMargin
//	sharding.lease_keepalive_failures        counter           {renewal}  -             failed lease renewals
//	sharding.lease_keepalive_failure_streak  gauge             {renewal}  -             consecutive failed lease renewals (0 when healthy)
//	sharding.storage_errors                  counter           {call}     error.type    failed list, acquire, verify, release and watch calls (StorageErrorThreshold in a row of one kind detaches), refused starts, and a detached runner's refused probes and re-attaches; error.type: permission_denied (the store refused the runner's credentials or permissions: an operator must act), unavailable, other
//	sharding.shards_owned                    gauge             {shard}    -             shards owned by the runner
//	sharding.acquire_latency                 histogram         s          -             duration of one batched acquire call (up to 64 shards)
//	sharding.acquire_retry_attempts          counter           {attempt}  -             acquire attempts on shards held by a dead incarnation, after the first
//	sharding.acquire_retry_window_exhausted  counter           {shard}    -             shards whose AcquireRetryWindow ran out (retried on the lock's deletion or the resync)
//	sharding.locks_lost                      counter           {shard}    -             owned locks deleted, rewritten or taken behind the runner's back (each costs its shard only)
//	sharding.handoffs                        counter           {handoff}  reason        handoffs by outcome; reason: completed, aborted
//	sharding.handoff_duration                histogram         s          phase         handoff duration by phase: warm and total (new owner), drain and cutover (old owner)
//	sharding.cutover_buffered                counter           {message}  -             sends held while their shard cut over to its new owner
//	sharding.cutover_rejected                counter           {message}  -             sends refused (retryable NotOwner) because CutoverWaiters were already waiting
//	sharding.entities_active                 gauge (observed)  {entity}   -             resident entities
//	sharding.entity_activations              counter           {entity}   -             entity instances created
//	sharding.entity_passivations             counter           {entity}   -             entities passivated (idle after IdleAfter, or evicted)
//	sharding.entity_evictions                counter           {entity}   -             entities passivated because MaxResidentEntities was exceeded
//	sharding.mailbox_rejections              counter           {message}  -             messages refused by a full mailbox (entity.ErrMailboxFull)
//	sharding.handler_duration                histogram         s          -             handler run time, sampled 1 in 64 messages per entity
//	sharding.handler_panics                  counter           {message}  -             handler panics (message failed with *entity.PanicError, instance discarded)
//	sharding.signal_failures                 counter           {message}  kind, method  signal handlers that returned an error (also logged at WARN, rate-limited)
//	sharding.messages_dropped                counter           {message}  reason        messages dropped; reason: shard_left (a signal whose shard left before it ran), stale_result (a result withheld: its handler finished after the shard left, or its reply came from an epoch older than one already seen)
//	sharding.messages_retried                counter           {attempt}  -             send attempts retried (not delivered: not owner, moving, unreachable, no owner yet; idempotent calls after ErrMaybeDelivered)
//	sharding.timers                          gauge (observed)  {timer}    -             running entity timers (in memory)
//	sharding.reminders                       gauge (observed)  {reminder} -             reminders loaded for the shards the runner owns
//	sharding.reminder_fires                  counter           {tick}     -             reminder ticks fired (their handler started)
//	sharding.reminder_fire_lag               histogram         s          -             how late reminder ticks fired after their due time (ticks on schedule; catch-up fires after a load are not counted)
//	sharding.reminder_writes                 counter           {write}    op            store writes of reminders; op: register, cancel, delete (a one-shot that fired), progress (which ticks fired, at a planned move, and its rewrite by the next owner), remember and forget (remembered entities' markers)
//	sharding.reminders_corrupt               counter           {record}   -             stored reminder and remembered-entity records skipped: undecodable, or naming a kind or method not registered on the runner (logged at WARN with the key)
//	sharding.reminder_reloads                counter           {shard}    cause         shards whose reminders could not fire for 30 s although owned here and not in a cutover, reloaded from the store (logged at WARN with the shard and cause); cause: load, reload, rewrite (a final progress record not rewritten yet), fenced; 0 while the liveness rule holds: alert on any increase
//	sharding.reminders_unrecorded            counter           {shard}    -             shards released plainly without their reminders' progress recorded (a RemindersUnrecorded event each): the next owner fires their ticks at least once, not exactly once
//	sharding.remembered                      gauge (observed)  {entity}   -             remembered entities of the shards the runner owns
//	sharding.remembered_restarts             counter           {restart}  -             remembered entities activated again after their activation failed or their instance panicked
//	sharding.worker_restarts                 counter           {restart}  -             shard workers and singletons restarted after an error or a panic
//
// # Traces
//
// A runner traces the calls it sends and handles with OpenTelemetry: spans
// from Config.TracerProvider (default otel.GetTracerProvider()) under the
// scope "github.com/shardhost/shardhost", and each call's trace context
// and baggage carried to the runner that handles it in the request's
// headers, written and read by Config.Propagator (default
// otel.GetTextMapPropagator(); set W3C propagation.TraceContext{} and
// propagation.Baggage{} there or globally). The spans of one ask:
//
//   - client "{kind}/{method}" on the sender: the whole Send, every
//     attempt, local or remote, with a shardhost.retry event for each
//     attempt that failed before any handler ran it and was tried again
//     (its reason the attempt's error), and the outcome as the span's
//     status: an error status with the error's text and error.type;
//   - server "{kind}/{method}" on the runner each remote attempt reached,
//     a child of the client span ("unknown kind or method" for a kind or
//     method that runner does not know: a peer cannot multiply span
//     names; its text is in rpc.service and rpc.method);
//   - internal "handle {kind}/{method}" where the handler runs, a child
//     of the server span (of the client span when the entity is local),
//     with "activate {kind}" as its child when the message activated the
//     entity. The handler's context carries this span (and the asker's
//     baggage): the calls it makes — to other entities, over HTTP or gRPC
//     — join the trace, and the runner's log records made for the handler
//     (a panic, a withheld result, a failed signal) carry trace_id and
//     span_id.
//
// A signal's handler span starts a new trace, linked to the span that sent
// it (the sender's client span, or the server span of its hop): its sender
// has its answer before the handler runs. A timer tick's span starts a new
// trace linked to the span of the handler that started the timer. A
// reminder tick's span, and a remembered entity's activation without a
// message, start new traces without a link: a reminder is stored, the span
// context that registered it is not. A SendAsync (AskAsync, TellAsync)
// takes no context: its client span starts a new trace.
//
// The lifecycle work a user waits on is traced too, each operation a root
// span of its own (internal; no request causes it) on the runner doing it:
//
//   - "handoff warm" on the new owner, one per shard it takes over in a
//     planned move: from the takeover's start to the lock's arrival, with
//     events shardhost.handoff.warming (its record written),
//     shardhost.handoff.warmed (the WarmShard and Warm hooks returned;
//     shardhost.handoff.warm_timeout instead when WarmTimeout cut them)
//     and shardhost.handoff.ready. The hooks run under it: their calls
//     join its trace, and a Warm hook's Restore is an event of it;
//   - "handoff release" on the old owner, one per shard it hands off: from
//     admission stopped (event shardhost.handoff.admission_stopped) through
//     shardhost.handoff.drained (running handlers finished, shard workers
//     and singletons stopped, the entities' Release hooks — their
//     checkpoints — run), shardhost.handoff.release_shard (the
//     ReleaseShard hook, when configured) and
//     shardhost.handoff.progress_recorded (the reminders' progress saved)
//     to the lock moved to the new owner;
//   - "detach": from the detach (its reason, the lease deadline, the
//     shards it interrupted) to the moment their last handler returned
//     (event shardhost.detach.entities_stopped; at most DrainTimeout), so
//     its duration is how long the entities took to stop; an error status
//     whose error.type is the reason;
//   - "reattach": one re-attachment (events shardhost.reattach.registered
//     and, under a lease that survived, shardhost.reattach.epochs_bumped),
//     linked to the last detach span, naming the lease and the shards kept
//     at new epochs (the others come back through the control loop, as
//     acquisitions).
//
// The two sides of a handoff carry the shard, their own epoch and the
// peer's (shardhost.peer, shardhost.peer.epoch): the warm span's epoch is
// the release span's peer.epoch and the other way round. A handoff that
// did not move the lock ends with shardhost.outcome aborted and an error
// status whose error.type says why: detached, shutdown, abandoned
// (reassigned, or the old owner changed or rewrote its lock),
// warm_timeout, record_failed (new owner); handlers_running,
// progress_unrecorded, transfer_failed, transfer_unknown, lock_lost,
// detached (old owner). A warm span ends with outcome acquired when the
// old owner's lease ended first and the new owner took the lock. An
// activation span says whether the instance was warmed
// (shardhost.activate.warmed) and, when its Activate hook restores its
// checkpoint with the context it was given, has a shardhost.restore event
// (found, bytes). A message that waits at the old owner for a cutover adds
// a shardhost.cutover_wait event to the span its context carries (the
// sender's client span, or the server span of its hop).
//
// Volume: a membership change moves many shards at once, and each moving
// shard makes one span on each side; they are root spans, so the
// provider's sampler (a TraceIDRatioBased one, say) keeps the same share
// of them as of requests' traces. A detach or re-attachment is one span
// whatever the number of shards (the first 1024 shard IDs listed,
// shardhost.shard_count has the number).
//
// Tracing is off with a noop.TracerProvider, and with the global provider
// while no program has set one, or has set a no-op one
// (otel.SetTracerProvider with another turns it on for runners already
// made): Send and delivery then test one switch and allocate nothing more
// (BENCHMARKS.md, "Tracing"); so do the handoffs, detaches and
// re-attachments. While it is on, attributes are built only for spans
// that record (sampled in); a sampler sees none at the start of a span.
// Use a batching span processor (sdktrace.WithBatcher), as exporters
// should be: the lifecycle spans of a handoff or a detach end while the
// runner holds its lock, so a synchronous processor (sdktrace.WithSyncer)
// whose exporter blocks would hold up routing and the control loop for as
// long as the export takes.
//
// Span attributes (OpenTelemetry's RPC conventions, shardhost's own under
// shardhost.; entity IDs are attributes of spans, never of metrics):
//
//	attribute                  spans                          meaning
//	rpc.system                 client, server, handler        "shardhost"
//	rpc.service                client, server, handler, act.  the entity kind
//	rpc.method                 client, server, handler        the method, signal, timer or reminder handler
//	shardhost.entity           client, server, handler, act.  the entity ID
//	shardhost.shard            client, server, handler, act., warm, release, cutover wait  the entity's shard; the shard handed off
//	shardhost.runner           every span                     the runner that recorded the span (Config.ID)
//	shardhost.one_way          client, server                 true for a signal
//	shardhost.attempts         client                         attempts made (local or remote), retries included
//	shardhost.owner            client, retry event            the runner of the last attempt ("" when no owner was known)
//	server.address             client                         host of the owner's transport address (last attempt, remote)
//	server.port                client                         port of the owner's transport address
//	shardhost.sender           server                         the sending runner
//	shardhost.epoch            server, handler, warm, release  the shard's ownership epoch the handler ran under; the epoch the new owner got (warm), the one released (release)
//	shardhost.tick             handler                        timer or reminder, for a tick's handler
//	shardhost.activate.reason  activation                     new, handoff, restart or remembered (entity.ActivateReason)
//	shardhost.activate.warmed  activation                     true when the instance was warmed (Warm hook) during the handoff
//	shardhost.restore.found    restore event                  whether the entity had a checkpoint
//	shardhost.restore.bytes    restore event                  the size of the checkpoint restored
//	shardhost.peer             warm, release, cutover wait    the other runner of the handoff: the old owner (warm), the new owner (release, cutover wait)
//	shardhost.peer.epoch       warm, release                  the peer's epoch: the old owner's (warm), the new owner's once the lock moved (release)
//	shardhost.outcome          warm, release                  cutover, aborted, or acquired (warm: the old owner's lease ended first)
//	shardhost.warmed           warm                           entities warmed and handed to the new owner's entities
//	shardhost.shards           detach, reattach               the shards interrupted (detach), kept at new epochs (reattach); the first 1024, in order
//	shardhost.shard_count      detach, reattach, epochs event  how many shards (all of them)
//	shardhost.detach.reason    detach                         the detach's reason (detachment.Reason)
//	shardhost.lease.deadline   detach                         the lease deadline known at the detach (RFC 3339)
//	shardhost.lease            reattach                       the lease re-attached under (hex)
//	shardhost.lease.new        reattach                       true when the old lease was lost and a new one granted
//	shardhost.running          entities stopped event         handlers still running when the detach span ended (0 unless DrainTimeout passed)
//	shardhost.attempt          retry event                    the number of the attempt that failed
//	shardhost.retry.reason     retry event                    the attempt's error
//	error.type                 client, server, handler, act., lifecycle  the outcome, on an error status: maybe_delivered, stale_result, deadline_exceeded, canceled, handler_error, handler_panic, not_owner, undelivered, mailbox_full, unknown_kind, unknown_method, bad_request, too_large, not_sent, no_owner, too_many_waiting, no_transport, error (the runtime's, before any handler); a handoff's abort (above); a detach's reason: lease_deadline, keepalive_streak, storage_error, lease_lost, lock_lost, manual; reattach_failed, or shutdown when the runner stopped during it; restore_failed (restore event)
//
// # Debug page
//
// DebugHandler returns an http.Handler, mounted by the program like
// net/http/pprof, that shows the runner and the cluster as it sees it: the
// registered runners (with each one's own state — attached or detached and
// why, lease deadline lag, entities, message rates — when DebugConfig.PeerURL
// names their pages), the shard map by owner with handoffs in flight,
// moving and unowned shards, entities and message counters per kind, and
// the latest events. Without Config.FullLockView a runner knows the locks
// of its own shards only: the map shows the others with their assignee (at
// epoch 0), and the moves and handoffs it shows are its own — a move
// between two other runners shows on their pages. The same data is served as JSON (DebugState). It
// reads the runner through short copies under its mutex and never changes
// anything (GET and HEAD only; 405 otherwise).
//
// It has no authentication of its own: whoever reaches it reads the
// cluster's topology — runner IDs, incarnations and transport addresses,
// lease IDs and deadlines, the shard map (and epochs with ?epochs=1),
// handoffs, kind names with entity and message counts, and the events'
// details, which quote store errors. It shows no message payload,
// checkpoint or credential, and entity IDs only inside a quoted store
// error that names a key (a damaged record's). Serve it on an internal address, or
// mount it behind the program's own authentication (ExampleRunner_DebugHandler;
// DebugConfig.HTTPClient then carries credentials to the peers' pages).
//
// # Structure
//
// Package runner is the public face and the wiring; each part with a
// guarantee of its own lives in a package of its own, which this one
// feeds through a small interface and whose public errors and types it
// re-exports under the names above. They live under runner/internal/
// (so Go lets only this package use them): hosting, routing,
// registration, control, handoff, reminders, schedule, tracing, eventhub
// and debugpage; README's Layout table says what each holds, and each
// one's doc.go states its guarantees. What stays here shares the runner's one
// view of the cluster (clusterView, kept by the watches) under its mutex:
// the watches, gathering each dirty shard's state for control.Decide and
// carrying the decisions out (the store calls), and detachment — the
// detach rule (clear owned, cancel every shard context, before any
// further store call) is detachLocked in detach.go, and only there.
//
// # Concurrency
//
// A Runner is safe for concurrent use. Run starts its goroutines (lease
// keeper, membership, lock and handoff watches, control loop, watchdog,
// janitor, record guard, transport server, start-up checks) and waits for
// all of them before returning. Sends may start before Run (they wait for
// it; see Routing and delivery); Ready tells when the runner is up.
//
// The transport server bounds what a connection costs: 5 s to complete the
// TLS and HTTP/2 handshake, 5 min without calls, a ping after 30 s of
// silence answered within 10 s, clients pinging at most every 5 s, and at
// most Config.MaxConnections connections at once.
// Shutdown and Close are idempotent and may be called from any goroutine.
// Events are delivered through Subscribe without ever blocking the runner.
package runner
