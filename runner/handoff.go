package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
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

// inbound is a handoff this runner (the new owner) is running.
type inbound struct {
	from      storage.Runner
	fromEpoch storage.Epoch
	cancel    context.CancelFunc
	started   time.Time
	mu        sync.Mutex
	warmed    map[entityKey]any // warmed, not yet activated instances
}

// takeWarmed hands the warmed instances over (once); later warm results
// are dropped.
func (in *inbound) takeWarmed() map[entityKey]any {
	in.mu.Lock()
	defer in.mu.Unlock()
	w := in.warmed
	in.warmed = nil
	return w
}

func (r *Runner) publishPhase(id sharding.ShardID, phase, from, to, detail string) {
	if phase == PhaseAborted { // every abort, by either side, counts once
		r.met.handoffs.Add(context.Background(), 1, r.met.attrs, withReason("aborted"))
	}
	r.hub.publish(HandoffPhase{EventBase: r.base(), Shard: id, Phase: phase, From: from, To: to, Detail: detail})
}

// followHandoffs keeps r.handoffs equal to the handoff records.
func (r *Runner) followHandoffs(ctx context.Context) {
	_ = storage.Follow(ctx, r.store, storage.KeyspaceHandoffs, func(u storage.Update) {
		if u.Err != nil {
			return // the lock and runner watches report storage trouble
		}
		r.mu.Lock()
		if u.Reset {
			clear(r.handoffs)
			r.forgetBadKeysLocked(storage.KeyspaceHandoffs)
			for _, kv := range u.KVs {
				r.applyHandoffLocked(storage.EventPut, kv)
			}
		}
		for _, ev := range u.Events {
			r.applyHandoffLocked(ev.Type, ev.KV)
		}
		r.mu.Unlock()
		signal(r.kick)
	})
}

func (r *Runner) applyHandoffLocked(t storage.EventType, kv storage.KeyValue) {
	id, ok := r.shardOfKeyLocked(storage.KeyspaceHandoffs, kv.Key)
	if !ok {
		return
	}
	if t == storage.EventDelete {
		delete(r.handoffs, id)
		r.goodKeyLocked(storage.KeyspaceHandoffs, kv.Key)
		return
	}
	h, err := storage.DecodeHandoff(kv)
	if err != nil {
		r.badKeyLocked(storage.KeyspaceHandoffs, kv.Key, "ignoring a corrupt handoff record", err)
		delete(r.handoffs, id)
		return
	}
	r.goodKeyLocked(storage.KeyspaceHandoffs, kv.Key)
	r.handoffs[id] = h
}

// startInboundLocked begins taking shard id over from its live owner from.
func (r *Runner) startInboundLocked(bg *sync.WaitGroup, id sharding.ShardID, from storage.Runner, fromEpoch storage.Epoch) {
	ctx, cancel := context.WithCancel(r.attachCtx)
	in := &inbound{from: from, fromEpoch: fromEpoch, cancel: cancel, started: time.Now(), warmed: map[entityKey]any{}}
	r.inbound[id] = in
	r.log.Debug("handoff: taking shard over", "shard", id, "from", from.ID)
	gen, leaseID := r.gen, r.lease
	bg.Go(func() { r.runInbound(ctx, gen, leaseID, id, in) })
}

// runInbound is the new owner's side: record warming, warm, record ready.
// The cutover itself arrives through the lock watch.
func (r *Runner) runInbound(ctx context.Context, gen uint64, leaseID storage.LeaseID, id sharding.ShardID, in *inbound) {
	rec := storage.HandoffRecord{From: in.from.ID, To: r.cfg.ID, Phase: storage.HandoffWarming, ToIncarnation: r.incarnation, FromEpoch: in.fromEpoch}
	start := time.Now()
	cctx, cancel := r.opCtx(ctx)
	_, err := r.store.PutHandoff(cctx, leaseID, id, rec)
	cancel()
	if err != nil {
		r.abortInbound(gen, id, in, fmt.Sprintf("record warming: %v", err), false)
		return
	}
	r.publishPhase(id, PhaseWarming, in.from.ID, r.cfg.ID, "")
	wctx, wcancel := context.WithTimeout(ctx, r.cfg.WarmTimeout)
	r.warm(wctx, id, in)
	timedOut := errors.Is(wctx.Err(), context.DeadlineExceeded)
	wcancel()
	if ctx.Err() != nil {
		return // aborted (reassigned, detached): whoever cancelled cleans up
	}
	r.met.handoffPhase.Record(context.Background(), time.Since(start).Seconds(), r.met.attrs, withPhase("warm"))
	if timedOut {
		if r.cfg.AbortOnWarmTimeout {
			r.abortInbound(gen, id, in, fmt.Sprintf("warming exceeded WarmTimeout %v", r.cfg.WarmTimeout), true)
			return
		}
		r.log.Warn("warming timed out; proceeding cold", "shard", id, "from", in.from.ID, "timeout", r.cfg.WarmTimeout)
	}
	// Reported before the write: the old owner may act on the record
	// before our call returns, and observers must see ready first.
	r.publishPhase(id, PhaseReady, in.from.ID, r.cfg.ID, "")
	rec.Phase = storage.HandoffReady
	cctx, cancel = r.opCtx(ctx)
	_, err = r.store.PutHandoff(cctx, leaseID, id, rec)
	cancel()
	if err != nil {
		r.abortInbound(gen, id, in, fmt.Sprintf("record ready: %v", err), true)
	}
}

