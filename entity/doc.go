// Package entity is the API entity authors write against: kinds, typed
// methods and signals, lifecycle hooks and codecs. It never imports the
// runner: Ask and Tell take a [Sender], which a runner implements.
//
//	type Counter struct{ n int64 }
//	func (c *Counter) Inc(ctx context.Context, r IncReq) (int64, error) { c.n += r.By; return c.n, nil }
//
//	var (
//		CounterKind = entity.NewKind("counter", func(id string) *Counter { return &Counter{} },
//			entity.IdleAfter(2*time.Minute), entity.Mailbox(1024))
//		Inc = entity.Method(CounterKind, "inc", (*Counter).Inc)
//	)
//
//	r.Register(CounterKind)
//	n, err := Inc.Ask(ctx, r, "counter-42", IncReq{By: 1})
//
// # Execution model (what the runtime guarantees)
//
//   - An entity lives on the runner owning the shard its ID hashes to
//     (sharding.ShardOf). It is created on its first message and
//     passivated after IdleAfter without messages (or evicted when the
//     runner's resident cap is reached); Release tells the two apart by
//     its Reason (the runner's ErrIdleExpired, ErrEvicted).
//   - One message at a time: handlers and lifecycle hooks of one entity
//     never run concurrently, so entity state needs no locking.
//   - The handler's context is the shard's, bounded by the asker's
//     deadline: it is cancelled when the shard leaves the runner or the
//     asker's deadline passes, whichever comes first, and context.Cause
//     tells why (the runner's ErrDetached, ErrShardMoved, ErrShutdown or
//     ErrCallerDeadline). Lifecycle hooks get the shard's context only.
//   - A panic in a handler fails that message with a *PanicError, discards
//     the instance (the next message gets a fresh one, activated with
//     ActivateRestart) and never takes the runner down.
//   - Delivery is at most once per call. Errors that guarantee
//     non-delivery (not the owner, detached, mailbox full) are safe to
//     retry; after any other error the handler may have run. A method
//     defined with [Idempotent] is retried by the sender after "may have
//     run" errors too (at least once, until its context ends).
//   - Requests and responses are encoded with the kind's Codec (JSON by
//     default) only when they cross a process boundary; locally they are
//     passed as values, so handlers must not mutate a request they keep.
//
// # The codec contract
//
// A request or response must come out of the kind's codec as it went in:
// the same call is passed as a value while the entity is local and encoded
// once it lives on another runner, so a type that loses data (with JSON: an
// unexported field, a channel, a function) would work in tests on one
// runner and arrive zeroed, or fail, in a cluster. [Method] and [Signal]
// check their types against the codec when they are defined and panic with
// ErrInvalidKind, naming the offending field, when they do not survive it
// (see [JSON] for its rules; tag a field `json:"-"` to state that it stays
// local). Codecs that implement [TypeChecker] inspect the type; any other
// codec must round-trip a zero value. Codecs whose values are pointers to
// values they make (protocol buffer messages: package
// entity/protocodec) implement [ValueDecoder].
//
// # Concurrency
//
// Kinds and method references are immutable after definition and safe for
// concurrent use; define them at package level.
package entity
