// Package control holds the mechanics of a runner's control loop that need
// no runner: the work queue that turns events into dirty shards and
// per-shard timers (Queue), the runner's view of every shard's lock
// (LockView), and the gate that decides when a membership change is acted
// on (StormGate). In Kubernetes controller terms it is the "event → work
// queue" half; the "work item → decision" half — deciding each dirty
// shard, carrying the decisions out — stays in package runner, which owns
// the state those decisions read.
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
//   - The storm gate acts on an isolated departure at once, on anything
//     else only once the view has been quiet for the debounce (5 debounces
//     for a runner that owns nothing), and in an endless storm at most 10
//     debounces (50) after the first change not acted on.
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