// warm runs the shard-level WarmShard hook and the entity-level Warm hooks
// of the entities the old owner reports as hot, bounded by ctx.
func (r *Runner) warm(ctx context.Context, id sharding.ShardID, in *inbound) {
	if r.cfg.WarmShard != nil {
		if err := r.cfg.WarmShard(ctx, id, in.from.ID); err != nil {
			r.log.Warn("WarmShard hook failed", "shard", id, "from", in.from.ID, "err", err)
		}
	}
	if in.from.Address == "" || r.cfg.HotSetLimit <= 0 {
		return
	}
	hot, err := r.transport.hot(ctx, in.from.Address, id, r.cfg.HotSetLimit)
	if err != nil {
		r.log.Warn("cannot list the hot entities to warm", "shard", id, "from", in.from.ID, "err", err)
		return
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, ref := range hot {
		k := r.kind(ref.Kind)
		if k == nil {
			continue
		}
		inst := k.desc.New(ref.ID)
		w, ok := inst.(entity.Warmer)
		if !ok {
			continue
		}
		key := entityKey{kind: ref.Kind, id: ref.ID}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer func() {
				if p := recover(); p != nil {
					r.log.Warn("entity Warm hook panicked", "kind", key.kind, "shard", id, "panic", p)
				}
			}()
			err := w.Warm(ctx, entity.WarmInfo{Entity: key.id, Shard: id, From: in.from.ID, Restore: r.restoreFunc(id, key)})
			if err != nil {
				r.log.Debug("entity Warm hook failed", "kind", key.kind, "shard", id, "err", err)
				return
			}
			in.mu.Lock()
			if in.warmed != nil { // nil once installed: late results are dropped
				in.warmed[key] = inst
			}
			in.mu.Unlock()
		})
	}
	wg.Wait()
}

// abortInbound ends an inbound handoff from its own goroutine.
func (r *Runner) abortInbound(gen uint64, id sharding.ShardID, in *inbound, why string, deleteRecord bool) {
	r.mu.Lock()
	current := r.inbound[id] == in
	if current {
		delete(r.inbound, id)
		r.inboundRetry[id] = time.Now().Add(r.cfg.AcquireRetryWindow + r.cfg.AcquireRetryInterval)
	}
	// Only the current inbound owns the record: a replaced one must not
	// delete its successor's.
	actx, leaseID, same := r.attachCtx, r.lease, r.gen == gen && current
	r.mu.Unlock()
	in.cancel()
	r.publishPhase(id, PhaseAborted, in.from.ID, r.cfg.ID, why)
	r.log.Warn("handoff aborted", "shard", id, "from", in.from.ID, "why", why)
	if deleteRecord && same {
		r.deleteHandoff(actx, leaseID, id)
	}
}

// cancelInboundLocked abandons an inbound handoff (the shard was assigned
// elsewhere); its record is deleted in the background.
func (r *Runner) cancelInboundLocked(bg *sync.WaitGroup, id sharding.ShardID, in *inbound, why string) {
	delete(r.inbound, id)
	in.cancel()
	actx, leaseID := r.attachCtx, r.lease
	r.publishPhase(id, PhaseAborted, in.from.ID, r.cfg.ID, why)
	bg.Go(func() { r.deleteHandoff(actx, leaseID, id) })
}

func (r *Runner) deleteHandoff(actx context.Context, leaseID storage.LeaseID, id sharding.ShardID) {
	cctx, cancel := r.opCtx(actx)
	defer cancel()
	if _, err := r.store.DeleteHandoff(cctx, leaseID, id); err != nil && actx.Err() == nil {
		r.log.Warn("deleting a handoff record failed; it goes with the lease", "shard", id, "err", err)
	}
}

