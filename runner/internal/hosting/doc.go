// Package hosting runs the entities of the shards a runner owns: one Shard
// per owned shard and epoch (its mailboxes and resident instances, their
// activation, passivation and Release hooks, the cutover of a planned
// move), and one Host per runner (the registered kinds, the table of
// hosted shards, the LRU of resident entities under the resident cap, the
// janitor). In DESIGN.md terms it is the "entity host" box: the runner's
// control loop decides which shards are owned; hosting runs what they hold.
//
// It guarantees, for the messages it admits:
//
//   - One instance, one goroutine. An entity runs one handler at a time,
//     on a goroutine that exists only while its mailbox is non-empty (a
//     remote ask that finds its entity idle runs on the goroutine that
//     delivers it, the entity's for that ask; what arrives meanwhile runs
//     after it, on the entity's own goroutine); a
//     new instance of an entity never activates before the previous
//     instance's Release hook returned, nor before the handlers of the
//     shard's previous epoch on this runner returned (bounded by
//     DrainTimeout).
//   - No handler after the shard left. Before each handler (and again
//     after a slow activation) the shard's context and the detach instant
//     (Env.PastDetach, on the monotonic clock) are checked: a message that
//     fails the check is answered undelivered (UndeliveredError, safe to
//     retry), never run — also when its entity's activation failed because
//     the shard left meanwhile. Every handler's start check reads the
//     clock.
//   - No acknowledged result after the shard left. When an ask's handler
//     returns, the same checks are made again: if the shard left (or the
//     detach instant passed) while it ran, its result is withheld
//     (StaleResultError, errors.Is ErrMaybeDelivered) and the instance is
//     discarded — unless the shard is being released plainly with its lock
//     kept until its handlers return (KeepLock). A signal's handler has no
//     result to withhold: its end check is the shard's only (no clock
//     read; the next handler's start check reads it).
//   - Drains lose nothing. Drain stops admission atomically with enqueue,
//     waits for running handlers and for every remote answer to be written
//     (Deliver with remote, ReplyWritten), then runs Release hooks of idle
//     instances; during a cutover (BeginCutover) asks not started yet go
//     back to their senders undelivered and new senders wait (at most
//     CutoverWaiters) for the outcome.
//   - A Target is its entity by ID. A sender keeping a resident entity
//     (Host.Target, for routing's Ref) delivers to it without the table
//     lookup or the shard's lock, checking admission under the entity's
//     lock instead; stopping admission takes every listed entity's lock
//     once, so it is atomic with such pushes too, and a target whose
//     entity is no longer what the table holds is refused before anything
//     is enqueued (the caller sends by ID).
//
// Mailboxes are bounded (entity.Mailbox; a full one refuses with
// entity.ErrMailboxFull) and cost no allocation per message: a sender
// appends under the entity's mutex — its first messages to a slice the
// entity's goroutine takes whole (a batch) and hands back empty, the rest
// of a burst to fixed-size chunks from a pool all entities share
// (mailbox.go). Only a push onto an empty mailbox starts the goroutine (or
// is seen by it while it lingers); the goroutine runs what it took in
// order, then looks again. Senders and the goroutine write disjoint cache
// lines of the entity's record.
//
// Hosting makes no store call but the entities' own checkpoint reads and
// fenced writes (Checkpoints), and never decides ownership: Install,
// Uninstall, Close and the cancellation of a shard's context are the
// runner's.
package hosting
