// Package detachment holds the detach / re-attach state machine of a runner
// and the policy that decides when to trip it. It is pure: stdlib only, no
// goroutines, no I/O, no logging; time is passed in by the caller.
//
// A runner is attached while it may execute shard entities. It detaches —
// interrupting every entity before another runner can own its shards — when
// the policy trips: the lease deadline minus the margin is reached, the
// keep-alive failure streak reaches its threshold, the lease is lost, a
// storage call fails, an owned lock disappears, or by hand. While detached
// the caller probes the store and reports health; after RecoverWindow of
// continuous health the machine allows re-attachment.
//
// With Enabled false the machine never detaches: [Machine.Detach] reports
// that it would have, so the caller can log it (for staged roll-outs).
//
// # Concurrency
//
// A [Machine] is safe for concurrent use. [Policy] is a value.
package detachment
