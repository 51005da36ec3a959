// Package registration keeps the records a runner publishes about itself
// and checks the one it shares with the cluster. Its own record,
// runners/{ID}, is kept as the runner wrote it: the key is claimed at
// registration and repaired while the runner is attached. The cluster
// record (CheckCluster) holds the settings every runner must agree on
// (NumShards, Strategy): published by the first runner, checked by every
// other, a disagreement is a *ClusterMismatchError. It makes the store calls of the record
// (PutRunner, ReplaceRunner) and owns what the runner knows of its record
// (the record wanted, the revision of its last write, the latest state
// observed by the runners watch, the other registration it waits for); it
// never decides the runner's lifecycle — a duplicate ID is returned as
// ErrDuplicateRunnerID for the runner to stop on.
//
// It guarantees that the record is claimed, never stolen
// (storage.Registry): the runner writes it when it is absent or attached to
// its own lease, and replaces anything else only after deciding, at the
// revision it read, that it is damage. The rules:
//
//   - Registration (first start, or re-registration with a new lease after
//     the old one was lost) that finds a valid record of another process
//     (another incarnation, under another lease) waits for that lease to end:
//     a crashed predecessor's lease expires within its TTL and deletes the
//     record, a stopping one revokes it. The wait lasts at most the holder's
//     lease TTL (as published in its record; this runner's LeaseTTL if it
//     published none) plus duplicateIDSlack (Register returns
//     ErrWaitingForID meanwhile); after that the holder is
//     renewing its lease, so it is alive: Run fails with
//     ErrDuplicateRunnerID (logged at ERROR). A damaged record (corrupt,
//     without a lease, naming this incarnation under another lease) is
//     replaced at once.
//   - A registered runner watches its record. If it is deleted or changed
//     while the lease lives (garbage, a wrong address, a write under its
//     lease), the runner rewrites it, conditional on the revision it saw, and
//     logs a WARN naming the key. If it is replaced by a valid registration of
//     another live process (which a shardhost runner makes only when it found
//     the key absent), both log an ERROR and the process that started first
//     keeps the ID: it restores its record; the other gives up (drops its
//     shards, revokes its lease) and Run returns ErrDuplicateRunnerID.
package registration
