// Package control holds the parts of a runner's control loop that need no
// runner: the work queue that turns events into dirty shards and
// per-shard timers (Queue), the decision on one dirty shard (Decide), the
// runner's view of every shard's lock (LockView), and the gate that
// decides when a membership change is acted on (StormGate). In Kubernetes
// controller terms it holds both halves, "event → work queue" and "work
// item → decision"; package runner owns the state the decisions read,
// gathers it under its mutex, and carries the decisions out (store calls,
// batched, after the mutex is released).
//
// # Guarantees
//
//   - Work proportional to change. Marking a shard costs O(1) and a shard
//     marked any number of times between two rounds is taken once; a full
//     reconcile (AddAll) costs O(marked shards) to record, never a pass
//     over every shard, and supersedes the individual marks.
//   - Timers in order, earliest kept. Each shard has at most one pending
//     re-check, the earliest asked for; Fire marks due shards in time order
//     and reports when the next is due. A later request for a shard with an
//     earlier pending one changes nothing.
//   - Nothing survives a Reset: after it no shard is marked and no timer is
//     pending (a detach forgets all of the attachment's work).
//   - Decide, for one shard: an assigned shard this runner does not own is
//     acquired when its lock is free, under this runner's lease, or under
//     a lease no other live runner has — at most once per retry interval,
//     and not after its retry window ran out; it is taken over by handoff,
//     never acquired, while another live runner holds it: one takeover at
//     a time, started over when the lock it takes over changed hands or
//     was rewritten, held back after an abort. A takeover of a shard
//     assigned elsewhere is aborted. An owned shard is kept while assigned
//     here or while the view does not hold this incarnation (an
//     incomplete view sheds nothing), and handed off otherwise — whatever
//     the assignment once another incarnation took this runner's ID. A
//     lock under this runner's lease that it neither owns, releases nor
//     wants is deleted; so is a handoff record of its lease with no
//     takeover behind it, once per revision.
//   - The storm gate (StormGate, whose doc is the rule's one statement in
//     the code) acts on an isolated departure at once and on anything else
//     only once the view has been quiet, or after a bound in an endless
//     storm.
//
// The package is pure: no goroutines, no I/O, no logs, no clock of its own
// (every time is an argument).
//
// # Concurrency
//
// No type here is safe for concurrent use: the runner guards its Queue and
// LockView with its mutex, and the StormGate belongs to the control loop's
// goroutine.
package control
