// Package lease keeps a storage lease alive and tracks, on the local
// monotonic clock, how long it is guaranteed to live.
//
// A [Keeper] renews its lease every RenewInterval (default TTL/3) and, after
// a failure, every RetryInterval (default 250 ms). It publishes a [Health]:
//
//	Deadline = send time of the last acknowledged renewal + granted TTL
//
// Because the store starts the new TTL no earlier than it receives the
// request, the lease cannot expire on the server before Deadline (up to clock
// rate drift, which callers cover with a margin). Using the receive time of
// the reply instead would overestimate the deadline by the reply's latency.
// This is why shardhost does not rely on the etcd client's keep-alive
// channel: it closes only after the lease may already have expired.
//
// The send time is the moment the keeper calls [storage.Leases.KeepAliveOnce].
// A store may answer that call with several requests: the etcd store, when a
// member does not answer within a short attempt timeout, asks the next
// member too (hedging). Every one of those requests is sent after the call
// began, so whichever is acknowledged, the server renewed the lease at or
// after that moment and keeps it at least a TTL longer: the deadline stays
// conservative. It gives up at most the time between the call and the
// acknowledged attempt (a few hundred milliseconds when a member is dead),
// which the next renewal, due RenewInterval after the call, wins back.
//
// A renewal answered with "lease not found" marks the health Lost; the keeper
// then stops renewing until [Keeper.Grant] is called. The keeper never
// re-grants by itself: its owner (the runner) must first detach, then grant
// and re-register.
//
// # Concurrency
//
// All methods are safe for concurrent use. [Keeper.Run] must be called at
// most once at a time; it returns when its context ends. Health changes are
// observed with [Keeper.Health], which returns a channel closed on the next
// change.
package lease
