// Package runner hosts the shards of a shardhost cluster in one process: it
// registers the runner under a lease, computes the shard assignment from the
// membership, acquires and releases shard locks in batches, verifies them,
// and detaches — interrupting everything it hosts — before its lease can
// expire on the server.
//
// # Guarantees
//
//   - Single owner. A shard is owned by a runner only while its lock exists
//     under the runner's lease at the epoch the runner installed. Ownership
//     is installed only while attached and before the detach instant.
//   - Detach before expiry. The runner detaches no later than
//     lease deadline - DetachMargin, where the deadline is the send time of
//     the last acknowledged renewal + the granted TTL (monotonic clock). On
//     the transition, before any further store call, the owned set is
//     cleared and every shard context is cancelled with cause ErrDetached.
//     It also detaches on StorageErrorThreshold consecutive store failures,
//     on a lost lease, on an owned lock deleted or taken behind its back,
//     and (optionally) on a keep-alive failure streak.
//   - Fresh epochs after re-attach. Locks that survived a detach under the
//     same lease are rewritten (new epochs) before they are owned again; a
//     lost lease is replaced by a new one and the runner re-registers.
//   - Fast reaction. Lock deletions of assigned shards wake the acquirer
//     through the watch at once; shards held elsewhere are retried every
//     AcquireRetryInterval within AcquireRetryWindow.
//
// # Concurrency
//
// A Runner is safe for concurrent use. Run starts its goroutines (lease
// keeper, membership and lock watches, control loop, watchdog) and waits for
// all of them before returning. Shutdown and Close are idempotent and may be
// called from any goroutine. Events are delivered through Subscribe without
// ever blocking the runner.
package runner
