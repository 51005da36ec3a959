package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/hosting"
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
	ctx       context.Context // cancelled when the handoff is abandoned or completes
	cancel    context.CancelFunc
	started   time.Time
	mu        sync.Mutex
	warmed    map[hosting.EntityKey]any // warmed, not yet activated instances
}

// takeWarmed hands the warmed instances over (once); later warm results
// are dropped.
func (in *inbound) takeWarmed() map[hosting.EntityKey]any {
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
			clear(r.handoffRaw)
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
	prev := r.handoffs[id].Lease
	defer func() {
		if r.concernsLocked(id, prev, r.handoffs[id].Lease) {
			r.markLocked(id)
		}
	}()
	delete(r.handoffRaw, id)
	if t == storage.EventDelete {
		delete(r.handoffs, id)
		r.goodKeyLocked(storage.KeyspaceHandoffs, kv.Key)
		return
	}
	if _, owned := r.owned[id]; !owned && (kv.Lease != r.lease || kv.Lease == storage.NoLease) {
		// Neither ours nor aimed at a shard we own: only its lease and
		// revision matter now, so it is decoded only if its shard becomes
		// ours before the record changes again (handoffLocked) — a record
		// written while this runner was detached, or just before its
		// re-attachment installed the shards it kept.
		r.handoffs[id] = storage.Handoff{Shard: id, Lease: kv.Lease, ModRevision: kv.ModRevision}
		r.handoffRaw[id] = kv
		return
	}
	r.decodeHandoffLocked(id, kv)
}

// decodeHandoffLocked decodes a handoff record into r.handoffs (a corrupt
// one is logged and dropped) and reports whether it is there.
func (r *Runner) decodeHandoffLocked(id sharding.ShardID, kv storage.KeyValue) bool {
	h, err := storage.DecodeHandoff(kv)
	if err != nil {
		r.badKeyLocked(storage.KeyspaceHandoffs, kv.Key, "ignoring a corrupt handoff record", err)
		delete(r.handoffs, id)
		return false
	}
	r.goodKeyLocked(storage.KeyspaceHandoffs, kv.Key)
	r.handoffs[id] = h
	return true
}

// handoffLocked returns shard id's handoff record, decoding it first if
// it arrived while it did not concern this runner.
func (r *Runner) handoffLocked(id sharding.ShardID) (storage.Handoff, bool) {
	if kv, raw := r.handoffRaw[id]; raw {
		delete(r.handoffRaw, id)
		if !r.decodeHandoffLocked(id, kv) {
			return storage.Handoff{}, false
		}
	}
	h, ok := r.handoffs[id]
	return h, ok
}

// inboundItem is one takeover started in a round.
type inboundItem struct {
	id sharding.ShardID
	in *inbound
}

// newInboundLocked registers a takeover of shard id from its live owner
// from; runInbound runs it.
func (r *Runner) newInboundLocked(id sharding.ShardID, from storage.Runner, fromEpoch storage.Epoch) inboundItem {
	ctx, cancel := context.WithCancel(r.attachCtx)
	in := &inbound{from: from, fromEpoch: fromEpoch, ctx: ctx, cancel: cancel, started: time.Now(), warmed: map[hosting.EntityKey]any{}}
	r.inbound[id] = in
	r.log.Debug("handoff: taking shard over", "shard", id, "from", from.ID)
	return inboundItem{id: id, in: in}
}

