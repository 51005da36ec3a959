// Package routing delivers calls to entities wherever their shard is
// owned: locally through the entity host (package hosting) when this
// runner hosts the shard, otherwise in one hop over the transport to the
// owner its Directory names; and, on the receiving side, it turns a
// transport request into a local delivery (Receiver). In DESIGN.md terms
// it is the "routing" box between the sender, the lock view and the
// transport.
//
// It guarantees:
//
//   - At most once. A call is retried — with jittered exponential backoff
//     and a wake-up on every routing change (RoutesChanged) — only after a
//     failure that proves no handler ran it (not the owner, undelivered,
//     not sent, no owner yet); any other failure is returned as it is.
//     Methods defined with entity.Idempotent are the exception: they are
//     sent again after ErrMaybeDelivered until they succeed, fail
//     otherwise, or the caller's context ends.
//   - Admission first. A call whose context already ended is never
//     delivered, locally or remotely, and a runner that is not running
//     refuses at once (Directory.Running, WaitRun).
//   - No acknowledged result of an older epoch from an ended lease. Every
//     reply carries the epoch its handler ran under; a result older than
//     an epoch of the shard already seen (lock watch, installs, replies:
//     SawEpoch) is withheld (*hosting.StaleResultError) when its owner's
//     lease has ended other than by a clean Shutdown
//     (Directory.LeaseEndsByDrain), closing the gap between the owner's
//     own check and its socket write. The older-epoch result of a live
//     owner, or of one that stopped cleanly, is accepted: it gives a shard
//     up only after its drain (no ask is lost on a planned move, including
//     the moves of a Shutdown).
//   - One hop. A receiver delivers locally or answers not-owner (with a
//     hint); it never forwards. Every outcome is an answer with a code,
//     mapped back to the same typed error on the sender (ResponseError).
//   - A route change ends a wait for a gone owner. A remote attempt
//     passes its route to the transport (transport.RouteCaller): a wait
//     for a connection to the owner — nothing sent yet — is abandoned as
//     soon as the shard's route no longer names that owner at that address
//     (its lock moved or was deleted, its record or lease is gone), and the
//     send retries at once at the new owner; the back-off restarts whenever
//     the watch's owner of the shard changes. A request already sent is
//     never abandoned (at most once).
//   - No wait for the watch after a crash. A send that knows no live
//     owner of the shard tries the runner the assignment names
//     (Directory.Assignee) — not again, after a refusal, before the next
//     back-off step — and a receiver asked for a shard it is acquiring
//     holds the request until the shard is installed (Directory.Park),
//     then delivers it like any other; or answers not-owner, having run
//     nothing. Either way at most once, and a handler runs only on the
//     shard's owner.
//   - Bounded waiting. At most MaxWaitingSends sends wait for an owner at
//     once; beyond that a send fails with ErrTooManyWaiting.
package routing
