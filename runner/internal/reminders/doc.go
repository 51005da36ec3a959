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
//
// Concurrency: the runner calls Acquired, Pause, Resume, Progress, Stop
// and StopAll (cheap, non-blocking; several under its own mutex); entity
// handlers call Register, Cancel and List through the entity's runtime
// (they wait for their shard's reminders to be loaded and for the store).
// Run owns the service's one goroutine (loads, progress rewrites, one-shot
// deletions). Lock order: a shard set's mutex, then the scheduler's.
package reminders
