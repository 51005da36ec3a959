package runner

import (
	"context"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The runner's side of the transitions: hosting, reminders, routing and
// events follow the records.

// shardChangedLocked is where every change to shard id ends, whatever made
// it: a round's decision, a store call's result, a watch event, a notice, a
// refused write. It reacts in one place and one order: the requests parked
// on the shard look again (park.go), the owned gauge follows the table, the
// router learns epoch unless it is 0 (a lock seen written at it), and, when
// dirty, the shard is decided again in the next round. A change from
// outside the round is dirty when it concerns this runner (the caller
// says, usually with concernsLocked); the round's own decisions are not:
// the round has just decided the shard.
func (r *Runner) shardChangedLocked(id sharding.ShardID, epoch storage.Epoch, dirty bool) {
	if p := r.parked.shards[id]; p != nil {
		close(p.wake)
		p.wake = make(chan struct{})
	}
	r.recordOwnedLocked()
	if epoch != 0 {
		r.router.SawEpoch(id, epoch)
	}
	if dirty {
		r.work.Add(id)
		signal(r.sig.kick)
	}
}

// allChangedLocked is shardChangedLocked for a change that may concern
// every shard: the lifecycle moved (toLocked), a view changed or caught up
// (membership, the assignment, a listing of locks or handoff records), the
// owned shards were dropped. Every parked request looks again; when dirty,
// every shard is decided again in the next round (one O(shards) pass).
func (r *Runner) allChangedLocked(dirty bool) {
	for id := range r.parked.shards {
		r.shardChangedLocked(id, 0, false)
	}
	r.recordOwnedLocked()
	if dirty {
		r.work.AddAll()
		signal(r.sig.kick)
	}
}

// recordOwnedLocked records the owned gauge when the count changed since.
func (r *Runner) recordOwnedLocked() {
	if n := int64(r.shards.owned); n != r.met.ownedRecorded {
		r.met.ownedRecorded = n
		r.met.shardsOwned.Record(context.Background(), n, r.met.attrs)
	}
}

// installLocked records shard id as owned at epoch and starts hosting it.
func (r *Runner) installLocked(id sharding.ShardID, epoch storage.Epoch) {
	var warmed map[hosting.EntityKey]any
	if in := r.shards.endInbound(id); in != nil { // the old owner died mid-handoff
		if err := in.Advance(handoff.Acquired, nil); err != nil { // cancels it; no phase of its own
			r.phaseRefused(id, err)
		}
		warmed = in.TakeWarmed()
		r.shardChangedLocked(id, 0, true) // the round deletes our record, now without an inbound
		r.life.endInbound(in, outcomeAcquired, epoch, len(warmed))
	}
	r.installWithLocked(id, epoch, entity.ActivateNew, warmed)
}

// installInboundLocked installs a lock that appeared under our lease in the
// watch, completing the inbound handoff if there is one.
func (r *Runner) installInboundLocked(id sharding.ShardID, l storage.Lock) {
	if !r.mayOwnLocked() {
		return
	}
	in := r.shards.endInbound(id)
	if in == nil {
		r.installWithLocked(id, l.Epoch, entity.ActivateNew, nil)
		return
	}
	// Ended (and cancelled) first, reported after the install: no report
	// of this takeover can come between (it ended).
	err := in.Advance(handoff.Cutover, nil)
	warmed := in.TakeWarmed()
	n := len(warmed) // the map is hosting's once installed
	r.installWithLocked(id, l.Epoch, entity.ActivateHandoff, warmed)
	if err != nil {
		r.phaseRefused(id, err)
		return
	}
	r.life.endInbound(in, outcomeCutover, l.Epoch, n)
	r.met.handoffs.Add(context.Background(), 1, r.met.attrs, withReason("completed"))
	r.met.handoffPhase.Record(context.Background(), time.Since(in.Started()).Seconds(), r.met.attrs, withPhase("total"))
	r.publishPhase(id, handoff.Cutover, in.From().ID, r.cfg.ID, "")
}

// installWithLocked installs shard id; entities activate with reason and
// may start from warmed instances.
func (r *Runner) installWithLocked(id sharding.ShardID, epoch storage.Epoch, reason entity.ActivateReason, warmed map[hosting.EntityKey]any) {
	if r.shards.owner(id) != nil {
		return
	}
	info := ShardInfo{Runner: r.cfg.ID, Shard: id, Epoch: epoch}
	ctx, cancel := context.WithCancelCause(withShardEnv(r.att.ctx, r, info))
	s := &shard{id: id, epoch: epoch, ctx: ctx, cancel: cancel}
	s.host = r.hosting.NewShard(hosting.ShardSpec{
		ID: id, Epoch: epoch, Ctx: ctx, Attachment: r.att.ctx, Prev: r.shards.at(id).lastHost, Reason: reason, Warmed: warmed,
	})
	r.shards.install(s)
	r.view.stuck.unwatch(id)
	if cur, known := r.view.locks.Get(id); !known || cur.Epoch <= epoch {
		// Our lock, ahead of any watch (without a full view, no watch
		// shows it: a later release or orphan decision reads it here).
		r.view.locks.Set(storage.Lock{Shard: id, Owner: r.owner(), Lease: r.att.lease, Epoch: epoch})
	}
	r.hosting.Install(s.host)
	s.host.StartWorkers()
	r.reminders.Acquired(id, epoch, ctx)
	r.hub.Publish(ShardAcquired{EventBase: r.base(), Shard: id, Epoch: epoch})
	r.shardChangedLocked(id, epoch, false) // parked requests are delivered now
}

// disownLocked ends the ownership of s: it stops being hosted (new
// messages stop finding it, then its context is cancelled with cause:
// running handlers see it, queued messages fail with it) and owned.
func (r *Runner) disownLocked(s *shard, cause error) {
	r.hosting.Uninstall(s.host)
	r.reminders.Stop(s.id, s.epoch, s.plainRelease)
	s.host.Close()
	s.cancel(cause)
	r.shards.disown(s)
	r.shardChangedLocked(s.id, 0, false)
}

// lockLostLocked handles an owned lock that changed behind our back
// (deleted, rewritten or taken by somebody else): that shard alone is
// dropped at once, its context cancelled (ErrShardMoved) before anything
// else, so none of its handlers starts again here. The runner stays
// attached; if the shard is still assigned here it is pending again (a lock
// under our lease gets a new epoch, a deleted or lease-less one is
// acquired, one held by another lease is waited for). Losing the lease
// itself still detaches the whole runner (watchdog, storageResult).
func (r *Runner) lockLostLocked(id sharding.ShardID, detail string) {
	s := r.shards.owner(id)
	if s == nil {
		return
	}
	s.cancel(ErrShardMoved)
	r.disownLocked(s, ErrShardMoved)
	r.hub.Publish(ShardLost{EventBase: r.base(), Shard: id, Epoch: s.epoch, Cause: ErrShardMoved})
	r.lostLocks = append(r.lostLocks, lostLock{shard: id, detail: detail})
}

// dropOwnedLocked cancels every owned shard with cause, in shard order,
// and forgets it; every releasing mark ends.
func (r *Runner) dropOwnedLocked(cause error) {
	for s := range r.shards.ownedShards() {
		r.disownLocked(s, cause)
		r.hub.Publish(ShardLost{EventBase: r.base(), Shard: s.id, Epoch: s.epoch, Cause: cause})
	}
	r.shards.clearAllReleasing()
	r.allChangedLocked(false)
}

// forgetAttachmentLocked takes the shards through a detach: every owned
// shard dropped (ErrDetached), every takeover aborted, then only what
// afterDetach keeps survives.
func (r *Runner) forgetAttachmentLocked() {
	r.dropOwnedLocked(ErrDetached)
	for id := range r.shards.known() { // handoffs never block detachment
		if in := r.shards.endInbound(id); in != nil {
			r.reportInbound(id, in, handoff.Aborted, "detached", abortDetached)
		}
	}
	r.shards.detach()
}