// installInboundLocked installs a lock that appeared under our lease in the
// watch, completing the inbound handoff if there is one.
func (r *Runner) installInboundLocked(id sharding.ShardID, l storage.Lock) {
	if !r.mayOwnLocked() {
		return
	}
	in := r.inbound[id]
	if in == nil {
		r.installWithLocked(id, l.Epoch, entity.ActivateNew, nil)
		return
	}
	delete(r.inbound, id)
	in.cancel()
	r.installWithLocked(id, l.Epoch, entity.ActivateHandoff, in.takeWarmed())
	r.met.handoffs.Add(context.Background(), 1, r.met.attrs, withReason("completed"))
	r.met.handoffPhase.Record(context.Background(), time.Since(in.started).Seconds(), r.met.attrs, withPhase("total"))
	r.publishPhase(id, PhaseCutover, in.from.ID, r.cfg.ID, "")
}

// outboundDecisionLocked decides, for an owned shard assigned elsewhere,
// whether to cut over now (the new owner is ready), release it plainly (no
// usable handoff in time, or handoff disabled), or keep serving. It
// returns the handoff record to cut over with, or plain=true.
func (r *Runner) outboundDecisionLocked(s *shard, now time.Time) (h storage.Handoff, cutover, plain bool) {
	if s.unassignedSince.IsZero() {
		s.unassignedSince = now
	}
	assignee := ""
	if int(s.id) < len(r.assignment) {
		assignee = r.assignment[s.id]
	}
	if r.cfg.DisableHandoff || assignee == "" || r.supersededLocked() {
		return h, false, true
	}
	h, has := r.handoffs[s.id]
	target, live := r.byLease[h.Lease]
	valid := has && h.From == r.cfg.ID && h.FromEpoch == s.epoch && live && target.ID == assignee && h.To == assignee
	switch {
	case valid && h.Phase == storage.HandoffReady && !now.Before(s.cutoverRetryAt):
		return h, true, false
	case now.Sub(s.unassignedSince) >= r.cfg.HandoffWait:
		r.log.Warn("no handoff ready in time; releasing the shard plainly", "shard", s.id, "assignee", assignee,
			"wait", r.cfg.HandoffWait, "record", has, "record_to", h.To, "record_phase", h.Phase, "record_from", h.From)
		return h, false, true
	default:
		return h, false, false
	}
}

// cutover is the old owner's side of a handoff: stop admitting (senders
// wait), drain, release the entities and the shard, then move the lock to
// the new owner in one transaction that also deletes the handoff record.
// On failure the shard reopens here.
func (r *Runner) cutover(gen uint64, s *shard, h storage.Handoff) {
	r.mu.Lock()
	if r.gen != gen || r.owned[s.id] != s {
		r.clearReleasingLocked(s)
		r.mu.Unlock()
		return
	}
	actx, leaseID := r.attachCtx, r.lease
	r.mu.Unlock()

	start := time.Now()
	r.log.Debug("handoff: cutting over", "shard", s.id, "to", h.To)
	s.host.beginCutover(h.To)
	r.drain(actx, []*shard{s}, ErrShardMoved)
	if busy := s.host.running.Load(); busy > 0 {
		// Handlers still run after DrainTimeout: moving the lock now could
		// let the new owner run the same entities concurrently. Keep
		// serving; HandoffWait ends in a plain release, which interrupts.
		r.mu.Lock()
		defer r.mu.Unlock()
		defer signal(r.kick) // decide again (retry, or HandoffWait's plain release)
		r.clearReleasingLocked(s)
		if r.gen == gen && r.owned[s.id] == s {
			s.cutoverRetryAt = time.Now().Add(r.cfg.DrainTimeout) // let the straggler finish first
			s.host.reopen()
			r.publishPhase(s.id, PhaseAborted, r.cfg.ID, h.To, fmt.Sprintf("%d handlers still running after DrainTimeout", busy))
		}
		return
	}
	r.releaseShardHook(actx, s, h.To)
	r.met.handoffPhase.Record(context.Background(), time.Since(start).Seconds(), r.met.attrs, withPhase("drain"))
	// Our ownership ends here, before the lock moves: observers must never
	// see the new owner start before this.
	r.mu.Lock()
	if r.gen != gen || r.owned[s.id] != s {
		r.clearReleasingLocked(s)
		r.mu.Unlock()
		return
	}
	r.hub.publish(ShardReleased{EventBase: r.base(), Shard: s.id, Epoch: s.epoch})
	r.mu.Unlock()
	r.publishPhase(s.id, PhaseDrained, r.cfg.ID, h.To, "")

	cutStart := time.Now()
	to := storage.Owner{RunnerID: h.To, Incarnation: h.ToIncarnation}
	cctx, cancel := r.opCtx(actx)
	epoch, err := r.store.Transfer(cctx, storage.TransferRequest{
		Shard: s.id, FromLease: leaseID, FromEpoch: s.epoch, ToLease: h.Lease,
		HandoffRevision: h.ModRevision, ToOwner: to,
	})
	cancel()
	moved := err == nil
	definite := err == nil || errors.Is(err, storage.ErrNoHandoff) || errors.Is(err, storage.ErrLeaseNotFound) ||
		errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalidArgument)
	if !definite {
		// The transfer may or may not have committed: ask the store
		// (linearizable, read-only) before serving again.
		moved, definite = r.resolveTransfer(actx, leaseID, s)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	defer signal(r.kick)
	r.clearReleasingLocked(s)
	if r.gen != gen || r.owned[s.id] != s {
		return // detached meanwhile: detachment wins
	}
	switch {
	case moved:
		r.movedTo[s.id] = h.To
		r.lastReleased[s.id] = s.epoch
		if epoch != 0 { // our view, ahead of the watch: not an orphan of ours
			r.locks[s.id] = storage.Lock{Shard: s.id, Owner: to, Lease: h.Lease, Epoch: epoch}
		}
		r.disownLocked(s, ErrShardMoved)
		r.met.handoffPhase.Record(context.Background(), time.Since(cutStart).Seconds(), r.met.attrs, withPhase("cutover"))
		r.publishPhase(s.id, PhaseCutover, r.cfg.ID, h.To, "")
	case errors.Is(err, storage.ErrNotOwner):
		// Our lock is not ours any more: never serve it again here.
		r.lockLostLocked(s.id, fmt.Sprintf("transfer of shard %d: %v", s.id, err))
	case !definite:
		// Unknown outcome and the store unreachable: drop the shard (our
		// lock, if it survived, is released by the orphan safety net).
		r.log.Error("handoff transfer outcome unknown; dropping the shard", "shard", s.id, "to", h.To, "err", err)
		r.publishPhase(s.id, PhaseAborted, r.cfg.ID, h.To, fmt.Sprintf("transfer outcome unknown: %v", err))
		r.disownLocked(s, ErrShardMoved)
	default:
		// The lock is still ours at our epoch: serve again.
		r.log.Warn("handoff transfer failed; the shard reopens here", "shard", s.id, "to", h.To, "err", err)
		r.publishPhase(s.id, PhaseAborted, r.cfg.ID, h.To, fmt.Sprintf("transfer: %v", err))
		s.unassignedSince = time.Now()
		s.host.reopen()
		r.hub.publish(ShardAcquired{EventBase: r.base(), Shard: s.id, Epoch: s.epoch}) // serving again
	}
}

