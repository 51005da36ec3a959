// Package memory is an in-process implementation of [storage.Store] with the
// semantics of the etcd implementation (store-wide revisions, TTL leases that
// delete their keys on expiry, watches from any retained revision) and fault
// hooks for tests.
//
// A [Cluster] is the shared state — the "etcd cluster". Each [Store] obtained
// from [Cluster.NewStore] is one client of it, with its own faults: a
// partitioned client's calls block until their context ends and its watches
// stall silently (delivering the missed events after the partition heals),
// exactly as a real client behind a black-holed network does.
// [Cluster.DisableFencing] breaks the store on purpose (checkpoints accepted
// under any epoch), for tests that prove their checkers catch it.
//
// # Time
//
// Leases expire on timers of package time, so inside a testing/synctest
// bubble a 10 s TTL costs no wall time. Create the Cluster inside the bubble
// whose clock it should use, and Close it before the bubble ends.
//
// # Concurrency
//
// Watches ignore the Fail and Delay hooks (use Partition or BreakWatches).
//
// Every method is safe for concurrent use. Watch deliveries run on one
// goroutine per watch, which exits when the watch's context ends.
package memory