// runInbound is the new owner's side of the takeovers started in one
// round: record warming (one transaction per MaxShardsPerTxn shards), warm
// every shard (concurrently, bounded), record ready (batched again). The
// cutover itself arrives through the lock watch. A takeover cancelled
// meanwhile (reassigned, detached) is skipped from then on: whoever
// cancelled it cleans up.
func (r *Runner) runInbound(gen uint64, leaseID storage.LeaseID, items []inboundItem) {
	start := time.Now()
	items = r.putInbound(gen, leaseID, items, storage.HandoffWarming)
	for _, it := range items {
		r.publishPhase(it.id, PhaseWarming, it.in.from.ID, r.cfg.ID, "")
	}
	sem := make(chan struct{}, warmParallelism)
	var wg sync.WaitGroup
	timedOut := make([]bool, len(items))
	for i, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			wctx, cancel := context.WithTimeout(it.in.ctx, r.cfg.WarmTimeout)
			defer cancel()
			r.warm(wctx, it.id, it.in)
			timedOut[i] = errors.Is(wctx.Err(), context.DeadlineExceeded) && it.in.ctx.Err() == nil
		})
	}
	wg.Wait()
	ready := items[:0:0]
	for i, it := range items {
		if it.in.ctx.Err() != nil {
			continue // aborted while warming
		}
		r.met.handoffPhase.Record(context.Background(), time.Since(start).Seconds(), r.met.attrs, withPhase("warm"))
		if timedOut[i] {
			if r.cfg.AbortOnWarmTimeout {
				r.abortInbound(gen, leaseID, []inboundItem{it}, fmt.Sprintf("warming exceeded WarmTimeout %v", r.cfg.WarmTimeout), true)
				continue
			}
			r.log.Warn("warming timed out; proceeding cold", "shard", it.id, "from", it.in.from.ID, "timeout", r.cfg.WarmTimeout)
		}
		// Reported before the write: the old owner may act on the record
		// before our call returns, and observers must see ready first.
		r.publishPhase(it.id, PhaseReady, it.in.from.ID, r.cfg.ID, "")
		ready = append(ready, it)
	}
	r.putInbound(gen, leaseID, ready, storage.HandoffReady)
}

// warmParallelism bounds the shards one runner warms at once.
const warmParallelism = 16

// putInbound writes the handoff records of the takeovers still running at
// phase, in batches, aborts those whose write failed and returns the rest.
func (r *Runner) putInbound(gen uint64, leaseID storage.LeaseID, items []inboundItem, phase storage.HandoffPhase) []inboundItem {
	live := items[:0:0]
	puts := make([]storage.HandoffPut, 0, len(items))
	for _, it := range items {
		if it.in.ctx.Err() == nil {
			live = append(live, it)
			puts = append(puts, storage.HandoffPut{Shard: it.id, Record: storage.HandoffRecord{
				From: it.in.from.ID, To: r.cfg.ID, Phase: phase, ToIncarnation: r.incarnation, FromEpoch: it.in.fromEpoch,
			}})
		}
	}
	if len(live) == 0 {
		return nil
	}
	actx := live[0].in.ctx
	cctx, cancel := r.opCtx(actx)
	res, err := r.store.PutHandoffs(cctx, leaseID, puts)
	cancel()
	if res == nil { // invalid arguments: nothing written
		res = make([]storage.HandoffResult, len(puts))
		for i := range res {
			res[i].Err = err
		}
	}
	ok := live[:0:0]
	var failed []inboundItem
	var why error
	for i, it := range live {
		if res[i].Err != nil {
			failed, why = append(failed, it), res[i].Err
			continue
		}
		ok = append(ok, it)
	}
	if len(failed) > 0 {
		// A warming record that failed may still have been written (the
		// outcome of a failed call is unknown): delete what is ours.
		r.abortInbound(gen, leaseID, failed, fmt.Sprintf("record %s: %v", phase, why), true)
	}
	return ok
}

