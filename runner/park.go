package runner

import (
	"context"
	"time"

	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/sharding"
)

// Parking: a request from another runner for a shard this runner does not
// host yet, but is assigned and is acquiring, waits here for the install
// instead of being answered NotOwner (which the sender would retry after a
// back-off, or after its own lock watch showed this runner's lock). Senders
// aim such requests here when they know of no live owner of the shard
// (routing's assignee attempt, after a crash): the request then travels
// while the lock is acquired, and is delivered the moment the shard is
// installed.
//
// What parks (parkableLocked): the runner is attached and not stopping or
// draining, the shard is not owned yet and either assigned here and
// pending (an acquisition whose retry window has not run out) or the
// membership view is changing (a change not acted on yet: the sender,
// which saw it first, may know the new assignment before this runner
// computed it), and its lock is free, ours (acquired, not installed yet)
// or held under a lease no live member has.
// A lock held by a live runner — the acquisition lost a race, or a takeover
// by handoff waits for the old owner's cutover — does not park: the
// request is answered NotOwner naming that runner.
//
// Unless this runner has not seen yet what the sender saw: a request sent
// here as the shard's assignee names the revisions of the sender's lock
// and runner views (routing.ViewSeen). While this runner's views are
// older, the crashed owner's lease end that sent the request here may not
// have reached it — its lock view still shows that owner — so the request
// waits (counted and bounded like a parked one, and at most maxLagWait)
// for the views to catch up, and only then is parkability decided. Without
// it, a sender whose watch ran ahead of the assignee's was refused and
// waited for its own watch to show the new lock.
//
// Guarantees:
//
//   - A parked request is delivered through the ordinary local delivery
//     (admission, the shard's mailbox and workers) once the shard is
//     installed here, or answered NotOwner (no handler ran it) — never
//     both, and never by a handler of a shard this runner does not own.
//   - Bounded: at most maxParkedPerShard requests per shard and
//     Config.MaxWaitingSends in all wait; beyond, a request is answered at
//     once. None waits longer than Config.AcquireRetryWindow, nor past its
//     caller's deadline less parkAnswerMargin (so that the caller hears
//     "not owner" — certainly not delivered — rather than a timeout that
//     may have delivered it).
//   - Woken at every change of the shard's state here: an install, a
//     decision of the control loop on it, an event of its lock, an
//     exhausted retry window, and every lifecycle transition (detach,
//     Shutdown, Close): a request whose shard stops being parkable is
//     answered NotOwner (with the lock holder as hint when one is known).
//   - A request whose caller's context ends while parked is never
//     delivered (the transport ends its context with the caller's).

// maxParkedPerShard bounds the requests parked on one shard.
const maxParkedPerShard = 256

// parkAnswerMargin: a parked request is answered NotOwner this long before
// its caller's deadline (a request with less time left does not park).
const parkAnswerMargin = 50 * time.Millisecond

// parkedShard is the requests parked on one shard.
type parkedShard struct {
	wake chan struct{} // closed (and replaced) at the shard's next change
	n    int           // requests parked
}

// parkingLot is the parked requests, by shard (guarded by Runner.mu).
type parkingLot struct {
	shards map[sharding.ShardID]*parkedShard
	total  int
	// lagging counts the requests waiting for this runner's views to
	// reach their senders' (the lock watch wakes them at every update).
	lagging int
}

// park waits while shard id is parkable here (see above) and reports
// whether it is hosted here when the wait ends: true means deliver
// locally, false answer NotOwner. seen, when not zero, is the sender's
// view revisions (it aimed the request here as the shard's assignee):
// while this runner's views are older, the request waits for them to
// catch up — at most maxLagWait — before parkability is decided.
func (r *Runner) park(ctx context.Context, id sharding.ShardID, seen routing.ViewSeen) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shards.owner(id) != nil {
		return true // installed since the receiver looked
	}
	bound := r.cfg.AcquireRetryWindow
	if d, ok := ctx.Deadline(); ok {
		bound = min(bound, time.Until(d)-parkAnswerMargin)
	}
	if !r.view.full {
		seen.Locks = 0 // no lock watch here: only the runner views compare
	}
	lagging := r.view.seen.Behind(seen)
	if bound <= 0 || ctx.Err() != nil || !r.parkableLocked(id, lagging) || r.parked.total >= r.cfg.MaxWaitingSends {
		return false
	}
	if r.parked.shards == nil {
		r.parked.shards = make(map[sharding.ShardID]*parkedShard)
	}
	p := r.parked.shards[id]
	if p == nil {
		p = &parkedShard{wake: make(chan struct{})}
		r.parked.shards[id] = p
	}
	if p.n >= maxParkedPerShard {
		return false
	}
	p.n++
	r.parked.total++
	var lagC <-chan time.Time // fires when the wait for the views ends
	if lagging {
		r.parked.lagging++
		lag := time.NewTimer(min(bound, maxLagWait))
		defer lag.Stop()
		lagC = lag.C
	}
	defer func() {
		p.n--
		r.parked.total--
		if lagging {
			r.parked.lagging--
		}
		if p.n == 0 {
			delete(r.parked.shards, id)
		}
	}()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		wake := p.wake
		r.mu.Unlock()
		lagOver := false
		select {
		case <-wake:
		case <-ctx.Done():
		case <-timer.C:
		case <-lagC:
			lagOver = true
		case <-r.sig.closeReq:
		case <-r.sig.stopReq:
		}
		r.mu.Lock()
		if r.shards.owner(id) != nil {
			return true // installed: delivered like any request (admission first)
		}
		if lagging && (lagOver || !r.view.seen.Behind(seen)) {
			// Caught up with the sender, or waited long enough: from now
			// on the shard's own state decides.
			lagging, lagC = false, nil
			r.parked.lagging--
		}
		if ctx.Err() != nil || !r.parkableLocked(id, lagging) {
			return false
		}
		select {
		case <-timer.C:
			return false
		case <-r.sig.closeReq:
			return false
		case <-r.sig.stopReq:
			return false
		default:
		}
	}
}

// maxLagWait bounds the wait of a request whose sender's views were newer
// than this runner's (see park): a watch that lags longer than this, or a
// sender's revision that never comes (a watch it re-listed at a revision
// with no change since), ends the wait and the shard's state decides.
const maxLagWait = time.Second

// parkableLocked reports whether a request for shard id may wait here for
// its install (see above); lagging, whether it waits for this runner's
// views to catch up with its sender's first (then only the runner's own
// state counts: the shard's is not known to be current yet).
func (r *Runner) parkableLocked(id sharding.ShardID, lagging bool) bool {
	if !r.running.Load() || r.lifecycle.phase != phaseAttached || r.lifecycle.stopping || r.lifecycle.draining {
		return false
	}
	x := r.shards.at(id)
	if x.own != nil {
		return false
	}
	if lagging {
		return true
	}
	// Being acquired here; or, while a membership change is not acted on
	// yet, perhaps about to be (the sender saw the change first).
	acquiring := x.pending != nil && !x.pending.exhausted && r.assignedHereLocked(id)
	if !acquiring && !r.view.viewChanging {
		return false
	}
	l, held := r.view.locks.Get(id)
	if !held || (l.Lease == r.att.lease && r.att.lease != 0) {
		return true
	}
	_, live := r.view.byLease[l.Lease]
	return !live
}
