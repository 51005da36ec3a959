package runner

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/internal/control"
	"github.com/shardhost/shardhost/internal/handoff"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The control loop is a controller over a work queue of shards (see
// control.Queue). Its work per event is proportional to what the event
// changed, never to the size of the cluster:
//
//   - Events become dirty shards in one place, markLocked: a lock or
//     handoff record of the shard changed (watches), an operation on it
//     finished, a per-shard timer fired. Only a membership change (a new
//     assignment), an attach, a lock listing and the periodic resync mark
//     every shard — one O(shards) pass, not one per event.
//   - A round takes the dirty shards and decides each one in decideLocked,
//     a small function per concern (acquire, take over by handoff, hand
//     off or release, delete what we no longer want). Decisions are
//     collected in a plan and carried out, batched, once r.mu is released.
//   - A shard that must be looked at again later (an acquire retry, the
//     end of HandoffWait) asks for a timer instead of being rescanned.
//
// Membership storms: after a membership change the runner starts no new
// move — no acquisition, handoff or release — until it has recomputed the
// assignment, and it recomputes once its view has been quiet for
// RebalanceDebounce, 5 x for a runner that owns nothing yet (at most 10 x
// RebalanceDebounce after the first change not acted on, 50 x for a runner
// that owns nothing; a runner that owns nothing but joins a cluster whose
// every shard is locked by a live runner follows the owners' rule: it has
// nothing to take directly, and no cold start is under way), so it never
// hands shards towards a runner while
// its own view of the assignment is still changing, and a record rewritten
// twice in a row (a repair) moves nothing. An isolated departure — a
// runner left after a quiet period: its lease ended, its shards are free —
// is acted on at once. A runner's first assignment always waits for a
// quiet view, so runners starting together take their final shards
// directly instead of handing them around.

// controlLoop acquires assigned shards, releases unassigned ones and
// verifies owned locks. It is the only goroutine that writes locks while
// attached; it does nothing while starting or detached.
func (r *Runner) controlLoop(ctx context.Context) {
	var bg sync.WaitGroup // operations in flight
	defer bg.Wait()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	verify := time.NewTicker(r.cfg.VerifyInterval)
	resync := time.NewTicker(r.cfg.ResyncInterval)
	defer func() { timer.Stop(); debounce.Stop(); verify.Stop(); resync.Stop() }()
	var storm control.StormGate
	stopReq := r.stopReq
	var handoffDeadline time.Time // while Shutdown hands shards off
	for {
		if !handoffDeadline.IsZero() && (r.ownedCount() == 0 || !time.Now().Before(handoffDeadline)) {
			bg.Wait()
			r.shutdown(ctx)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-stopReq:
			stopReq = nil
			r.cancelAllInbound()
			if handoffDeadline = r.beginDrainMode(); handoffDeadline.IsZero() {
				bg.Wait()
				r.shutdown(ctx)
				return
			}
			timer.Reset(r.cfg.AcquireRetryInterval)
			continue
		case <-r.rebalance:
			departure, owns := r.viewChange()
			if now, quiet := storm.Change(time.Now(), r.cfg.RebalanceDebounce, departure, owns); now {
				debounce.Stop()
				r.recompute()
			} else {
				debounce.Reset(quiet)
			}
		case <-debounce.C:
			storm.Settled()
			r.recompute()
		case <-r.kick:
		case <-timer.C:
		case <-verify.C:
			r.verify()
		case <-resync.C:
			r.resync()
		}
		if next, ok := r.round(&bg); ok {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
	}
}

// viewChange reports (and forgets) whether a member left the view while
// this runner has an assignment to act on, and whether it acts like an
// owner on membership changes: it owns shards, or it owns none but joins
// a settled cluster (every shard locked by another live runner: nothing
// to take directly, every move a handoff, and no cold start under way).
func (r *Runner) viewChange() (departure, owns bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	departure = r.view.departed && r.view.assignedWithSelf
	r.view.departed = false
	return departure, len(r.owned) > 0 || r.clusterSettledLocked()
}

// clusterSettledLocked reports whether every shard is locked by a live
// runner other than this one. O(shards), asked only by a runner that owns
// nothing, once per membership change.
func (r *Runner) clusterSettledLocked() bool {
	return r.view.locks.SettledElsewhere(r.lease, r.view.byLease)
}

// resync is the safety net: every pending acquisition gets a fresh retry
// window and every shard is decided again.
func (r *Runner) resync() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.pending {
		*p = pending{since: time.Now()}
	}
	r.recomputeLocked()
	r.markAllLocked()
}

// markLocked is where events become work: shard id is decided again in the
// next round.
func (r *Runner) markLocked(id sharding.ShardID) {
	r.work.Add(id)
	signal(r.kick)
}

// markAllLocked asks for a full reconcile in the next round.
func (r *Runner) markAllLocked() {
	r.work.AddAll()
	signal(r.kick)
}

// retryLocked asks for shard id to be decided again at t (the loop re-arms
// its timer in the next round).
func (r *Runner) retryLocked(id sharding.ShardID, t time.Time) {
	r.work.After(id, t)
	signal(r.kick)
}

// concernsLocked reports whether a change to shard id's lock or handoff
// record can change a decision of this runner: the shard is assigned,
// owned, pending, taken over or released here, or its lock is (or was)
// under this runner's lease.
func (r *Runner) concernsLocked(id sharding.ShardID, leases ...storage.LeaseID) bool {
	if _, ok := r.owned[id]; ok {
		return true
	}
	if r.pending[id] != nil || r.inbound[id] != nil {
		return true
	}
	if _, ok := r.releasing[id]; ok {
		return true
	}
	for _, l := range leases {
		if l == r.lease && l != storage.NoLease {
			return true
		}
	}
	return int(id) < len(r.view.assignment) && r.view.assignment[id] == r.cfg.ID
}

// plan collects the decisions of one round, carried out after r.mu is
// released.
type plan struct {
	acquire  []sharding.ShardID
	release  []sharding.ShardID
	cutovers []cutoverItem
	orphans  []storage.Held
	inbound  []inboundItem
	records  []sharding.ShardID // our handoff records to delete
}

// roundState is what every decision of a round reads.
type roundState struct {
	now        time.Time
	lease      storage.LeaseID
	registered bool // the view holds this incarnation under its lease
	superseded bool // another incarnation took this runner's ID
}

// round decides every dirty shard and starts what was decided. It returns
// when the next per-shard timer is due.
func (r *Runner) round(bg *sync.WaitGroup) (time.Time, bool) {
	defer r.logOwnershipChanges() // one INFO line per round (ownershiplog.go)
	r.mu.Lock()
	if r.phase != phaseAttached || r.stopping {
		r.mu.Unlock()
		return time.Time{}, false
	}
	now := time.Now()
	next, hasNext := r.work.Fire(now)
	if r.view.viewChanging {
		// A membership change is not acted on yet (storm): decide later,
		// on the assignment of a quiet view (recompute marks everything).
		r.mu.Unlock()
		return next, hasNext
	}
	gen, actx, leaseID := r.gen, r.attachCtx, r.lease
	st := roundState{
		now: now, lease: leaseID,
		registered: r.registeredLocked(), superseded: r.supersededLocked(),
	}
	ids, all := r.work.Take()
	var p plan
	if all {
		for id := range r.cfg.NumShards {
			r.decideLocked(sharding.ShardID(id), &st, &p)
		}
	} else {
		for _, id := range ids {
			r.decideLocked(id, &st, &p)
		}
	}
	next, hasNext = r.work.Fire(now)
	r.mu.Unlock()
	r.execute(bg, gen, actx, leaseID, &p)
	return next, hasNext
}

// decideLocked decides shard id: the one place where a dirty shard becomes
// decisions.
func (r *Runner) decideLocked(id sharding.ShardID, st *roundState, p *plan) {
	want := st.registered && !r.drainMode && r.assignedHereLocked(id)
	r.decidePendingLocked(id, want, st, p)
	r.decideInboundLocked(id, want, p)
	if s, ok := r.owned[id]; ok {
		r.decideOwnedLocked(s, want, st, p)
	}
	r.decideOrphanLocked(id, want, st, p)
	r.decideRecordLocked(id, st, p)
}

// decidePendingLocked handles an assigned shard this runner does not own:
// it is acquired when free (or held by a dead incarnation, retried every
// AcquireRetryInterval within AcquireRetryWindow) and taken over by
// handoff when another live runner holds it.
func (r *Runner) decidePendingLocked(id sharding.ShardID, want bool, st *roundState, p *plan) {
	_, owned := r.owned[id]
	_, leaving := r.releasing[id]
	pd := r.pending[id]
	switch {
	case !want:
		delete(r.pending, id)
		return
	case owned:
		return
	case pd == nil && leaving:
		return // pending again once the release finished (deleteLocks marks it)
	case pd == nil:
		pd = &pending{since: st.now}
		r.pending[id] = pd
	}
	if l, held := r.view.locks.Get(id); held && l.Lease != st.lease {
		if from, live := r.view.byLease[l.Lease]; live && from.ID != r.cfg.ID {
			r.decideTakeoverLocked(id, from, l, st, p)
			pd.last = st.now
			return
		}
	}
	if leaving || pd.exhausted {
		return // a DELETE of the lock (watch) or the resync tries again
	}
	if due := pd.last.Add(r.cfg.AcquireRetryInterval); !pd.last.IsZero() && st.now.Before(due) {
		r.retryLocked(id, due) // at most one attempt per AcquireRetryInterval
		return
	}
	p.acquire = append(p.acquire, id)
	pd.last = st.now
}

// decideTakeoverLocked starts taking shard id over from its live owner
// from, unless a takeover from that owner is already running or was
// aborted recently. A running takeover whose lock changed hands or was
// rewritten starts over (handoff.Inbound.Restart).
func (r *Runner) decideTakeoverLocked(id sharding.ShardID, from storage.Runner, l storage.Lock, st *roundState, p *plan) {
	if in := r.inbound[id]; in != nil {
		if why, restart := in.Restart(l, from.ID); restart {
			delete(r.inbound, id)
			r.reportInbound(id, in, handoff.Aborted, why) // our record is overwritten
		}
	}
	if r.cfg.DisableHandoff || r.inbound[id] != nil {
		return
	}
	if retry := r.inboundRetry[id]; st.now.Before(retry) {
		r.retryLocked(id, retry)
		return
	}
	delete(r.inboundRetry, id)
	p.inbound = append(p.inbound, r.newInboundLocked(id, from, l.Epoch))
}

// decideInboundLocked abandons a takeover of a shard no longer assigned
// here.
func (r *Runner) decideInboundLocked(id sharding.ShardID, want bool, p *plan) {
	in := r.inbound[id]
	if in == nil || want {
		return
	}
	delete(r.inbound, id)
	r.reportInbound(id, in, handoff.Aborted, "the shard was assigned elsewhere")
	p.records = append(p.records, id)
}

// decideOwnedLocked handles an owned shard: kept while assigned here;
// otherwise cut over when the new owner is ready, released plainly when no
// handoff comes within HandoffWait, served meanwhile. It releases only on a
// membership view holding this incarnation (an incomplete view must not
// shed every shard), or everything once another incarnation took over this
// runner's ID.
func (r *Runner) decideOwnedLocked(s *shard, want bool, st *roundState, p *plan) {
	if _, leaving := r.releasing[s.id]; leaving {
		return
	}
	if !st.superseded && (!st.registered || want) {
		s.unassignedSince = time.Time{}
		return
	}
	d := r.outboundDecisionLocked(s, st.now)
	switch d.Action {
	case handoff.CutOver:
		r.releasing[s.id] = s.epoch
		p.cutovers = append(p.cutovers, cutoverItem{s: s, h: d.Record, m: handoff.NewMachine(handoff.OldOwner)})
	case handoff.Release:
		r.releasing[s.id] = s.epoch
		p.release = append(p.release, s.id)
	default:
		// Wait for the ready record (the handoff watch marks the shard),
		// or for HandoffWait to end.
		r.retryLocked(s.id, d.Until)
	}
}

// decideOrphanLocked is the safety net for a lock under our lease that we
// neither own nor release nor want (a release whose reply was lost, an
// acquire cut short): it is deleted. If we want it, it is pending and gets
// rewritten on acquire.
func (r *Runner) decideOrphanLocked(id sharding.ShardID, want bool, st *roundState, p *plan) {
	l, held := r.view.locks.Get(id)
	if !held || l.Lease != st.lease {
		return
	}
	_, owned := r.owned[id]
	_, leaving := r.releasing[id]
	if owned || leaving || !(st.superseded || st.registered && !want) {
		return
	}
	p.orphans = append(p.orphans, storage.Held{Shard: id, Epoch: l.Epoch})
	r.releasing[id] = l.Epoch
}

// decideRecordLocked deletes a handoff record of ours without a running
// takeover (an abort whose delete failed, a late write): it would block
// other targets and could lure an old owner into a cold cutover.
func (r *Runner) decideRecordLocked(id sharding.ShardID, st *roundState, p *plan) {
	h, ok := r.view.handoffs[id]
	if !ok || h.Lease != st.lease || r.inbound[id] != nil || r.deletingHandoff[id] == h.ModRevision {
		return
	}
	r.deletingHandoff[id] = h.ModRevision
	p.records = append(p.records, id)
}

// execute carries out a round's plan: the store calls are batched (one
// transaction per MaxShardsPerTxn shards); everything but acquisition runs
// in the background.
func (r *Runner) execute(bg *sync.WaitGroup, gen uint64, actx context.Context, leaseID storage.LeaseID, p *plan) {
	if len(p.records) > 0 {
		slices.Sort(p.records)
		p.records = slices.Compact(p.records) // an abandoned takeover's record may also be stale
		bg.Go(func() { r.deleteHandoffs(actx, leaseID, p.records) })
	}
	if len(p.release) > 0 {
		slices.Sort(p.release)
		bg.Go(func() { r.release(gen, p.release, ErrShardMoved) })
	}
	if len(p.cutovers) > 0 {
		bg.Go(func() { r.cutover(gen, p.cutovers) })
	}
	if len(p.orphans) > 0 {
		r.log.Warn("releasing locks held under this runner's lease but not owned", "locks", len(p.orphans), "first", p.orphans[0].Shard)
		bg.Go(func() { r.deleteLocks(actx, leaseID, p.orphans) })
	}
	if len(p.inbound) > 0 {
		bg.Go(func() { r.runInbound(gen, actx, leaseID, p.inbound) })
	}
	slices.Sort(p.acquire)
	for chunk := range slices.Chunk(p.acquire, shardsPerCall) {
		r.acquire(actx, gen, leaseID, chunk)
	}
}
