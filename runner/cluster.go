package runner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// followRunners keeps r.members equal to the registry (list, then watch).
func (r *Runner) followRunners(ctx context.Context) {
	_ = storage.Follow(ctx, r.store, storage.KeyspaceRunners, func(u storage.Update) {
		if u.Err != nil {
			r.storageResult("watch runners", u.Err)
			return
		}
		r.mu.Lock()
		if u.Reset {
			clear(r.members)
			for _, kv := range u.KVs {
				r.applyRunnerLocked(storage.EventPut, kv)
			}
		}
		for _, ev := range u.Events {
			r.applyRunnerLocked(ev.Type, ev.KV)
		}
		r.membersSeen = true
		live := r.rebuildByLeaseLocked()
		r.mu.Unlock()
		r.transport.forget(live)
		if u.Reset { // a good listing ends the streak of failed watches and listings
			r.storageResult("watch runners", nil)
		}
		r.routesChanged()
		signal(r.rebalance)
	})
}

func (r *Runner) applyRunnerLocked(t storage.EventType, kv storage.KeyValue) {
	if t == storage.EventDelete {
		delete(r.members, kv.Key)
		return
	}
	rec, err := storage.DecodeRunner(kv)
	if err != nil {
		// A corrupt record is not a member: it gets no shards.
		delete(r.members, kv.Key)
		r.log.Error("ignoring corrupt runner record", "key", kv.Key, "err", err)
		return
	}
	if rec.ID == r.cfg.ID && rec.Incarnation != r.incarnation && rec.Started.After(r.started) {
		r.log.Error("another process registered with this runner's ID", "other_incarnation", rec.Incarnation)
	}
	r.members[kv.Key] = rec
}

// followLocks keeps r.locks equal to the shard locks, wakes the acquirer
// when an assigned shard's lock is deleted, and fences owned shards whose
// lock was deleted or taken behind the runner's back.
func (r *Runner) followLocks(ctx context.Context) {
	_ = storage.Follow(ctx, r.store, storage.KeyspaceShards, func(u storage.Update) {
		if u.Err != nil {
			r.storageResult("watch locks", u.Err)
			return
		}
		wake := false
		r.mu.Lock()
		if u.Reset {
			wake = r.resetLocksLocked(u)
		}
		for _, ev := range u.Events {
			wake = r.applyLockLocked(ev) || wake
		}
		r.mu.Unlock()
		r.routesChanged()
		if u.Reset { // a good listing ends the streak of failed watches and listings
			r.storageResult("watch locks", nil)
		}
		if wake {
			signal(r.kick)
		}
	})
}

func decodeLock(kv storage.KeyValue) (storage.Lock, bool) {
	l, err := storage.DecodeLock(kv)
	if err != nil && l.Lease == storage.NoLease && l.Epoch == 0 {
		return l, false // not even the key parses
	}
	return l, true // a corrupt value still names its lease and epoch
}

// resetLocksLocked replaces the lock view with a listed snapshot.
func (r *Runner) resetLocksLocked(u storage.Update) (wake bool) {
	clear(r.locks)
	for _, kv := range u.KVs {
		if l, ok := decodeLock(kv); ok && int(l.Shard) < r.cfg.NumShards {
			r.locks[l.Shard] = l
		}
	}
	for id, s := range r.owned {
		if s.epoch > storage.Epoch(u.Revision) {
			continue // acquired after the snapshot
		}
		l, ok := r.locks[id]
		if !ok || l.Lease != r.lease || l.Epoch != s.epoch {
			r.lockLostLocked(id, fmt.Sprintf("lock of shard %d missing or changed in a listing at revision %d", id, u.Revision))
		}
	}
	for id := range r.pending {
		if _, held := r.locks[id]; !held {
			r.pending[id] = &pending{since: time.Now()}
			wake = true
		}
	}
	return wake
}

