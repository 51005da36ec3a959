package runner

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The control loop is a controller over a work queue of shards (see
// control.Queue). Its work per event is proportional to what the event
// changed, never to the size of the cluster:
//
//   - Events become dirty shards in one place, shardChangedLocked: a lock or
//     handoff record of the shard changed (watches), an operation on it
//     finished, a per-shard timer fired. A membership change marks the
//     shards the new assignment gives to or takes from this runner and
//     those it is busy with (markReassignedLocked; the assignment itself
//     comes from a sharding.Planner, O(shards) per change); only an
//     attach, a lock listing and the periodic resync mark every shard —
//     one O(shards) pass, not one per event.
//   - A round takes the dirty shards and decides each one: decideLocked
//     reads what the runner knows about the shard, control.Decide (pure)
//     decides (acquire, take over by handoff, hand off or release, delete
//     what we no longer want), and applyLocked records the decisions.
//     They are collected in a plan and carried out, batched, once r.mu is
//     released.
//   - A shard that must be looked at again later (an acquire retry, the
//     end of HandoffWait) asks for a timer instead of being rescanned.
//
// Membership storms: after a membership change the runner starts no new
// move — no acquisition, handoff or release — until it has recomputed the
// assignment, and control.StormGate says when (the rule and its numbers
// are on StormGate; the package doc says it to users, "Membership
// storms"). So it never hands shards towards a runner while its own view
// of the assignment is still changing, a record rewritten twice in a row
// (a repair) moves nothing, and runners starting together take their
// final shards directly instead of handing them around.

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
	var preparing atomic.Bool // preparePlanner's goroutine runs
	stopReq := r.sig.stopReq
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
		case <-r.sig.rebalance:
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
		case <-r.sig.kick:
		case <-timer.C:
		case <-verify.C:
			r.verify()
			if storm.QuietFor(time.Now(), 3*r.cfg.VerifyInterval) {
				r.preparePlanner(&bg, &preparing)
			}
		case <-resync.C:
			r.resync()
		}
		if next, ok := r.round(&bg); ok {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
	}
}

// preparePlanner builds, in the background, the planner's prefixes for
// the installed assignment when a fresh computation (a cold start's) left
// none, once membership is quiet and this runner owns every shard the
// assignment gives it (a cold start's acquisitions come first): the next
// join or departure then costs the planner O(shards), not a rebuild of
// O(shards x runners) in every runner at the moment the change must
// settle. At most one runs.
func (r *Runner) preparePlanner(bg *sync.WaitGroup, preparing *atomic.Bool) {
	if preparing.Load() {
		return
	}
	r.mu.Lock()
	p := r.view.planner
	// O(shards) until prepared, once a VerifyInterval.
	due := !p.Prepared() && r.shards.owned == r.view.assignment.Count(r.cfg.ID)
	r.mu.Unlock()
	if !due || !preparing.CompareAndSwap(false, true) {
		return
	}
	bg.Go(func() {
		defer preparing.Store(false)
		p.Prepare()
	})
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
	return departure, r.shards.owned > 0 || r.clusterSettledLocked()
}

// clusterSettledLocked reports whether this runner, owning nothing, joins
// a settled cluster. With a full lock view: every shard is locked by a
// live runner other than this one (O(shards), asked once per membership
// change). Without one: every other member started settledAge or more
// before this runner (their records' start times) — a cold start brings
// runners that start together; a runner that joins later finds the others
// long started. (Only the pace of the storm gate depends on it.)
func (r *Runner) clusterSettledLocked() bool {
	if r.view.full {
		return r.view.locks.SettledElsewhere(r.att.lease, r.view.byLease)
	}
	self, ok := r.view.members[r.cfg.ID]
	if !ok || len(r.view.members) < 2 {
		return false
	}
	age := max(time.Second, 10*r.cfg.RebalanceDebounce)
	for _, m := range r.view.members {
		if m.ID != r.cfg.ID && m.Started.After(self.Started.Add(-age)) {
			return false
		}
	}
	return true
}

// resync is the safety net: every pending acquisition gets a fresh retry
// window and every shard is decided again.
func (r *Runner) resync() {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for id := range r.shards.known() {
		r.shards.newWindow(id, now)
	}
	r.recomputeLocked()
	r.allChangedLocked(true)
}

