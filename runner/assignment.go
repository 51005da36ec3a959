package runner

import (
	"slices"

	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/sharding"
)

// recompute recomputes the assignment from the membership view; the
// planner runs without r.mu held (O(shards) after a few runners changed,
// O(shards x runners) the first time).
func (r *Runner) recompute() {
	r.mu.Lock()
	if r.lifecycle.phase != phaseAttached {
		// Nothing to act on: attach recomputes (a starting or detached
		// runner in a membership storm would pay O(shards x runners) per
		// change for nothing).
		r.mu.Unlock()
		return
	}
	in, version, ok := r.assignInputLocked()
	r.mu.Unlock()
	if !ok {
		return
	}
	a, err := r.view.planner.Assign(in)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.installAssignmentLocked(in.Runners, a, err, version)
}

// recomputeForRouting recomputes, on a ClientOnly runner, the assignment
// routing reads (routingDir.Assignee): from the membership view, with the
// cluster's strategy (the planner's: the cluster record's, once read;
// before, this runner's Config.Strategy — a wrong assignee only answers
// NotOwner). It decides nothing.
func (r *Runner) recomputeForRouting() {
	r.mu.Lock()
	if !r.view.membersSeen {
		r.mu.Unlock()
		return
	}
	runners := r.view.runnersForAssign()
	planner := r.view.planner
	strategy := planner.Strategy()
	if r.view.assignment.Known() && slices.Equal(runners, r.view.assignedFrom) && sharding.IgnoresCurrent(strategy) {
		r.mu.Unlock()
		return
	}
	in := sharding.Input{NumShards: r.cfg.NumShards, Runners: runners}
	if !sharding.IgnoresCurrent(strategy) {
		in.Current = r.view.current(r.cfg.NumShards)
	}
	r.mu.Unlock()
	full, err := planner.Assign(in)
	if err != nil {
		return // no runner yet, say: routing waits for owners
	}
	a := control.CompactAssignment(full)
	full = nil
	r.mu.Lock()
	if planner != r.view.planner {
		r.mu.Unlock()
		return // the strategy changed meanwhile (useClusterStrategy recomputes)
	}
	if !a.Equal(r.view.assignment) {
		r.seedPreviousAssigneesLocked(r.view.assignment, a)
	}
	r.view.assignment, r.view.assignedFrom = a, runners
	r.mu.Unlock()
	r.router.RoutesChanged() // sends without an owner try the new assignees
}

// useClusterStrategy makes a ClientOnly runner compute the assignments it
// routes by with the strategy the cluster record names, when it differs
// from its own Config.Strategy and is a built-in one (sharding.
// StrategyByName); a strategy this runner cannot build is logged and its
// own kept (a wrong assignee costs NotOwner answers, nothing else).
func (r *Runner) useClusterStrategy(name string) {
	if name == "" || name == r.cfg.Strategy.Name() {
		return
	}
	s, err := sharding.StrategyByName(name)
	if err != nil {
		r.log.Warn("the cluster's strategy is not one this client-only runner can compute; it routes sends with no live owner by its own",
			"cluster_strategy", name, "strategy", r.cfg.Strategy.Name(), "err", err)
		return
	}
	r.log.Info("routing by the cluster's strategy", "cluster_strategy", name, "configured", r.cfg.Strategy.Name())
	r.mu.Lock()
	r.view.planner = sharding.NewPlanner(s)
	r.view.assignment, r.view.assignedFrom = control.Assignment{}, nil
	r.mu.Unlock()
	signal(r.sig.rebalance)
}

// recomputeLocked is recompute with r.mu held throughout (attach, resync).
func (r *Runner) recomputeLocked() {
	in, version, ok := r.assignInputLocked()
	if !ok {
		return
	}
	a, err := r.view.planner.Assign(in)
	r.installAssignmentLocked(in.Runners, a, err, version)
}

