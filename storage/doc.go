// Package storage defines what shardhost needs from its coordination store:
// leases, the runner registry, shard locks, handoff records and fenced
// checkpoints, plus list-then-watch of the key families. It holds interfaces,
// record types, key and value encodings and sentinel errors only; the
// implementations live in storage/etcd (production) and storage/memory
// (in-process, with fault hooks), and storage/storagetest checks both against
// one conformance suite.
//
// # Semantics every implementation guarantees
//
//   - Ownership. A runner owns a shard while the key shards/{shard} exists and
//     is attached to the runner's lease. The value (runner ID and incarnation)
//     is informative only: a new incarnation of a runner with the same ID but
//     a new lease does not own the keys of the previous incarnation. A lock
//     without a lease is never an ownership (it cannot expire; only a
//     foreign writer makes one): Acquire overwrites it, conditional in the
//     same transaction on it still having no lease, and reports it
//     (AcquireResult.Replaced).
//   - Registration. runners/{ID} is claimed, not stolen: PutRunner writes it
//     only when it is absent or attached to the caller's lease, and
//     ReplaceRunner only at the revision the caller read; otherwise both
//     return a *RunnerConflictError with the record found.
//   - Epoch. The epoch of an ownership is the store revision at which the lock
//     was last written by its holder (acquire, transfer or epoch bump). It is
//     the key's ModRevision, so it strictly increases across the owners of a
//     shard, and re-acquiring after a loss always yields a larger epoch.
//   - Batches. Acquire, Verify and Release take any number of shards and split
//     them into transactions of [MaxShardsPerTxn] shards, at most [MaxTxnOps]
//     operations each. A shard held
//     by somebody else is a per-shard result, never an error. An error means
//     the store could not be asked (transport, timeout, lease not found); then
//     nothing can be concluded about the shards of the failed transaction.
//   - Verify is read-only: steady-state verification performs no writes.
//   - Transfer moves a lock the caller owns to another lease in one
//     transaction that also deletes the shard's handoff record.
//   - Checkpoints are fenced: a write or a delete succeeds only if the
//     writer's epoch is the lock's current epoch, checked in the same
//     transaction; otherwise it fails with a [*FencedError] and changes
//     nothing.
//   - The cluster record ({namespace}/cluster, no lease) holds the settings
//     every runner must share ([ClusterRecord]). It is created only if
//     absent and changed only at the revision the writer read
//     ([Clusters.WriteCluster]), so concurrent first starts agree on one.
//   - Bad requests (a shard listed twice, [NoLease], an epoch that is not
//     positive, an empty owner, ...) fail with [ErrInvalidArgument] before
//     anything is sent: they could otherwise match absent keys, whose lease
//     and revision compare as 0 in etcd.
//   - Strict decoding. The decoders (DecodeRunner, DecodeLock, DecodeHandoff,
//     DecodeCheckpoint) accept only what the encoders write: keys in
//     canonical form (a shard number as sharding.ParseShardID accepts it, a
//     runner ID equal to the record's), values that are one JSON object in
//     valid UTF-8 with every required member present once, typed and valid.
//     Unknown members are ignored, so that a later version can add optional
//     ones. Anything else is a *CorruptError naming the key; a checkpoint
//     stored as null, {} or with an epoch that is not positive included.
//   - List and watch. [Lister.List] returns a consistent snapshot of one key
//     family at a revision R; [Lister.Watch] from R+1 delivers every later
//     change in revision order. [Follow] combines both and re-lists when the
//     watch cannot continue (compaction, watch failure), reporting the reset.
//
// # Concurrency
//
// Implementations are safe for concurrent use by multiple goroutines. Every
// call honours its context; implementations add a default timeout when the
// context has none, so no call blocks forever.
package storage