// retryLocked asks for shard id to be decided again at t (the loop re-arms
// its timer in the next round).
func (r *Runner) retryLocked(id sharding.ShardID, t time.Time) {
	r.work.After(id, t)
	signal(r.sig.kick)
}

// concernsLocked reports whether a change to shard id's lock or handoff
// record can change a decision of this runner: the shard is assigned,
// owned, pending, taken over or released here, or its lock is (or was)
// under this runner's lease.
func (r *Runner) concernsLocked(id sharding.ShardID, leases ...storage.LeaseID) bool {
	if r.shards.busy(id) {
		return true
	}
	for _, l := range leases {
		if l == r.att.lease && l != storage.NoLease {
			return true
		}
	}
	return r.view.assignment.Of(id) == r.cfg.ID
}

// plan collects the decisions of one round, carried out after r.mu is
// released.
type plan struct {
	acquire  []sharding.ShardID
	release  []sharding.ShardID
	cutovers []cutoverItem
	orphans  []storage.Held
	inbound  []inboundItem
	records  []storage.HandoffRef // our handoff records to delete
	recheck  []sharding.ShardID   // takeovers whose lock to read again (takeovers.go)
}

// round decides every dirty shard and starts what was decided. It returns
// when the next per-shard timer is due.
func (r *Runner) round(bg *sync.WaitGroup) (time.Time, bool) {
	defer r.ownLog.flush(r.ownedCount) // one INFO line per round (ownershiplog.go)
	r.mu.Lock()
	if r.lifecycle.phase != phaseAttached || r.lifecycle.stopping {
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
	gen, actx, leaseID := r.att.gen, r.att.ctx, r.att.lease
	st := control.Round{
		Now: now, Self: r.cfg.ID, Lease: leaseID, Interval: r.cfg.AcquireRetryInterval,
		Registered: r.view.registered(r.cfg.ID, r.incarnation, r.att.lease), Superseded: r.supersededLocked(),
		NoHandoff: r.cfg.DisableHandoff,
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

// decideLocked decides shard id: it reads what the round knows about the
// shard (shardLocked), control.Decide decides, and applyLocked records
// the decisions in the runner's state and the round's plan.
func (r *Runner) decideLocked(id sharding.ShardID, st *control.Round, p *plan) {
	var (
		sh control.Shard
		d  control.Decision
	)
	in := r.shardLocked(id, st, &sh)
	control.Decide(st, &sh, &d)
	r.applyLocked(id, &d, in, st, p)
	r.shardChangedLocked(id, 0, false)
	if !r.view.full {
		r.forgetUnconcernedLocked(id)
	}
}

// forgetUnconcernedLocked drops shard id's lock from a view that keeps
// only the locks of the shards that concern this runner, once it does
// not: its holder, if a live member, stays as a hint (hints.go).
func (r *Runner) forgetUnconcernedLocked(id sharding.ShardID) {
	l, held := r.view.locks.Get(id)
	if !held || l.Lease == r.att.lease || r.concernsLocked(id) || r.shards.at(id).record != nil {
		return
	}
	r.view.locks.Del(id)
	if m, live := r.view.byLease[l.Lease]; live {
		r.view.hints.set(id, m.ID)
	}
}

// shardLocked gathers control.Decide's input for shard id into sh and
// returns the running takeover it read.
func (r *Runner) shardLocked(id sharding.ShardID, st *control.Round, sh *control.Shard) *handoff.Inbound {
	sh.Want = st.Registered && !r.lifecycle.draining && r.assignedHereLocked(id)
	x := r.shards.at(id)
	sh.Owned, sh.Leaving = x.own != nil, x.releasing != 0
	if pd := x.pending; pd != nil {
		sh.Pending, sh.LastTry, sh.Exhausted = true, pd.last, pd.exhausted
	}
	l, held := r.view.locks.Get(id)
	sh.Held, sh.Lease = held, l.Lease
	in := x.inbound
	sh.Inbound = in != nil
	if sh.Want && !sh.Owned && held && l.Lease != st.Lease {
		// What only a takeover decision reads (see control.Shard).
		sh.Holder = r.view.byLease[l.Lease].ID
		if in != nil && sh.Holder != "" {
			sh.Stale, _ = in.Restart(l, sh.Holder)
		}
		sh.NoTakeoverBefore = x.takeoverHold
	}
	if sh.OurRecord = x.record != nil; sh.OurRecord {
		sh.RecordDeleting = x.deletingRecord == x.record.rev
	}
	return in
}

// applyLocked carries decision d on shard id into the runner's state and
// the round's plan p, in the order control.Decision lists.
func (r *Runner) applyLocked(id sharding.ShardID, d *control.Decision, in *handoff.Inbound, st *control.Round, p *plan) {
	defer r.shards.done(id)
	switch d.Pending {
	case control.PendingDropped:
		r.shards.dropPending(id)
		r.view.stuck.unwatch(id)
	case control.PendingStarted:
		r.shards.startPending(id, st.Now)
	}
	if d.Abort != "" {
		r.shards.endInbound(id)
		r.reportInbound(id, in, handoff.Aborted, d.Abort, abortAbandoned)
		if d.AbortRecord {
			from := in.From().ID
			if rec := r.shards.at(id).record; rec != nil {
				from = rec.from
			}
			p.records = append(p.records, storage.HandoffRef{Shard: id, From: from})
		}
	}
	if d.TakeOver {
		l, _ := r.view.locks.Get(id)
		p.inbound = append(p.inbound, r.newInboundLocked(id, r.view.byLease[l.Lease], l.Epoch))
	}
	r.recheckTakeoverLocked(id, st.Now, p)
	if d.Tried {
		r.shards.at(id).pending.last = st.Now
	}
	if d.Acquire {
		p.acquire = append(p.acquire, id)
	}
	if !d.RetryAt.IsZero() {
		r.retryLocked(id, d.RetryAt)
	}
	switch d.Owned {
	case control.Keep:
		r.shards.owner(id).unassignedSince = time.Time{}
	case control.HandOff:
		r.handOffLocked(r.shards.owner(id), st.Now, p)
	}
	if d.Orphan {
		l, _ := r.view.locks.Get(id)
		p.orphans = append(p.orphans, storage.Held{Shard: id, Epoch: l.Epoch, Tell: r.view.assigneeToTell(id, r.cfg.ID)})
		r.shards.markReleasing(id, l.Epoch)
	}
	if rec := r.shards.at(id).record; d.DeleteRecord && rec != nil {
		r.shards.deletingRecord(id, rec.rev)
		p.records = append(p.records, storage.HandoffRef{Shard: id, From: rec.from})
	}
}

// handOffLocked hands off owned shard s, now assigned elsewhere: cut over
// when the new owner is ready, released plainly when no handoff comes
// within HandoffWait, served meanwhile.
func (r *Runner) handOffLocked(s *shard, now time.Time, p *plan) {
	d := r.outboundDecisionLocked(s, now)
	switch d.Action {
	case handoff.CutOver:
		r.shards.markReleasing(s.id, s.epoch)
		p.cutovers = append(p.cutovers, cutoverItem{s: s, h: d.Record, m: handoff.NewMachine(handoff.OldOwner)})
	case handoff.Release:
		r.shards.markReleasing(s.id, s.epoch)
		p.release = append(p.release, s.id)
	default:
		// Wait for the ready record (the handoff watch marks the shard),
		// or for HandoffWait to end.
		r.retryLocked(s.id, d.Until)
	}
}

// execute carries out a round's plan: the store calls are batched (one
// transaction per MaxShardsPerTxn shards); everything but acquisition runs
// in the background.
func (r *Runner) execute(bg *sync.WaitGroup, gen uint64, actx context.Context, leaseID storage.LeaseID, p *plan) {
	if len(p.records) > 0 {
		slices.SortFunc(p.records, func(a, b storage.HandoffRef) int { return int(a.Shard) - int(b.Shard) })
		// An abandoned takeover's record may also be stale.
		p.records = slices.CompactFunc(p.records, func(a, b storage.HandoffRef) bool { return a.Shard == b.Shard })
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
	if len(p.recheck) > 0 {
		bg.Go(func() { r.recheckTakeovers(actx, gen, leaseID, p.recheck) })
	}
	slices.Sort(p.acquire)
	for chunk := range slices.Chunk(p.acquire, shardsPerCall) {
		r.acquire(actx, gen, leaseID, chunk)
	}
}
