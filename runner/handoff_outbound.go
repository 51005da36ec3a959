package runner

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The old owner's side of a handoff (DESIGN.md "Handoff", step 3): an
// owned shard assigned elsewhere is cut over once its new owner is ready
// (stop admission, drain, release, move the lock in one transaction), or
// released plainly. Its phases and decisions are package handoff's; the
// store calls, drains and the owned shards (shardstate.go) are the runner's.

// outboundDecisionLocked decides (handoff.DecideOutbound), for an owned
// shard assigned elsewhere, whether to cut over now (the new owner is
// ready), release it plainly (no usable handoff in time, or handoff
// disabled), or keep serving until when. The wait for a handoff counts
// from the first round that saw the shard assigned elsewhere.
func (r *Runner) outboundDecisionLocked(s *shard, now time.Time) handoff.Decision {
	if s.unassignedSince.IsZero() {
		s.unassignedSince = now
	}
	assignee := r.view.assignment.Of(s.id)
	d := handoff.DecideOutbound(handoff.Outbound{
		Self: r.cfg.ID, Epoch: s.epoch, Assignee: assignee,
		NoHandoff:       r.cfg.DisableHandoff || r.supersededLocked(),
		UnassignedSince: s.unassignedSince, CutoverRetryAt: s.cutoverRetryAt,
		Now: now, HandoffWait: r.cfg.HandoffWait,
	}, func() (handoff.Seen, bool) {
		h, has := r.view.handoffs[s.id]
		return handoff.Seen{Record: h, Holder: r.view.byLease[h.Lease].ID}, has
	})
	if d.TimedOut {
		h := d.Record
		r.log.Warn("no handoff ready in time; releasing the shard plainly", "shard", s.id, "assignee", assignee,
			"wait", r.cfg.HandoffWait, "record", d.HasRecord, "record_to", h.To, "record_phase", h.Phase, "record_from", h.From)
	}
	return d
}

// cutoverItem is one owned shard to hand over with its ready record, and
// the phase of that handoff on this (the old owner's) side.
type cutoverItem struct {
	s    *shard
	h    storage.Handoff
	m    handoff.Machine
	span trace.Span // its release span (nil: not traced; trace_lifecycle.go)
}

// cutover is the old owner's side of the handoffs decided in one round:
// stop admitting (senders wait) and drain the shards concurrently; each
// shard goes on as soon as its own drain ends — release its entities, run
// ReleaseShard, move its lock to its new owner — with the others whose
// drains ended meanwhile (one transaction per MaxShardsPerTxn shards, each
// shard's move also deleting its handoff record): a shard never waits for
// the slow handlers of another. A shard whose move fails reopens here (or
// is dropped when the outcome stays unknown).
func (r *Runner) cutover(gen uint64, items []cutoverItem) {
	r.mu.Lock()
	actx, leaseID := r.att.ctx, r.att.lease
	items = r.stillOwnedLocked(gen, items)
	r.mu.Unlock()
	if len(items) == 0 {
		return
	}
	start := time.Now()
	r.life.startOutbound(items)
	for _, it := range items {
		r.log.Debug("handoff: cutting over", "shard", it.s.id, "to", it.h.To)
		it.s.host.BeginCutover(it.h.To)
		r.reminders.Pause(it.s.id, it.s.epoch)
	}
	drainStart := time.Now()
	drained := make(chan cutoverItem, len(items))
	var wg sync.WaitGroup
	defer wg.Wait()
	dctx, cancel := r.drainContext(actx)
	defer cancel()
	for _, it := range items {
		wg.Go(func() {
			it.s.host.Drain(dctx, ErrShardMoved)
			drained <- it
		})
	}
	for left := len(items); left > 0; {
		// The next shard drained, and every other that drains within
		// cutoverGather of it (drains of idle shards end together: one
		// transfer for them all).
		batch := []cutoverItem{<-drained}
		gather := time.NewTimer(cutoverGather)
		for more := len(batch) < left; more; {
			select {
			case it := <-drained:
				batch = append(batch, it)
				more = len(batch) < left
			case <-gather.C:
				more = false
			}
		}
		gather.Stop()
		left -= len(batch)
		r.finishCutover(gen, actx, leaseID, batch, start, time.Since(drainStart))
	}
}

// cutoverGather is how long a cutover waits, after a shard's drain ended,
// for other shards' drains before it moves their locks together.
const cutoverGather = 2 * time.Millisecond

