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
	r.life.traceInbound(in, to, detail, errType)
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

// followHandoffs keeps r.view.handoffs equal to the handoff records
// addressed to this runner as the shards' old owner (handoffs/{self}/):
// the new owners of its shards write them.
func (r *Runner) followHandoffs(ctx context.Context) {
	ks := storage.HandoffsFrom(r.cfg.ID)
	_ = storage.Follow(ctx, r.store, ks, func(u storage.Update) {
		if u.Err != nil {
			return // the runner watch reports storage trouble
		}
		r.mu.Lock()
		if u.Reset {
			clear(r.view.handoffs)
			r.keys.forget(ks)
			for _, kv := range u.KVs {
				r.applyHandoffLocked(storage.EventPut, kv)
			}
			r.allChangedLocked(true)
		}
		for _, ev := range u.Events {
			r.applyHandoffLocked(ev.Type, ev.KV)
		}
		r.mu.Unlock()
	})
}

// applyHandoffLocked applies one event of a record addressed to this
// runner; the shard is decided again when it owns it.
func (r *Runner) applyHandoffLocked(t storage.EventType, kv storage.KeyValue) {
	ks := storage.HandoffsFrom(r.cfg.ID)
	id, ok := r.keys.shardOf(ks, kv.Key)
	if !ok {
		return
	}
	defer func() { r.shardChangedLocked(id, 0, r.concernsLocked(id)) }()
	if t == storage.EventDelete {
		delete(r.view.handoffs, id)
		r.keys.good(ks, kv.Key)
		return
	}
	h, err := storage.DecodeHandoff(r.cfg.ID, kv)
	if err != nil {
		r.keys.bad(ks, kv.Key, "ignoring a corrupt handoff record", err)
		delete(r.view.handoffs, id)
		return
	}
	r.keys.good(ks, kv.Key)
	r.view.handoffs[id] = h
}

// deleteHandoffs deletes our handoff records refs (batched). On failure
// the shards are decided again after a pause (the stale-record rule
// retries).
func (r *Runner) deleteHandoffs(actx context.Context, leaseID storage.LeaseID, refs []storage.HandoffRef) {
	for chunk := range slices.Chunk(refs, shardsPerCall) { // each call bounded by OpTimeout
		r.deleteHandoffChunk(actx, leaseID, chunk)
	}
}

// deleteHandoffChunk is deleteHandoffs for at most shardsPerCall records.
func (r *Runner) deleteHandoffChunk(actx context.Context, leaseID storage.LeaseID, refs []storage.HandoffRef) {
	r.mu.Lock()
	recs := make([]*ownRecord, len(refs)) // the records these refs name now
	for i, ref := range refs {
		recs[i] = r.shards.at(ref.Shard).record
	}
	r.mu.Unlock()
	cctx, cancel := r.opCtx(actx)
	_, err := r.store.DeleteHandoffs(cctx, leaseID, refs)
	cancel()
	if actx.Err() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		for i, ref := range refs { // deleted, or gone already; a record written since stays
			if rec := r.shards.at(ref.Shard).record; rec != nil && rec == recs[i] && rec.from == ref.From {
				r.shards.recordGone(ref.Shard, rec.rev)
			}
		}
		return
	}
	r.log.Warn("deleting handoff records failed; retrying", "shards", len(refs), "first", refs[0].Shard, "err", err)
	retry := time.Now().Add(r.cfg.AcquireRetryInterval)
	for _, ref := range refs {
		r.shards.recordNotDeleted(ref.Shard)
		r.retryLocked(ref.Shard, retry)
	}
}