// canWarm reports whether a registered kind's instances can warm.
// warm runs the shard-level WarmShard hook and the entity-level Warm hooks
// of the entities the old owner reports as hot, bounded by ctx.
func (r *Runner) warm(ctx context.Context, id sharding.ShardID, in *inbound) {
	if r.cfg.WarmShard != nil {
		if err := r.cfg.WarmShard(ctx, id, in.from.ID); err != nil {
			r.log.Warn("WarmShard hook failed", "shard", id, "from", in.from.ID, "err", err)
		}
	}
	if in.from.Address == "" || r.cfg.HotSetLimit <= 0 || !r.hosting.CanWarm() {
		return // nothing to ask for: no registered kind can warm
	}
	hot, err := r.net.Hot(ctx, in.from.Address, uint32(id), r.cfg.HotSetLimit)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("cannot list the hot entities to warm", "shard", id, "from", in.from.ID, "err", err)
		}
		return
	}
	keys := make([]hosting.EntityKey, len(hot))
	for i, ref := range hot {
		keys[i] = hosting.EntityKey{Kind: ref.Kind, ID: ref.ID}
	}
	r.hosting.WarmEntities(ctx, id, in.from.ID, keys, func(key hosting.EntityKey, inst any) {
		in.mu.Lock()
		if in.warmed != nil { // nil once installed: late results are dropped
			in.warmed[key] = inst
		}
		in.mu.Unlock()
	})
}

// abortInbound ends takeovers from the goroutine running them; with
// deleteRecords their handoff records are deleted (batched).
func (r *Runner) abortInbound(gen uint64, leaseID storage.LeaseID, items []inboundItem, why string, deleteRecords bool) {
	var records []sharding.ShardID
	r.mu.Lock()
	retry := time.Now().Add(r.cfg.AcquireRetryWindow + r.cfg.AcquireRetryInterval)
	for _, it := range items {
		// Only the current takeover owns the record: a replaced one must
		// not delete its successor's.
		if r.inbound[it.id] != it.in {
			continue
		}
		delete(r.inbound, it.id)
		r.inboundRetry[it.id] = retry
		r.retryLocked(it.id, retry)
		if r.gen == gen {
			records = append(records, it.id)
		}
	}
	actx := r.attachCtx
	r.mu.Unlock()
	for _, it := range items {
		it.in.cancel()
		r.publishPhase(it.id, PhaseAborted, it.in.from.ID, r.cfg.ID, why)
	}
	r.log.Warn("handoff aborted", "shards", len(items), "first", items[0].id, "from", items[0].in.from.ID, "why", why)
	if deleteRecords && len(records) > 0 {
		r.deleteHandoffs(actx, leaseID, records)
	}
}

