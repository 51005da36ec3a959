package runner

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Handoff phases, as reported by HandoffPhase events.
const (
	// PhaseWarming: the new owner created the handoff record and warms.
	PhaseWarming = "warming"
	// PhaseReady: the new owner finished warming (or gave up waiting).
	PhaseReady = "ready"
	// PhaseDrained: the old owner stopped admitting, drained and released
	// its entities, and ran ReleaseShard.
	PhaseDrained = "drained"
	// PhaseCutover: the lock moved to the new owner (reported by both).
	PhaseCutover = "cutover"
	// PhaseAborted: the handoff was abandoned (Detail says why); the old
	// owner keeps or plainly releases the shard.
	PhaseAborted = "aborted"
)

// HandoffPhase reports a step of a planned move of Shard from one runner
// to another. Runner is the runner reporting it.
type HandoffPhase struct {
	EventBase
	Shard  sharding.ShardID
	Phase  string
	From   string
	To     string
	Detail string
}

// Every phase a runner reports goes through the protocol's state machine
// (handoff.Next): reportInbound for the takeovers this runner runs as the
// new owner, reportOutbound for its cutovers as the old owner. A
// transition the machine refuses is not reported (phaseRefused). The
// names reported are the Phase* constants (handoff.Phase.String; see
// TestHandoffPhaseNamesAreThePublicConstants).

// reportInbound moves the takeover in of shard id to phase to and reports
// it, in the order of the takeover's transitions. Ending the takeover
// cancels its context. It reports whether the transition was legal.
// errType classifies an abort for the takeover's span (error.type).
func (r *Runner) reportInbound(id sharding.ShardID, in *handoff.Inbound, to handoff.Phase, detail, errType string) bool {
	err := in.Advance(to, func() { r.publishPhase(id, to, in.From().ID, r.cfg.ID, detail) })
	if err != nil {
		r.phaseRefused(id, err)
		return false
	}
	r.traceInbound(in, to, detail, errType)
	return true
}

// reportOutbound moves the cutover it to phase to and reports it; an end
// ends its span, errType classifying an abort (error.type).
func (r *Runner) reportOutbound(it *cutoverItem, to handoff.Phase, detail, errType string) {
	if err := it.m.Advance(to); err != nil {
		r.phaseRefused(it.s.id, err)
		return
	}
	r.publishPhase(it.s.id, to, r.cfg.ID, it.h.To, detail)
	switch to {
	case handoff.Cutover:
		endLife(it.span, outcomeCutover, "", "")
	case handoff.Aborted:
		endLife(it.span, outcomeAborted, errType, detail)
	}
}

// phaseRefused logs a phase the state machine refused: a late report (the
// handoff already ended: a concurrent end came first) at DEBUG, an illegal
// transition (a bug) at ERROR.
func (r *Runner) phaseRefused(id sharding.ShardID, err error) {
	if errors.Is(err, handoff.ErrEnded) {
		r.log.Debug("handoff: phase not reported, the handoff already ended", "shard", id, "err", err)
		return
	}
	r.log.Error("handoff: illegal phase transition refused", "shard", id, "err", err)
}

// publishPhase reports a phase as a HandoffPhase event; only reportInbound
// and reportOutbound call it, after the state machine accepted the phase.
func (r *Runner) publishPhase(id sharding.ShardID, phase handoff.Phase, from, to, detail string) {
	if phase == handoff.Aborted { // every abort, by either side, counts once
		r.met.handoffs.Add(context.Background(), 1, r.met.attrs, withReason("aborted"))
	}
	r.hub.Publish(HandoffPhase{EventBase: r.base(), Shard: id, Phase: phase.String(), From: from, To: to, Detail: detail})
}