// resolveTransfer finds out, read-only, whether our lock of s still stands
// at its epoch after a transfer call with an unknown outcome. It retries
// until the detach instant; known is false if the store never answered.
func (r *Runner) resolveTransfer(actx context.Context, leaseID storage.LeaseID, s *shard) (moved, known bool) {
	for attempt := 0; actx.Err() == nil && attempt < 5; attempt++ {
		cctx, cancel := r.opCtx(actx)
		lost, err := r.store.Verify(cctx, leaseID, []storage.Held{{Shard: s.id, Epoch: s.epoch}})
		cancel()
		if err == nil {
			return len(lost) > 0, true
		}
		select {
		case <-actx.Done():
		case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
		}
	}
	return false, false
}

// clearReleasingLocked ends the releasing mark of s (if it is still ours).
func (r *Runner) clearReleasingLocked(s *shard) {
	if e, ok := r.releasing[s.id]; ok && e == s.epoch {
		delete(r.releasing, s.id)
	}
}

// releaseShardHook runs the ReleaseShard hook for s (epoch still valid),
// bounded by DrainTimeout and the detach instant; its context carries the
// shard's ShardInfo (for fenced shard-level writes at info.Epoch).
func (r *Runner) releaseShardHook(actx context.Context, s *shard, to string) {
	if r.cfg.ReleaseShard == nil {
		return
	}
	rctx, cancel := r.boundedCtx(actx, r.cfg.DrainTimeout)
	defer cancel()
	rctx = context.WithValue(rctx, shardInfoKey{}, ShardInfo{Runner: r.cfg.ID, Shard: s.id, Epoch: s.epoch})
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("ReleaseShard hook panicked", "shard", s.id, "panic", p)
		}
	}()
	if err := r.cfg.ReleaseShard(rctx, s.id, to); err != nil {
		r.log.Warn("ReleaseShard hook failed", "shard", s.id, "to", to, "err", err)
	}
}

// restoreFunc reads an entity's checkpoint in shard id.
func (r *Runner) restoreFunc(id sharding.ShardID, key entityKey) func(context.Context) ([]byte, bool, error) {
	return func(ctx context.Context) ([]byte, bool, error) {
		cp, ok, err := r.store.ReadCheckpoint(ctx, id, checkpointName(key))
		return cp.Data, ok, err
	}
}