// deleteHandoffs deletes our handoff records of shards ids (batched). On
// failure the shards are decided again after a pause (the stale-record
// rule retries).
func (r *Runner) deleteHandoffs(actx context.Context, leaseID storage.LeaseID, ids []sharding.ShardID) {
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
		delete(r.deletingHandoff, id)
		r.retryLocked(id, retry)
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
	h, has := r.handoffLocked(s.id)
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

// cutoverItem is one owned shard to hand over with its ready record.
type cutoverItem struct {
	s *shard
	h storage.Handoff
}

// cutover is the old owner's side of the handoffs decided in one round:
// stop admitting (senders wait), drain the shards concurrently, release
// their entities and run ReleaseShard, then move the locks to their new
// owners, one transaction per MaxShardsPerTxn shards, each shard's move
// also deleting its handoff record. A shard whose move fails reopens here
// (or is dropped when the outcome stays unknown).
func (r *Runner) cutover(gen uint64, items []cutoverItem) {
	r.mu.Lock()
	actx, leaseID := r.attachCtx, r.lease
	items = r.stillOwnedLocked(gen, items)
	r.mu.Unlock()
	if len(items) == 0 {
		return
	}
	start := time.Now()
	shards := make([]*shard, len(items))
	for i, it := range items {
		r.log.Debug("handoff: cutting over", "shard", it.s.id, "to", it.h.To)
		it.s.host.BeginCutover(it.h.To)
		shards[i] = it.s
	}
	drainStart := time.Now()
	r.drain(actx, shards, ErrShardMoved)
	items = r.abortBusy(gen, items, time.Since(drainStart))
	var wg sync.WaitGroup
	for _, it := range items {
		wg.Go(func() { r.releaseShardHook(actx, it.s, it.h.To) })
	}
	wg.Wait()
	// Our ownership ends here, before the locks move: observers must never
	// see a new owner start before this.
	r.mu.Lock()
	items = r.stillOwnedLocked(gen, items)
	for _, it := range items {
		r.hub.publish(ShardReleased{EventBase: r.base(), Shard: it.s.id, Epoch: it.s.epoch})
		r.met.handoffPhase.Record(context.Background(), time.Since(start).Seconds(), r.met.attrs, withPhase("drain"))
	}
	r.mu.Unlock()
	if len(items) == 0 {
		return
	}
	reqs := make([]storage.TransferRequest, len(items))
	for i, it := range items {
		r.publishPhase(it.s.id, PhaseDrained, r.cfg.ID, it.h.To, "")
		reqs[i] = storage.TransferRequest{
			Shard: it.s.id, FromLease: leaseID, FromEpoch: it.s.epoch, ToLease: it.h.Lease,
			HandoffRevision: it.h.ModRevision, ToOwner: storage.Owner{RunnerID: it.h.To, Incarnation: it.h.ToIncarnation},
		}
	}
	cutStart := time.Now()
	cctx, cancel := r.opCtx(actx)
	res, err := r.store.Transfer(cctx, reqs)
	cancel()
	if res == nil { // invalid arguments: nothing moved
		res = make([]storage.TransferResult, len(reqs))
		for i := range res {
			res[i] = storage.TransferResult{Shard: reqs[i].Shard, Err: err}
		}
	}
	outcomes := make([]transferOutcome, len(items))
	var unknown []int
	for i, tr := range res {
		outcomes[i] = transferOutcome{moved: tr.Err == nil, definite: definiteTransfer(tr.Err), epoch: tr.Epoch, err: tr.Err}
		if !outcomes[i].definite {
			unknown = append(unknown, i)
		}
	}
	if len(unknown) > 0 {
		// Those transfers may or may not have committed: ask the store
		// (linearizable, read-only) before serving them again.
		r.resolveTransfers(actx, leaseID, items, unknown, outcomes)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, it := range items {
		r.finishCutoverLocked(gen, it, outcomes[i], cutStart)
	}
}

// transferOutcome is what became of one shard's transfer.
type transferOutcome struct {
	moved, definite bool
	epoch           storage.Epoch // the new owner's, when known
	err             error
}

// definiteTransfer reports whether a transfer's error (nil included)
// settles whether the lock moved.
func definiteTransfer(err error) bool {
	return err == nil || errors.Is(err, storage.ErrNoHandoff) || errors.Is(err, storage.ErrLeaseNotFound) ||
		errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalidArgument)
}

// stillOwnedLocked returns the items still owned in attachment gen; the
// others lose their releasing mark (a detach came first: detachment wins).
func (r *Runner) stillOwnedLocked(gen uint64, items []cutoverItem) []cutoverItem {
	out := items[:0:0]
	for _, it := range items {
		if r.gen == gen && r.owned[it.s.id] == it.s {
			out = append(out, it)
			continue
		}
		r.clearReleasingLocked(it.s)
	}
	return out
}

// abortBusy reopens the shards whose handlers still run after their
// drain — moving their locks now could let the new owner run the same
// entities concurrently — and returns the others. A reopened shard keeps
// serving; it is cut over again after as long as the drain took (at least
// ProbeInterval, at most DrainTimeout: a drain cut short by the detach
// instant, its handlers stalled in an etcd leader failover, is retried
// soon, a straggler that outlived DrainTimeout gets as long again), or
// HandoffWait ends in a plain release, which interrupts.
func (r *Runner) abortBusy(gen uint64, items []cutoverItem, drained time.Duration) []cutoverItem {
	retryIn := min(max(drained, r.cfg.ProbeInterval), r.cfg.DrainTimeout)
	out := items[:0:0]
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range items {
		busy := it.s.host.Running()
		if busy == 0 {
			out = append(out, it)
			continue
		}
		r.clearReleasingLocked(it.s)
		if r.gen == gen && r.owned[it.s.id] == it.s {
			it.s.cutoverRetryAt = time.Now().Add(retryIn) // let the straggler finish first
			it.s.host.Reopen()
			r.publishPhase(it.s.id, PhaseAborted, r.cfg.ID, it.h.To, fmt.Sprintf("%d handlers still running after the drain (%v)", busy, drained.Round(time.Millisecond)))
			r.markLocked(it.s.id)
		}
	}
	return out
}

// finishCutoverLocked applies the outcome of one shard's transfer.
func (r *Runner) finishCutoverLocked(gen uint64, it cutoverItem, o transferOutcome, cutStart time.Time) {
	s, h := it.s, it.h
	r.clearReleasingLocked(s)
	if r.gen != gen || r.owned[s.id] != s {
		return // detached meanwhile: detachment wins
	}
	r.markLocked(s.id)
	switch {
	case o.moved:
		r.movedTo[s.id] = h.To
		r.lastReleased[s.id] = s.epoch
		if o.epoch != 0 { // our view, ahead of the watch: not an orphan of ours
			r.locks.Set(storage.Lock{Shard: s.id, Owner: storage.Owner{RunnerID: h.To, Incarnation: h.ToIncarnation}, Lease: h.Lease, Epoch: o.epoch})
			r.sawEpoch(s.id, o.epoch)
		}
		r.disownLocked(s, ErrShardMoved)
		r.met.handoffPhase.Record(context.Background(), time.Since(cutStart).Seconds(), r.met.attrs, withPhase("cutover"))
		r.publishPhase(s.id, PhaseCutover, r.cfg.ID, h.To, "")
	case errors.Is(o.err, storage.ErrNotOwner):
		// Our lock is not ours any more: never serve it again here.
		r.lockLostLocked(s.id, fmt.Sprintf("transfer of shard %d: %v", s.id, o.err))
	case !o.definite:
		// Unknown outcome and the store unreachable: drop the shard (our
		// lock, if it survived, is released by the orphan safety net).
		r.log.Error("handoff transfer outcome unknown; dropping the shard", "shard", s.id, "to", h.To, "err", o.err)
		r.publishPhase(s.id, PhaseAborted, r.cfg.ID, h.To, fmt.Sprintf("transfer outcome unknown: %v", o.err))
		r.disownLocked(s, ErrShardMoved)
	default:
		// The lock is still ours at our epoch: serve again.
		r.log.Warn("handoff transfer failed; the shard reopens here", "shard", s.id, "to", h.To, "err", o.err)
		r.publishPhase(s.id, PhaseAborted, r.cfg.ID, h.To, fmt.Sprintf("transfer: %v", o.err))
		s.unassignedSince = time.Now()
		s.host.Reopen()
		r.hub.publish(ShardAcquired{EventBase: r.base(), Shard: s.id, Epoch: s.epoch}) // serving again
	}
}

// resolveTransfers finds out, read-only, whether our locks of the items
// at indexes idx still stand at their epochs after transfer calls with an
// unknown outcome, and records it in outcomes. It retries until the detach
// instant; outcomes it never learns stay not definite.
func (r *Runner) resolveTransfers(actx context.Context, leaseID storage.LeaseID, items []cutoverItem, idx []int, outcomes []transferOutcome) {
	held := make([]storage.Held, len(idx))
	for k, i := range idx {
		held[k] = storage.Held{Shard: items[i].s.id, Epoch: items[i].s.epoch}
	}
	for attempt := 0; actx.Err() == nil && attempt < 5; attempt++ {
		cctx, cancel := r.opCtx(actx)
		lost, err := r.store.Verify(cctx, leaseID, held)
		cancel()
		if err == nil {
			gone := make(map[sharding.ShardID]bool, len(lost))
			for _, l := range lost {
				gone[l.Shard] = true
			}
			for _, i := range idx {
				outcomes[i].moved, outcomes[i].definite = gone[items[i].s.id], true
			}
			return
		}
		select {
		case <-actx.Done():
		case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
		}
	}
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
