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
//     runner's resident cap is reached).
//   - One message at a time: handlers and lifecycle hooks of one entity
//     never run concurrently, so entity state needs no locking.
//   - The handler's context is the shard's: it is cancelled when the shard
//     leaves the runner, and context.Cause tells why (the runner's
//     ErrDetached, ErrShardMoved or ErrShutdown).
//   - A panic in a handler fails that message with a *PanicError, discards
//     the instance (the next message gets a fresh one, activated with
//     ActivateRestart) and never takes the runner down.
//   - Delivery is at most once per call. Errors that guarantee
//     non-delivery (not the owner, detached, mailbox full) are safe to
//     retry; after any other error the handler may have run.
//   - Requests and responses are encoded with the kind's Codec (JSON by
//     default) only when they cross a process boundary; locally they are
//     passed as values, so handlers must not mutate a request they keep.
//
// # Concurrency
//
// Kinds and method references are immutable after definition and safe for
// concurrent use; define them at package level.
package entity
