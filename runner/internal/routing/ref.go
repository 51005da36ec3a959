package routing

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
)

// Ref is a sender's handle on one entity (runner.Ref documents it for
// users): its shard hashed once and, while the entity is resident here,
// its hosting.Target, so a local send skips the hash, the kind lookup and
// the entity table. Safe for concurrent use.
type Ref struct {
	kind   entity.Descriptor
	id     string
	shard  sharding.ShardID
	target atomic.Pointer[hosting.Target] // nil: send by ID
}

// NewRef returns the handle on entity id of kind.
func (r *Router) NewRef(kind entity.Descriptor, id string) *Ref {
	return &Ref{kind: kind, id: id, shard: sharding.ShardOf(id, r.cfg.NumShards)}
}

// Kind returns the handle's kind; Entity its entity's ID.
func (f *Ref) Kind() entity.Descriptor { return f.kind }

// Entity returns the ID of the handle's entity.
func (f *Ref) Entity() string { return f.id }

// SendRef is Send of c through f: the same admission, delivery, retries
// and errors. A call to another entity or kind than f's, or while tracing
// is on, is sent by ID. Otherwise, while f's target is current (the
// entity resident here, its shard host installed and admitting), c goes
// straight to its mailbox; any other case is sent by ID, after which f
// takes the entity's target again if it is resident here.
func (r *Router) SendRef(ctx context.Context, f *Ref, c *entity.Call) (any, error) {
	if c.Kind != f.kind || c.Entity != f.id || c.Handler == nil || r.cfg.Tracer.On() {
		return r.Send(ctx, *c)
	}
	if t := f.target.Load(); t != nil && t.Kind().Desc == c.Kind {
		v, err, current := r.sendTarget(ctx, t, f.shard, c)
		if current {
			if err != nil && c.Handler.Idempotent() && errors.Is(err, hosting.ErrMaybeDelivered) {
				return r.sendIdempotent(ctx, *c, err, nil)
			}
			return v, err
		}
		f.target.CompareAndSwap(t, nil)
	}
	v, err := r.Send(ctx, *c)
	k := r.host.KindOf(c.Kind)
	if k == nil {
		k = r.host.Kind(c.Kind.Name())
	}
	if k != nil && k.Desc == c.Kind {
		if t := r.host.Target(f.shard, k, f.id); t != nil {
			f.target.Store(t)
		}
	}
	return v, err
}

// sendTarget is sendOnce through t: current is false when t is no longer
// current and nothing was delivered (the caller sends by ID).
func (r *Router) sendTarget(ctx context.Context, t *hosting.Target, shard sharding.ShardID, c *entity.Call) (v any, err error, current bool) {
	if err := r.admit(ctx, c); err != nil {
		return nil, err, true
	}
	res, current := t.Deliver(ctx, c.Handler, c.Req)
	if !current {
		return nil, nil, false
	}
	if !res.Undelivered || !retryable(res.Err) {
		return res.V, res.Err, true
	}
	v, err = r.sendSlow(ctx, t.Kind(), c.Handler, shard, *c, res.Err, nil)
	return v, err, true
}
