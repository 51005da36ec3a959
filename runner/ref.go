package runner

import (
	"context"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/routing"
)

// Ref is a handle on one entity for a sender that calls it often: the
// analogue of other actor systems' PIDs and of Akka's EntityRef. It is a
// Sender, used with the typed calls like the Runner, with the same entity
// ID, waiting or not:
//
//	ref := r.Ref(counterKind, "c1")
//	err := add.Tell(ctx, ref, "c1", incReq{By: 1})
//	add.TellAsync(ref, "c1", incReq{By: 1}, time.Second, nil)
//
// A call through a Ref is a call by ID ([Runner.Send]'s contract, all of
// it: admission first, the same retries, at most once, the same errors)
// that skips, while the entity is resident on this runner, the hash of
// its ID, the lookup of its kind and the search of its shard's entity
// table: the Ref keeps the resident entity it found and delivers to its
// mailbox under the same admission check as a call by ID. Whenever that
// entity is no longer what a call by ID would find — its shard moved,
// detached or was released, its admission stopped for a handoff, the
// instance was passivated — the call is sent by ID (it waits for the
// cutover, follows the shard to its new owner or fails as by ID), and the
// Ref takes the entity again if it is resident here afterwards. Calls to
// another entity or kind than the Ref's, and every call while tracing is
// on, are sent by ID.
//
// A Ref is safe for concurrent use. It holds no goroutine and keeps no
// entity resident (a passivated one is activated again by the next call,
// as by ID), but until its next call it keeps the instance it last found
// reachable, passivated or not: drop Refs that are no longer used.
type Ref struct {
	r   *Runner
	ref *routing.Ref
}

var _ Sender = (*Ref)(nil)

// Ref returns a handle on the entity id of kind (see [Ref]).
func (r *Runner) Ref(kind entity.Descriptor, id string) *Ref {
	return &Ref{r: r, ref: r.router.NewRef(kind, id)}
}

// Send delivers c like [Runner.Send], through the handle when c is a call
// to the Ref's entity (see [Ref]).
func (f *Ref) Send(ctx context.Context, c entity.Call) (any, error) {
	return f.r.router.SendRef(ctx, f.ref, &c)
}

// SendAsync delivers c like [Runner.SendAsync] (the typed forms are
// AskAsync and TellAsync), through the handle when c is a call to the
// Ref's entity.
func (f *Ref) SendAsync(c entity.Call, timeout time.Duration, done func(resp any, err error)) {
	f.r.sendAsync(sendTrace{}, c, timeout, done, f.Send)
}

// Entity returns the ID of the Ref's entity.
func (f *Ref) Entity() string { return f.ref.Entity() }

// Kind returns the Ref's kind.
func (f *Ref) Kind() entity.Descriptor { return f.ref.Kind() }