// assignInputLocked returns the strategy's input for the current view
// (sorted runners; Current only for strategies that read it) and the
// view's version. ok is false before the first listing, and when the
// runners and weights are those of the installed assignment and the
// strategy ignores Current: the assignment is then still valid, and only
// the reconcile is done.
func (r *Runner) assignInputLocked() (in sharding.Input, version uint64, ok bool) {
	if !r.view.membersSeen {
		return in, 0, false
	}
	runners := r.view.runnersForAssign()
	in = sharding.Input{NumShards: r.cfg.NumShards, Runners: runners}
	if !sharding.IgnoresCurrent(r.cfg.Strategy) {
		in.Current = r.view.current(r.cfg.NumShards)
	} else if r.view.assignment.Known() && r.view.assignErr == nil && slices.Equal(runners, r.view.assignedFrom) {
		r.installCompactLocked(runners, r.view.assignment, r.view.assignDigest, r.view.membersVersion)
		return in, 0, false
	}
	return in, r.view.membersVersion, true
}

// installAssignmentLocked installs assignment a computed from runners at
// view version (a recompute that raced with a newer change still installs
// its result, but the view stays "changing" until the next one) and asks
// for a full reconcile: shards no longer wanted stop pending, newly
// assigned ones become pending, owned ones assigned elsewhere start
// waiting for their handoff.
func (r *Runner) installAssignmentLocked(runners []sharding.Runner, a sharding.Assignment, err error, version uint64) {
	if err != nil {
		if version == r.view.membersVersion {
			r.view.viewChanging = false
		}
		if r.view.assignErr == nil || r.view.assignErr.Error() != err.Error() {
			r.log.Error("cannot compute the shard assignment; keeping the previous one", "err", err)
		}
		r.view.assignErr = err
		return
	}
	c, digest := control.CompactAssignment(a), r.view.assignDigest
	if !c.Equal(r.view.assignment) {
		digest = a.Digest()
	}
	r.installCompactLocked(runners, c, digest, version)
}

// installCompactLocked is installAssignmentLocked of a computed assignment,
// with the Digest of its sharding.Assignment.
func (r *Runner) installCompactLocked(runners []sharding.Runner, a control.Assignment, digest uint64, version uint64) {
	if version == r.view.membersVersion {
		r.view.viewChanging = false
	}
	r.view.assignErr = nil
	old, self := r.view.assignment, r.selfLocked()
	markAll := false
	if !old.Known() || self != r.view.assignedSelf || r.attachedSince {
		// Every shard's wanting may have changed, or this attachment has
		// not decided them yet (a detach forgot everything).
		markAll = true
		r.attachedSince = false
	} else {
		r.markReassignedLocked(old, a)
	}
	if !a.Equal(old) {
		r.seedPreviousAssigneesLocked(old, a)
		r.view.assignment, r.view.assignDigest = a, digest
		r.router.RoutesChanged() // sends without an owner try the new assignees
	}
	r.view.assignedFrom, r.view.assignedSelf = runners, self
	r.view.assignedWithSelf = self.registered
	r.allChangedLocked(markAll) // parked while the view changed: assigned here or not
}

// selfState is what, besides the assignment, decides which shards this
// runner wants: whether it is registered, superseded, draining.
type selfState struct{ registered, superseded, draining bool }

func (r *Runner) selfLocked() selfState {
	return selfState{registered: r.view.registered(r.cfg.ID, r.incarnation, r.att.lease), superseded: r.supersededLocked(), draining: r.lifecycle.draining}
}

// markReassignedLocked marks what a new assignment (the same view of this
// runner itself) changes: the shards it gives to or takes from this runner
// (one pass of string comparisons over the assignments), and every shard
// this runner is busy with — owned, pending, taken over, released, or with
// a handoff record of ours — whose decisions also depend on the other
// runners' leases (a member that left or restarted).
func (r *Runner) markReassignedLocked(old, a control.Assignment) {
	r.work.AddMoved(old, a, r.cfg.ID)
	for id, x := range r.shards.known() {
		if x.busy() || x.record != nil {
			r.work.Add(id)
		}
	}
	signal(r.sig.kick)
}

// supersededLocked reports whether this runner gave up its ID to another
// process (registration.go): it must give up everything.
func (r *Runner) supersededLocked() bool {
	return r.fatal != nil
}

// assignedHereLocked reports whether the assignment gives shard id to this
// runner.
func (r *Runner) assignedHereLocked(id sharding.ShardID) bool {
	return r.view.assignment.Of(id) == r.cfg.ID
}
