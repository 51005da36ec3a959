package hosting

import (
	"context"
	"fmt"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Remembered entities (kinds with entity.Remembered): the host tells the
// runner's Remembrance when one was activated (it records the entity in
// the store once), when its instance failed (it activates it again after
// a back-off) and when it asked to be forgotten. The Remembrance activates
// remembered entities without a message through Shard.Activate. A
// remembered entity is never passivated (idle or by the resident cap)
// until it is forgotten.

// Remembrance is the store side of remembered entities (the runner's
// reminder service implements it).
type Remembrance interface {
	// Remember: entity e of a remembered kind was activated on shard at
	// epoch. Must not block.
	Remember(shard sharding.ShardID, epoch storage.Epoch, e EntityKey)
	// Failed: e's instance panicked (it was discarded). Must not block.
	Failed(shard sharding.ShardID, epoch storage.Epoch, e EntityKey)
	// ForgetEntity deletes e's marker, fenced by epoch.
	ForgetEntity(ctx context.Context, shard sharding.ShardID, epoch storage.Epoch, e EntityKey) error
}

// RememberAwaiter is optionally implemented by a Remembrance: it waits
// until an activated entity's marker is in the store.
type RememberAwaiter interface {
	// AwaitRemembered returns once e's marker is stored, fenced by epoch;
	// an error when the shard left (ErrShardMoved) or ctx ended first.
	AwaitRemembered(ctx context.Context, shard sharding.ShardID, epoch storage.Epoch, e EntityKey) error
}

// SetRemembrance makes rm the store side of remembered entities. It must
// be called before any entity runs.
func (h *Host) SetRemembrance(rm Remembrance) { h.remembrance = rm }

// Activate activates entity id of kind k without a message, without ever
// blocking, like Fire: false when it could not be queued now (try again
// later); else done is called exactly once, with true once the entity is
// activated (past the start gate; at once if it already was), false if it
// failed to (its Activate hook failed or panicked, the shard left).
func (sh *Shard) Activate(k *Kind, id string, done func(ok bool)) bool {
	return sh.Fire(k, nil, id, nil, func(ok bool) bool { done(ok); return true })
}

// pinned reports whether e is kept resident: a remembered entity not
// forgotten.
func (e *resident) pinned() bool {
	return e.kind.Opts.Remembered && !e.forgotten.Load()
}

// remembered tells the Remembrance that e activated (remembered kinds).
func (e *resident) remembered() {
	sh := e.host
	if !e.kind.Opts.Remembered || sh.h.remembrance == nil {
		return
	}
	e.forgotten.Store(false)
	sh.h.remembrance.Remember(sh.id, sh.epoch, e.key)
}

// Forget implements entity.Runtime.
func (e *resident) Forget(ctx context.Context) error {
	if !e.kind.Opts.Remembered {
		return fmt.Errorf("%w: %s %q", entity.ErrNotRemembered, e.key.Kind, e.key.ID)
	}
	sh := e.host
	if err := e.shardGone(); err != nil {
		return fmt.Errorf("forget %s %q: %w", e.key.Kind, e.key.ID, err)
	}
	if sh.h.remembrance == nil {
		return &entity.NoEntityError{Call: "Forget", Detail: fmt.Sprintf("%s %q: the runtime keeps no remembered entities", e.key.Kind, e.key.ID)}
	}
	if err := sh.h.remembrance.ForgetEntity(ctx, sh.id, sh.epoch, e.key); err != nil {
		return fmt.Errorf("forget %s %q: %w", e.key.Kind, e.key.ID, err)
	}
	e.forgotten.Store(true)
	return nil
}

// AwaitRemembered implements entity's remember runtime: it returns once
// the entity's marker is in the store (entity.Remember).
func (e *resident) AwaitRemembered(ctx context.Context) error {
	if !e.kind.Opts.Remembered {
		return fmt.Errorf("%w: %s %q", entity.ErrNotRemembered, e.key.Kind, e.key.ID)
	}
	sh := e.host
	if err := e.shardGone(); err != nil {
		return fmt.Errorf("remember %s %q: %w", e.key.Kind, e.key.ID, err)
	}
	aw, ok := sh.h.remembrance.(RememberAwaiter)
	if !ok {
		return fmt.Errorf("remember %s %q: %w: the runtime keeps no remembered entities", e.key.Kind, e.key.ID, entity.ErrNoEntity)
	}
	e.remembered() // an instance that called Forget and still runs is remembered again
	return aw.AwaitRemembered(ctx, sh.id, sh.epoch, e.key)
}