// followHandoffs keeps r.view.handoffs equal to the handoff records.
func (r *Runner) followHandoffs(ctx context.Context) {
	_ = storage.Follow(ctx, r.store, storage.KeyspaceHandoffs, func(u storage.Update) {
		if u.Err != nil {
			return // the lock and runner watches report storage trouble
		}
		r.mu.Lock()
		if u.Reset {
			clear(r.view.handoffs)
			clear(r.view.handoffRaw)
			r.forgetBadKeysLocked(storage.KeyspaceHandoffs)
			for _, kv := range u.KVs {
				r.applyHandoffLocked(storage.EventPut, kv)
			}
			r.markAllLocked()
		}
		for _, ev := range u.Events {
			r.applyHandoffLocked(ev.Type, ev.KV)
		}
		r.mu.Unlock()
	})
}

func (r *Runner) applyHandoffLocked(t storage.EventType, kv storage.KeyValue) {
	id, ok := r.shardOfKeyLocked(storage.KeyspaceHandoffs, kv.Key)
	if !ok {
		return
	}
	prev := r.view.handoffs[id].Lease
	defer func() {
		if r.concernsLocked(id, prev, r.view.handoffs[id].Lease) {
			r.markLocked(id)
		}
	}()
	delete(r.view.handoffRaw, id)
	if t == storage.EventDelete {
		delete(r.view.handoffs, id)
		r.goodKeyLocked(storage.KeyspaceHandoffs, kv.Key)
		return
	}
	if r.shards.owner(id) == nil && (kv.Lease != r.lease || kv.Lease == storage.NoLease) {
		// Neither ours nor aimed at a shard we own: only its lease and
		// revision matter now, so it is decoded only if its shard becomes
		// ours before the record changes again (handoffLocked) — a record
		// written while this runner was detached, or just before its
		// re-attachment installed the shards it kept.
		r.view.handoffs[id] = storage.Handoff{Shard: id, Lease: kv.Lease, ModRevision: kv.ModRevision}
		r.view.handoffRaw[id] = kv
		return
	}
	r.decodeHandoffLocked(id, kv)
}

// decodeHandoffLocked decodes a handoff record into r.view.handoffs (a corrupt
// one is logged and dropped) and reports whether it is there.
func (r *Runner) decodeHandoffLocked(id sharding.ShardID, kv storage.KeyValue) bool {
	h, err := storage.DecodeHandoff(kv)
	if err != nil {
		r.badKeyLocked(storage.KeyspaceHandoffs, kv.Key, "ignoring a corrupt handoff record", err)
		delete(r.view.handoffs, id)
		return false
	}
	r.goodKeyLocked(storage.KeyspaceHandoffs, kv.Key)
	r.view.handoffs[id] = h
	return true
}

// handoffLocked returns shard id's handoff record, decoding it first if
// it arrived while it did not concern this runner.
func (r *Runner) handoffLocked(id sharding.ShardID) (storage.Handoff, bool) {
	if kv, raw := r.view.handoffRaw[id]; raw {
		delete(r.view.handoffRaw, id)
		if !r.decodeHandoffLocked(id, kv) {
			return storage.Handoff{}, false
		}
	}
	h, ok := r.view.handoffs[id]
	return h, ok
}

// deleteHandoffs deletes our handoff records of shards ids (batched). On
// failure the shards are decided again after a pause (the stale-record
// rule retries).
func (r *Runner) deleteHandoffs(actx context.Context, leaseID storage.LeaseID, ids []sharding.ShardID) {
	for chunk := range slices.Chunk(ids, shardsPerCall) { // each call bounded by OpTimeout
		r.deleteHandoffChunk(actx, leaseID, chunk)
	}
}

// deleteHandoffChunk is deleteHandoffs for at most shardsPerCall records.
func (r *Runner) deleteHandoffChunk(actx context.Context, leaseID storage.LeaseID, ids []sharding.ShardID) {
	cctx, cancel := r.opCtx(actx)
	_, err := r.store.DeleteHandoffs(cctx, leaseID, ids)
	cancel()
	if err == nil || actx.Err() != nil {
		return
	}
	r.log.Warn("deleting handoff records failed; retrying", "shards", len(ids), "first", ids[0], "err", err)
	r.mu.Lock()
	defer r.mu.Unlock()
	retry := time.Now().Add(r.cfg.AcquireRetryInterval)
	for _, id := range ids {
		r.shards.recordNotDeleted(id)
		r.retryLocked(id, retry)
	}
}