// finishCutover is the rest of a cutover for shards whose drains ended,
// drained after drainedIn: reopen those with handlers still running, run
// ReleaseShard, record their reminder progress, and move their locks.
func (r *Runner) finishCutover(gen uint64, actx context.Context, leaseID storage.LeaseID, items []cutoverItem, start time.Time, drainedIn time.Duration) {
	items = r.abortBusy(gen, items, drainedIn)
	outboundEvent(items, tracing.EventDrained)
	if r.cfg.ReleaseShard != nil {
		var wg sync.WaitGroup
		for _, it := range items {
			wg.Go(func() { r.releaseShardHook(actx, it.s, it.h.To) })
		}
		wg.Wait()
		outboundEvent(items, tracing.EventReleaseHook)
	}
	// The drain left no handler running and admission is stopped: no
	// reminder tick of these shards can fire here any more. The new owner
	// must know which did before the locks move.
	items = r.abortUnrecorded(gen, items)
	outboundEvent(items, tracing.EventProgress)
	// Our ownership ends here, before the locks move: observers must never
	// see a new owner start before this.
	r.mu.Lock()
	items = r.stillOwnedLocked(gen, items)
	for _, it := range items {
		r.hub.Publish(ShardReleased{EventBase: r.base(), Shard: it.s.id, Epoch: it.s.epoch})
		r.met.handoffPhase.Record(context.Background(), time.Since(start).Seconds(), r.met.attrs, withPhase("drain"))
	}
	r.mu.Unlock()
	if len(items) == 0 {
		return
	}
	reqs := make([]storage.TransferRequest, len(items))
	for i, it := range items {
		r.reportOutbound(&items[i], handoff.Drained, "", "")
		reqs[i] = storage.TransferRequest{
			Shard: it.s.id, From: r.cfg.ID, FromLease: leaseID, FromEpoch: it.s.epoch, ToLease: it.h.Lease,
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
	outcomes := make([]handoff.Transfer, len(items))
	var unknown []int
	for i, tr := range res {
		outcomes[i] = handoff.TransferOf(tr.Err, tr.Epoch)
		if !outcomes[i].Definite {
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

// stillOwnedLocked returns the items still owned in attachment gen; the
// others lose their releasing mark (a detach came first: detachment wins).
func (r *Runner) stillOwnedLocked(gen uint64, items []cutoverItem) []cutoverItem {
	out := items[:0:0]
	for _, it := range items {
		if r.att.gen == gen && r.shards.owner(it.s.id) == it.s {
			out = append(out, it)
			continue
		}
		r.shards.clearReleasing(it.s.id, it.s.epoch)
		endLife(it.span, outcomeAborted, abortDetached, "detached during the cutover")
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
// HandoffWait ends in a plain release, which interrupts
// (handoff.CutoverRetryIn).
func (r *Runner) abortBusy(gen uint64, items []cutoverItem, drained time.Duration) []cutoverItem {
	retryIn := handoff.CutoverRetryIn(drained, r.cfg.ProbeInterval, r.cfg.DrainTimeout)
	out := items[:0:0]
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range items {
		busy := it.s.host.Running()
		if busy == 0 {
			out = append(out, it)
			continue
		}
		r.reopenLocked(gen, it, retryIn, fmt.Sprintf("%d handlers still running after the drain (%v)", busy, drained.Round(time.Millisecond)), abortBusy)
	}
	return out
}

// reopenLocked gives up the cutover of it: the shard serves here again
// (its reminders fire again once their progress is no longer final) and
// is cut over again after retryIn at the earliest. errType classifies
// why for its span.
func (r *Runner) reopenLocked(gen uint64, it cutoverItem, retryIn time.Duration, why, errType string) {
	r.shards.clearReleasing(it.s.id, it.s.epoch)
	if r.att.gen == gen && r.shards.owner(it.s.id) == it.s {
		it.s.cutoverRetryAt = time.Now().Add(retryIn)
		it.s.host.Reopen()
		r.reminders.Resume(it.s.id, it.s.epoch)
		r.reportOutbound(&it, handoff.Aborted, why, errType)
		r.shardChangedLocked(it.s.id, 0, true)
		return
	}
	endLife(it.span, outcomeAborted, abortDetached, "detached during the cutover")
}

// abortUnrecorded writes the reminder progress of the items' shards and
// reopens those whose progress could not be written: moving their locks
// would let the new owner fire ticks twice or not at all.
func (r *Runner) abortUnrecorded(gen uint64, items []cutoverItem) []cutoverItem {
	shards := make([]*shard, len(items))
	for i, it := range items {
		shards[i] = it.s
	}
	r.mu.Lock()
	actx := r.att.ctx
	r.mu.Unlock()
	failed := r.writeProgress(actx, shards)
	if len(failed) == 0 {
		return items
	}
	out := items[:0:0]
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, it := range items {
		err, bad := failed[it.s.id]
		if !bad {
			out = append(out, it)
			continue
		}
		r.reopenLocked(gen, it, r.cfg.ProbeInterval, fmt.Sprintf("reminder progress not recorded: %v", err), abortProgress)
	}
	return out
}

// finishCutoverLocked applies the outcome of one shard's transfer
// (handoff.Transfer.Verdict).
func (r *Runner) finishCutoverLocked(gen uint64, it cutoverItem, o handoff.Transfer, cutStart time.Time) {
	s, h := it.s, it.h
	r.shards.clearReleasing(s.id, s.epoch)
	if r.att.gen != gen || r.shards.owner(s.id) != s {
		endLife(it.span, outcomeAborted, abortDetached, "detached during the cutover")
		return // detached meanwhile: detachment wins
	}
	seen := storage.Epoch(0) // an epoch the transfer wrote the lock at
	switch o.Verdict() {
	case handoff.Moved:
		r.shards.handedOff(s, h.To)
		if !r.view.full { // no watch will show the move: a hint routes there
			r.view.hints.set(s.id, h.To)
		}
		if o.Epoch != 0 { // our view, ahead of the watch: not an orphan of ours
			r.view.locks.Set(storage.Lock{Shard: s.id, Owner: storage.Owner{RunnerID: h.To, Incarnation: h.ToIncarnation}, Lease: h.Lease, Epoch: o.Epoch})
			seen = o.Epoch
		} else if l, _ := r.view.locks.Get(s.id); l.Lease == r.att.lease && l.Epoch == s.epoch {
			r.view.locks.Del(s.id) // moved, at an epoch a read did not tell: not ours
		}
		r.disownLocked(s, ErrShardMoved)
		r.met.handoffPhase.Record(context.Background(), time.Since(cutStart).Seconds(), r.met.attrs, withPhase("cutover"))
		if it.span != nil && o.Epoch != 0 {
			it.span.SetAttributes(tracing.KeyPeerEpoch.Int64(int64(o.Epoch)))
		}
		r.reportOutbound(&it, handoff.Cutover, "", "")
	case handoff.Lost:
		// Our lock is not ours any more: never serve it again here.
		r.lockLostLocked(s.id, fmt.Sprintf("transfer of shard %d: %v", s.id, o.Err))
		endLife(it.span, outcomeAborted, abortLockLost, fmt.Sprintf("transfer: %v", o.Err))
	case handoff.Unknown:
		// Unknown outcome and the store unreachable: drop the shard (our
		// lock, if it survived, is released by the orphan safety net).
		r.log.Error("handoff transfer outcome unknown; dropping the shard", "shard", s.id, "to", h.To, "err", o.Err)
		r.reportOutbound(&it, handoff.Aborted, fmt.Sprintf("transfer outcome unknown: %v", o.Err), abortUnknown)
		r.disownLocked(s, ErrShardMoved)
	default: // handoff.Reopen
		// The lock is still ours at our epoch: serve again.
		r.log.Warn("handoff transfer failed; the shard reopens here", "shard", s.id, "to", h.To, "err", o.Err)
		r.reportOutbound(&it, handoff.Aborted, fmt.Sprintf("transfer: %v", o.Err), abortTransfer)
		s.unassignedSince = time.Now()
		s.host.Reopen()
		r.reminders.Resume(s.id, s.epoch)
		r.hub.Publish(ShardAcquired{EventBase: r.base(), Shard: s.id, Epoch: s.epoch}) // serving again
	}
	r.shardChangedLocked(s.id, seen, true)
}

// resolveTransfers finds out, read-only, whether our locks of the items
// at indexes idx still stand at their epochs after transfer calls with an
// unknown outcome, and records it in outcomes. It retries until the detach
// instant; outcomes it never learns stay not definite.
func (r *Runner) resolveTransfers(actx context.Context, leaseID storage.LeaseID, items []cutoverItem, idx []int, outcomes []handoff.Transfer) {
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
				outcomes[i].Moved, outcomes[i].Definite = gone[items[i].s.id], true
			}
			return
		}
		select {
		case <-actx.Done():
		case <-time.After(time.Duration(attempt+1) * 50 * time.Millisecond):
		}
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
	rctx = withShardEnv(rctx, r, ShardInfo{Runner: r.cfg.ID, Shard: s.id, Epoch: s.epoch})
	defer func() {
		if p := recover(); p != nil {
			r.log.Error("ReleaseShard hook panicked", "shard", s.id, "panic", p)
		}
	}()
	if err := r.cfg.ReleaseShard(rctx, s.id, to); err != nil {
		r.log.Warn("ReleaseShard hook failed", "shard", s.id, "to", to, "err", err)
	}
}