// applyLockLocked applies one lock event.
func (r *Runner) applyLockLocked(ev storage.Event) (wake bool) {
	id, err := sharding.ParseShardID(ev.KV.Key)
	if err != nil || int(id) >= r.cfg.NumShards {
		return false
	}
	rev := storage.Epoch(ev.KV.ModRevision)
	s, owned := r.owned[id]
	_, leaving := r.releasing[id]
	if ev.Type == storage.EventDelete {
		delete(r.locks, id)
		if owned && rev > s.epoch && !leaving {
			r.lockLostLocked(id, fmt.Sprintf("lock of shard %d deleted at revision %d", id, rev))
		}
		if p, ok := r.pending[id]; ok {
			// Watch-driven wake-up: a fresh window, acquire now.
			*p = pending{since: time.Now()}
			return true
		}
		return false
	}
	l, ok := decodeLock(ev.KV)
	if !ok {
		return false
	}
	r.locks[id] = l
	if owned && rev > s.epoch && !leaving && (l.Lease != r.lease || l.Epoch != s.epoch) {
		r.lockLostLocked(id, fmt.Sprintf("lock of shard %d taken by lease %x at revision %d", id, l.Lease, rev))
	}
	if l.Lease != r.lease {
		delete(r.movedTo, id) // the watch caught up with our handoff
	} else if !owned && !leaving && r.phase == phaseAttached && storage.Revision(rev) > r.attachRev && rev > r.lastReleased[id] {
		// A lock written under our lease during this attachment is ours at
		// that epoch: a handoff's transfer to us (possibly one we stopped
		// wanting meanwhile: we then hand it on properly), or our own
		// acquire whose reply has not arrived yet.
		r.installInboundLocked(id, l)
	}
	return false
}

// lockLostLocked handles an owned lock that changed behind our back: it
// detaches (the store's view and ours disagree, so nothing we own can be
// trusted) or, with detachment disabled, drops that shard alone.
func (r *Runner) lockLostLocked(id sharding.ShardID, detail string) {
	if r.tripLocked(detachment.ReasonLockLost, detail) {
		return
	}
	s, ok := r.owned[id]
	if !ok {
		return
	}
	r.log.Error("owned lock lost; dropping the shard (detachment disabled)", "shard", id, "detail", detail)
	r.disownLocked(s, ErrShardMoved)
	r.hub.publish(ShardLost{EventBase: r.base(), Shard: id, Epoch: s.epoch, Cause: ErrShardMoved})
}

// recomputeLocked recomputes the assignment from the membership view and
// updates the set of shards to acquire.
func (r *Runner) recomputeLocked() {
	if !r.membersSeen {
		return
	}
	var runners []sharding.Runner
	for _, m := range r.members {
		w := m.Weight
		if m.Draining {
			w = 0
		}
		runners = append(runners, sharding.Runner{ID: m.ID, Weight: w})
	}
	current := make(sharding.Assignment, r.cfg.NumShards)
	for id, l := range r.locks {
		current[id] = r.byLease[l.Lease].ID
	}
	a, err := r.cfg.Strategy.Assign(sharding.Input{NumShards: r.cfg.NumShards, Runners: runners, Current: current})
	if err != nil {
		if r.assignErr == nil || r.assignErr.Error() != err.Error() {
			r.log.Error("cannot compute the shard assignment; keeping the previous one", "err", err)
		}
		r.assignErr = err
		return
	}
	r.assignErr = nil
	r.assignment = a
	r.assignedWithSelf = r.registeredLocked()
	// Shards no longer wanted stop pending; the next round (every caller
	// runs one) makes the newly assigned ones pending.
	for id := range r.pending {
		if !r.desiredLocked(id) {
			delete(r.pending, id)
		}
	}
}

// registeredLocked reports whether the membership view holds this
// incarnation's record under the current lease.
func (r *Runner) registeredLocked() bool {
	m, ok := r.members[r.cfg.ID]
	return ok && m.Incarnation == r.incarnation && m.Lease == r.lease
}

// supersededLocked reports whether another incarnation registered this
// runner's ID after this one: this process must give up everything.
func (r *Runner) supersededLocked() bool {
	m, ok := r.members[r.cfg.ID]
	return ok && m.Incarnation != r.incarnation && m.Started.After(r.started)
}

// desiredLocked reports whether shard id is assigned to this runner.
func (r *Runner) desiredLocked(id sharding.ShardID) bool {
	return int(id) < len(r.assignment) && r.assignment[id] == r.cfg.ID && r.registeredLocked()
}

// OwnerOf returns the ID of the runner whose lease holds shard id's lock in
// this runner's view ("" when unowned or unknown) and the lock's epoch.
func (r *Runner) OwnerOf(id sharding.ShardID) (string, storage.Epoch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l, ok := r.locks[id]
	if !ok {
		return "", 0
	}
	return r.byLease[l.Lease].ID, l.Epoch
}

// Members returns the runner records in this runner's view, by ID.
func (r *Runner) Members() []storage.Runner {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]storage.Runner, 0, len(r.members))
	for _, m := range r.members {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b storage.Runner) int { return strings.Compare(a.ID, b.ID) })
	return out
}
