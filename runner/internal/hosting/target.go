package hosting

import (
	"context"
	"errors"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
)

// Target is a resident entity found once, for a sender that keeps it
// (routing's Ref) and delivers to it again without hashing the entity's
// ID, looking its kind up or searching the shard's entity table.
//
// Delivering to a target is the delivery by ID to the entity, minus the
// table lookup and the shard's lock, and nothing else: the same admission
// (checked under the entity's lock, see enqueue), the same mailbox, bound
// and ordering. It relies on this invariant of a shard host (lifecycle.go,
// shard.go): while the host admits, an entity that was listed in its
// table is still listed exactly when it is not retired (dead) — retire
// unlists and marks dead in one critical section under Shard.mu; a drain
// marks dead only with admission off, and Reopen unlists the dead before
// admitting again; Close turns admission off for good. So with admission
// on and the instance not dead, the table would return this very
// instance.
type Target struct {
	sh *Shard
	e  *resident
}

// Target returns the resident entity id of kind k in shard id, or nil
// when the shard is not hosted here, does not admit, or the entity is not
// resident (a message by ID activates it).
func (h *Host) Target(id sharding.ShardID, k *Kind, entityID string) *Target {
	sh := h.Lookup(id)
	if sh == nil || k == nil {
		return nil
	}
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if !sh.admitting {
		return nil
	}
	if e := sh.entities.get(k, entityID); e != nil {
		return &Target{sh: sh, e: e}
	}
	return nil
}

// Kind returns the target entity's kind.
func (t *Target) Kind() *Kind { return t.e.kind }

// Deliver is Shard.Deliver (local, not traced) of req to handler h of the
// target entity, when the target is still current: its shard host is
// still the one installed, it admits, and the instance is not retired.
// Otherwise current is false and nothing was enqueued or checked beyond
// that: the caller delivers by ID (which waits for a cutover, follows the
// shard to its new host or owner, or activates a new instance).
func (t *Target) Deliver(ctx context.Context, h *entity.Handler, req any) (res Result, current bool) {
	sh, e := t.sh, t.e
	if h.TickKind() != entity.NotTick || !sh.prevDone.Load() || sh.h.Lookup(sh.id) != sh {
		// A tick is refused by the by-ID path (with its error); a host
		// waiting for its previous epoch's handlers waits there too.
		return Result{}, false
	}
	oneWay := h.OneWay()
	msg := message{h: h, req: req}
	if !oneWay {
		msg.reply, msg.ctx = sh.h.waiters.Get().(*waiter), ctx
	}
	err := t.enqueue(ctx, &msg)
	if err == errNotCurrent { //nolint:errorlint // enqueue returns the sentinel itself
		if msg.reply != nil {
			sh.h.waiters.Put(msg.reply)
		}
		return Result{}, false
	}
	if err != nil {
		if msg.reply != nil {
			sh.h.waiters.Put(msg.reply)
		}
		return Result{Err: err, Undelivered: true}, true
	}
	if oneWay {
		return Result{Admitted: true}, true
	}
	return sh.await(ctx, e.kind, e.key.ID, &msg), true
}

// errNotCurrent says a target is no longer what the table would return.
var errNotCurrent = errors.New("hosting: target not current")

// enqueue is Shard.enqueue's admission and push for the target's
// instance (no table lookup, never an activation): the context first,
// then, under the entity's lock, the instance not retired, admission on
// (open: a shard that stops admitting takes every listed entity's lock
// once after turning it off, so a push that saw it on completes before
// admission is seen stopped — stopAdmittingLocked) and the push.
func (t *Target) enqueue(ctx context.Context, msg *message) error {
	sh, e := t.sh, t.e
	if ctx.Err() != nil { // admission checks the context first
		return &UndeliveredError{Shard: sh.id, Cause: ContextError(ctx)}
	}
	e.mu.Lock()
	if e.dead || !sh.open.Load() {
		e.mu.Unlock()
		return errNotCurrent
	}
	start, err := e.pushLocked(msg)
	e.mu.Unlock()
	if start {
		e.start()
	}
	return err
}
