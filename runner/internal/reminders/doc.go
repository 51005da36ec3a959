// Package reminders runs the durable reminders of the shards a runner
// owns: it loads each acquired shard's reminders from the store (batched,
// in the background: a shard's messages never wait for it), schedules
// their ticks on the runner's one timer structure (internal/schedule),
// fires each due tick by delivering a message to its entity through the
// entity host (activating it if it is not resident), stores registrations
// and cancellations in transactions fenced by the shard's epoch, and
// computes, when the shard leaves by a planned move, which ticks fired
// (the shard's progress record, written by the runner before the lock
// moves).
//
// In DESIGN.md terms it guarantees, for reminders:
//
//   - Fired by the owner only. A tick is fired by delivering it to the
//     hosted shard at the epoch the reminder was loaded under; the
//     delivery passes the same start gate as every handler (the shard
//     still hosted here, the detach instant not passed), and a tick counts
//     as fired only once its handler starts. A shard that is paused
//     (cutover), stopped (released, lost, detached) or not loaded fires
//     nothing.
//   - Exactly once across planned moves. The old owner stops firing when
//     the cutover begins; after its drain (no handler of the shard can
//     start any more) Progress states which ticks fired — every tick due
//     by the cut, except the reminders listed with their last fired tick —
//     and the runner writes it, final, fenced by the old epoch, before the
//     lock moves. The new owner loads it with the reminders and, before it
//     fires anything, rewrites it as not final (fenced by its own epoch):
//     a final progress is therefore always exact, and the new owner fires
//     the next tick of each reminder, none twice. An owner that resumes
//     after a failed cutover also un-finalizes its progress before firing.
//   - At least once across unplanned losses. Without a final progress
//     (a crash, a detach, a lost lock) the new owner starts from what the
//     store knows (the last progress, else nothing fired) and marks the
//     first fire of each reminder Redelivered: the handler deduplicates by
//     the tick number.
//   - No unbounded replay. Ticks missed while nobody could fire them are
//     collapsed into one fire with their count (entity.FireOnce) or
//     skipped (entity.Skip, after an unplanned loss only); reminders
//     overdue when their shard is loaded fire through the scheduler's
//     catch-up queue, at a bounded rate per runner.
//   - Writes only on change. A periodic reminder writes nothing per tick:
//     registration, cancellation, the deletion of a one-shot reminder that
//     fired, and one progress record per shard per planned move (plus its
//     rewrite by the next owner) are the only writes.
//   - Bad records stay contained. A stored reminder that does not decode,
//     or names a kind or method this runner does not know, is logged with
//     its key and skipped; it never stops the shard's other reminders.
//   - Liveness. Once the store answers the runner again, and while a
//     shard stays owned here with no cutover under way, the shard's set
//     fires again within L = maxRetry (1 s) + OpTimeout (for a call the
//     fault left hanging to end) + the round trips of two store calls (a
//     read, then a rewrite) — plus, when many shards load at once (a
//     cold start), its turn among them, loadBatch shards per read — and
//     from then on each reminder fires its next tick when due (ticks
//     already due at once; overdue at a load, through the scheduler's
//     catch-up queue): every registered reminder fires within one period
//     plus L. A tick also waits for its entity: the handler running
//     there, and the back-off of its activation when it failed (100 ms
//     doubling to a minute); a reminder whose kind or method this runner
//     does not know waits for it (retried every minute).
//
// Liveness holds by construction (setstate.go). A set's state, after
// any write that fails, lands late or is refused, is one of the table
// below; each leads back to firing through the calls it asks for, and
// toLocked queues the set for them on every transition, so none waits for
// a call nobody makes. The set loop retries a failed call at most maxRetry
// later; a read and a rewrite are made by one goroutine that makes no
// other kind of call (one-shot deletions and remembered markers have a
// loop of their own).
//
//	state                                  how it arises                                 way back to firing (calls)
//	loading (N)                            acquired; its read failed                     read (1), then as below
//	final theirs (T)                       loaded the predecessor's final progress       rewrite as not final (1)
//	final ours (O)                         a cutover given up after Progress: its        rewrite as not final (1): a final
//	                                       write failed, may land late, or landed and    record that lands later is refused
//	                                       the transfer failed                           by the state order key
//	rewrite in flight (.w)                 the rewrite began                             its answer: taken (fires), failed or
//	                                                                                     unknown (asked again), fenced (.f)
//	fenced (.f)                            the lock refused the rewrite: the shard       the runner stops the set when it
//	                                       moved on                                      sees the lock move
//	paused (.p)                            a cutover began                               the cutover ends: Resume (then as
//	                                                                                     above), or Stop
//	reload pending (.r)                    the watchdog                                  read and merge (1), then as above
//	stopped (X)                            the ownership ended                           none: the next owner's set fires
//
// A failed read changes no state (the read is asked again). As a safety
// net under this rule, the watchdog reloads a set that could not fire for
// StuckAfter (30 s) while its shard is owned here and not in a cutover:
// its state is read again and merged (a registration or cancellation whose
// outcome the runner did not learn and that landed is taken in; what the
// set knows of its ticks is kept), it is logged at WARN with its shard and
// cause (load, reload, rewrite, fenced) and counted in
// sharding.reminder_reloads, which stays at 0 while the rule holds.
//
// Concurrency: the runner calls Acquired, Pause, Resume, Progress, Stop
// and StopAll (cheap, non-blocking; several under its own mutex); entity
// handlers call Register, Cancel and List through the entity's runtime
// (they wait for their shard's reminders to be loaded and for the store).
// Run owns the service's goroutines: the set loop (loads, reloads,
// progress rewrites, the watchdog) and the side loop (one-shot deletions,
// remembered markers). Lock order: a shard set's write lock, its mutex,
// the service's mutex, then the scheduler's.
package reminders
