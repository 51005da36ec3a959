package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/runner/internal/registration"
	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// clusterView is this runner's view of the cluster, kept by the watches,
// and the assignment computed from it; guarded by Runner.mu.
type clusterView struct {
	members     map[string]storage.Runner
	byLease     map[storage.LeaseID]storage.Runner
	locks       control.LockView                     // the locks this runner knows (every one with a full view)
	handoffs    map[sharding.ShardID]storage.Handoff // the records of handoffs/{self}/
	membersSeen bool                                 // the membership view has been listed at least once
	// membersErr is the last failure of the membership watch or listing
	// since the last good listing (nil: the view is current), and
	// membersErrSince when the streak began; a ClientOnly runner is not
	// ready meanwhile (CheckReadiness).
	membersErr      error
	membersErrSince time.Time
	// seen is the revisions the lock and membership views are at (the
	// watches' last updates): a request a sender aimed here as the
	// shard's assignee names the sender's, and parking waits while this
	// runner's are older (park.go).
	seen    routing.ViewSeen
	stopped stoppedLeases // leases that ended by a clean Shutdown (LeaseEndsByDrain)

	// planner computes the assignments with cfg.Strategy, each from the
	// previous one (a membership change costs O(shards), not O(shards x
	// runners)); the control loop alone calls it. On a ClientOnly runner,
	// recomputeForRouting calls it, with the cluster record's strategy once
	// read (useClusterStrategy).
	planner *sharding.Planner
	// assignment is the last one installed, as indexes (2 bytes a shard).
	assignment   control.Assignment
	assignDigest uint64 // the assignment's sharding.Assignment.Digest()
	// assignedFrom: the sorted runners and weights the assignment was
	// computed from; membersVersion counts membership updates.
	assignedFrom   []sharding.Runner
	membersVersion uint64
	assignErr      error
	// assignedWithSelf: the assignment was computed from a view holding
	// this incarnation (later changes are debounced; the first is not).
	assignedWithSelf bool
	assignedSelf     selfState // this runner's own state when the assignment was installed
	// viewChanging: the membership changed since the assignment was
	// computed; no new move starts until it is recomputed.
	viewChanging bool
	// departed: a member left the view since the assignment was computed
	// (the control loop acts on an isolated departure at once).
	departed bool

	// full (set by New): this runner watches every lock
	// (Config.FullLockView, or a strategy that reads the current owners);
	// otherwise its lock view holds only the shards that concern it, and
	// hints the owners of others (hints.go).
	full  bool
	hints ownerHints   // a lock of its own: the send path reads it without r.mu
	stuck stuckWatches // locks of stuck shards watched one by one (stuck.go)
	// unknownLocks: locks under our lease found unknown by verify, since
	// when (lockops.go).
	unknownLocks map[sharding.ShardID]time.Time
}

// followRunners keeps r.view.members equal to the registry (list, then watch).
func (r *Runner) followRunners(ctx context.Context) {
	_ = storage.Follow(ctx, r.store, storage.KeyspaceRunners, func(u storage.Update) {
		if u.Err != nil {
			r.mu.Lock()
			if r.view.membersErr == nil {
				r.view.membersErrSince = time.Now()
			}
			r.view.membersErr = u.Err
			r.mu.Unlock()
			r.storageResult("watch runners", u.Err)
			return
		}
		r.mu.Lock()
		if u.Reset {
			r.view.membersErr = nil
		}
		before := len(r.view.members)
		var d memberDelta
		if u.Reset {
			for _, m := range r.view.members {
				d.left(m)
			}
			clear(r.view.members)
			clear(r.view.byLease)
			r.keys.forget(storage.KeyspaceRunners)
			own := false
			for _, kv := range u.KVs {
				own = own || kv.Key == r.cfg.ID
				r.applyRunnerLocked(storage.EventPut, kv, &d)
			}
			if !own {
				r.reg.Observe(registration.Observation{Rev: u.Revision})
			}
		}
		for _, ev := range u.Events {
			r.applyRunnerLocked(ev.Type, ev.KV, &d)
		}
		r.view.membersSeen = true
		r.view.seen.Runners = max(r.view.seen.Runners, u.Revision)
		r.view.membersVersion++
		r.view.viewChanging = true // until the control loop recomputes the assignment
		if len(r.view.members) < before {
			r.view.departed = true // a runner left: its shards are free at once
		}
		if !r.view.full {
			r.leasesEndedLocked(d.gone, storage.Epoch(u.Revision))
		}
		var live map[string]bool
		if d.addrGone { // O(members), only when an address left
			live = r.view.liveAddresses()
		}
		r.allChangedLocked(false) // a lock's holder may have come or gone
		r.mu.Unlock()
		if live != nil {
			r.net.Forget(live)
		}
		if u.Reset { // a good listing ends the streak of failed watches and listings
			r.storageResult("watch runners", nil)
		}
		r.router.RoutesChanged()
		signal(r.sig.rebalance)
	})
}

// memberDelta is what one update of the membership view took away: the
// leases of members that left or changed lease, and whether an address
// left. Its work is proportional to the members that changed, not to the
// membership (a cold start of R runners brings R updates to every runner).
type memberDelta struct {
	gone     map[storage.LeaseID]bool
	addrGone bool
}

// left records that member m (as it was) left the view or changed.
func (d *memberDelta) left(m storage.Runner) {
	if d.gone == nil {
		d.gone = make(map[storage.LeaseID]bool)
	}
	d.gone[m.Lease] = true
	d.addrGone = d.addrGone || m.Address != ""
}

// leasesEndedLocked applies, without a lock watch, what a member's lease
// that left the view (gone: the leases of members that left or changed) means for the
// locks this runner knows under it: a runner record and the locks of its
// lease are deleted together when the lease ends (expiry or revocation),
// so each is taken as deleted at rev (the acquirer wakes at once). A lease
// that left the view without ending (its runner re-registered under a new
// one) leaves locks behind: the acquisition finds them held and retries.
func (r *Runner) leasesEndedLocked(gone map[storage.LeaseID]bool, rev storage.Epoch) {
	for l := range gone {
		if _, live := r.view.byLease[l]; live || l == r.att.lease {
			delete(gone, l) // a member still holds it (re-registered under it)
		}
	}
	if len(gone) == 0 {
		return
	}
	var ids []sharding.ShardID
	for id, l := range r.view.locks.All() {
		if gone[l.Lease] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // in shard order, whatever the map's
	for _, id := range ids {
		r.applyLockDeleteLocked(id, rev)
	}
}

func (r *Runner) applyRunnerLocked(t storage.EventType, kv storage.KeyValue, d *memberDelta) {
	if kv.Key == r.cfg.ID { // our own record: guarded (internal/registration)
		r.reg.Observe(registration.Observation{Exists: t == storage.EventPut, KV: kv, Rev: kv.ModRevision})
	}
	old, was := r.view.members[kv.Key]
	drop := func() {
		if !was {
			return
		}
		delete(r.view.members, kv.Key)
		if m, ok := r.view.byLease[old.Lease]; ok && m.ID == old.ID {
			delete(r.view.byLease, old.Lease)
		}
		d.left(old)
	}
	if t == storage.EventDelete {
		drop()
		r.keys.good(storage.KeyspaceRunners, kv.Key)
		return
	}
	rec, err := storage.DecodeRunner(kv)
	if err == nil && kv.Lease == storage.NoLease {
		err = errors.New("no lease: a record that cannot expire is never a live runner")
	}
	if err != nil {
		// Not a member: it gets no shards.
		drop()
		if kv.Key != r.cfg.ID {
			r.keys.bad(storage.KeyspaceRunners, kv.Key, "ignoring a runner record that is no live registration", err)
		}
		return
	}
	r.keys.good(storage.KeyspaceRunners, kv.Key)
	if was && (old.Lease != rec.Lease || old.Address != rec.Address) {
		drop()
	}
	r.view.members[kv.Key] = rec
	r.view.byLease[rec.Lease] = rec
	if rec.Stopped {
		r.view.stopped.add(kv.Lease)
	}
}

// maxStoppedLeases bounds stoppedLeases: a reply still in flight after
// this many clean stops is withheld, as one of a crashed runner.
const maxStoppedLeases = 4096

// stoppedLeases remembers the leases whose record said Stopped (the last
// record of a clean Shutdown before it revokes the lease), so that a reply
// of such a lease arriving after the lease ended is still acknowledged
// (routing.Directory.LeaseEndsByDrain); the oldest is forgotten first.
type stoppedLeases struct {
	set   map[storage.LeaseID]struct{}
	order []storage.LeaseID // oldest first
}

func (s *stoppedLeases) add(l storage.LeaseID) {
	if _, ok := s.set[l]; ok {
		return
	}
	if s.set == nil {
		s.set = make(map[storage.LeaseID]struct{})
	}
	if len(s.order) == maxStoppedLeases {
		delete(s.set, s.order[0])
		s.order = append(s.order[:0], s.order[1:]...)
	}
	s.set[l] = struct{}{}
	s.order = append(s.order, l)
}

func (s *stoppedLeases) has(l storage.LeaseID) bool {
	_, ok := s.set[l]
	return ok
}

// followLocks keeps r.view.locks equal to the shard locks, wakes the acquirer
// when an assigned shard's lock is deleted, and fences owned shards whose
// lock was deleted or taken behind the runner's back.
func (r *Runner) followLocks(ctx context.Context) {
	_ = storage.Follow(ctx, r.store, storage.KeyspaceShards, func(u storage.Update) {
		if u.Err != nil {
			r.storageResult("watch locks", u.Err)
			return
		}
		r.mu.Lock()
		if u.Reset {
			r.resetLocksLocked(u)
		}
		for _, ev := range u.Events {
			r.applyLockLocked(ev)
		}
		r.view.seen.Locks = max(r.view.seen.Locks, u.Revision)
		if r.parked.lagging > 0 && !u.Reset { // (a reset's own reaction wakes them)
			r.allChangedLocked(false) // requests waiting for this view to catch up
		}
		r.flushLostLocked()
		r.mu.Unlock()
		r.router.RoutesChanged()
		if u.Reset { // a good listing ends the streak of failed watches and listings
			r.storageResult("watch locks", nil)
		}
	})
}

// resetLocksLocked replaces the lock view with a listed snapshot and asks
// for a full reconcile.
func (r *Runner) resetLocksLocked(u storage.Update) {
	r.view.locks.Reset()
	r.keys.forget(storage.KeyspaceShards)
	for _, kv := range u.KVs {
		if l, ok := r.decodeLockLocked(kv); ok {
			r.view.locks.Set(l)
			r.shardChangedLocked(l.Shard, l.Epoch, false) // decided again below, with every shard
		}
	}
	for s := range r.shards.ownedShards() {
		if s.epoch > storage.Epoch(u.Revision) {
			continue // acquired after the snapshot
		}
		l, ok := r.view.locks.Get(s.id)
		if !ok || l.Lease != r.att.lease || l.Epoch != s.epoch {
			r.lockLostLocked(s.id, fmt.Sprintf("lock of shard %d missing or changed in a listing at revision %d", s.id, u.Revision))
		}
	}
	now := time.Now()
	for id, x := range r.shards.known() {
		if l, held := r.view.locks.Get(id); x.pending != nil && (!held || l.Lease == storage.NoLease) {
			r.shards.newWindow(id, now)
		}
	}
	r.allChangedLocked(true)
}

// applyLockLocked applies one event of the lock watch.
func (r *Runner) applyLockLocked(ev storage.Event) {
	if ev.Type == storage.EventDelete {
		id, ok := r.keys.shardOf(storage.KeyspaceShards, ev.KV.Key)
		if !ok {
			return
		}
		r.keys.good(storage.KeyspaceShards, ev.KV.Key)
		r.applyLockDeleteLocked(id, storage.Epoch(ev.KV.ModRevision))
		return
	}
	if l, ok := r.decodeLockLocked(ev.KV); ok {
		r.applyLockPutLocked(l)
	}
}

// applyLockDeleteLocked applies the deletion of shard id's lock at
// revision rev (the lock watch, a notice, a lease that ended) and marks
// the shard dirty when the change concerns this runner.
func (r *Runner) applyLockDeleteLocked(id sharding.ShardID, rev storage.Epoch) {
	prev, _ := r.view.locks.Get(id)
	s, leaving := r.shards.owner(id), r.shards.leaving(id)
	r.view.locks.Del(id)
	if s != nil && rev > s.epoch && !leaving {
		r.lockLostLocked(id, fmt.Sprintf("deleted at revision %d", rev))
	}
	// Watch-driven wake-up: a fresh window, acquire now.
	r.shards.newWindow(id, time.Now())
	r.shardChangedLocked(id, 0, r.concernsLocked(id, prev.Lease))
}

// applyLockPutLocked applies lock l, written at l.Epoch (the lock watch, a
// notice, a store call's result), and marks the shard dirty when the
// change concerns this runner.
func (r *Runner) applyLockPutLocked(l storage.Lock) {
	id, rev := l.Shard, l.Epoch
	s, leaving := r.shards.owner(id), r.shards.leaving(id)
	owned := s != nil
	prev, _ := r.view.locks.Get(id)
	if prev.Epoch > rev {
		return // older than what the view holds (a notice behind the watch)
	}
	if p := r.shards.at(id).pending; p != nil && rev < p.goneAt {
		return // deleted since (a released notice came before this read's reply)
	}
	r.view.locks.Set(l)
	r.shardChangedLocked(id, l.Epoch, r.concernsLocked(id, prev.Lease, l.Lease))
	if owned && rev > s.epoch && !leaving && (l.Lease != r.att.lease || l.Epoch != s.epoch) {
		// A foreign write to this one lock: it costs this shard only.
		switch l.Lease {
		case r.att.lease:
			r.lockLostLocked(id, fmt.Sprintf("rewritten under this runner's lease at revision %d (by somebody else: epoch %d is dead)", rev, s.epoch))
		case storage.NoLease:
			r.lockLostLocked(id, fmt.Sprintf("replaced by a key without a lease at revision %d", rev))
		default:
			r.lockLostLocked(id, fmt.Sprintf("taken by lease %x at revision %d", l.Lease, rev))
		}
	}
	if l.Lease == storage.NoLease {
		// Never an owner: an assigned shard takes it over at once.
		r.shards.newWindow(id, time.Now())
	}
	if l.Lease != r.att.lease {
		r.shards.moveSeen(id) // the watch caught up with our handoff
	} else if !owned && !leaving && r.lifecycle.phase == phaseAttached && storage.Revision(rev) > r.att.rev && rev > r.shards.at(id).lastReleased && l.Owner == r.owner() {
		// A lock written under our lease, naming this incarnation, during
		// this attachment is ours at that epoch: a handoff's transfer to us
		// (possibly one we stopped wanting meanwhile: we then hand it on
		// properly), or our own acquire whose reply has not arrived yet.
		r.installInboundLocked(id, l)
	}
}

// lostLock is a shard dropped by lockLostLocked, to be logged.
type lostLock struct {
	shard  sharding.ShardID
	detail string
}

// flushLostLocked logs the shards dropped since the last call: one line
// naming the key, or one line for many (a lease that expired on the server
// deletes every lock at once). It reports whether any was dropped (the
// control loop then re-acquires what is still assigned).
func (r *Runner) flushLostLocked() bool {
	n := len(r.lostLocks)
	if n == 0 {
		return false
	}
	first := r.lostLocks[0]
	if n == 1 {
		r.log.Warn("owned lock changed behind this runner's back; dropped that shard", "key", storage.LockKey(first.shard), "detail", first.detail)
	} else {
		keys := make([]string, 0, min(n, 8))
		for _, l := range r.lostLocks[:min(n, 8)] {
			keys = append(keys, storage.LockKey(l.shard))
		}
		r.log.Warn("owned locks changed behind this runner's back; dropped those shards", "shards", n, "keys", strings.Join(keys, ","), "first_detail", first.detail)
	}
	r.lostLocks = r.lostLocks[:0]
	r.met.shardsLost.Add(context.Background(), int64(n), r.met.attrs)
	return true
}

// OwnerOf returns the ID of the runner shard id's sends go to from this
// runner. When it knows the shard's lock — every lock with
// Config.FullLockView, else those of the shards it owns or acquires — that
// is the runner whose lease holds it ("" when that is no member) with the
// lock's epoch; otherwise it is the owner it was last told of or the
// shard's assignee, with epoch 0 ("" when none is known).
func (r *Runner) OwnerOf(id sharding.ShardID) (string, storage.Epoch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if l, ok := r.view.locks.Get(id); ok {
		return r.view.byLease[l.Lease].ID, l.Epoch
	}
	if r.view.full {
		return "", 0
	}
	return r.ownerHintLocked(id), 0
}

// Members returns the runner records in this runner's view, by ID.
func (r *Runner) Members() []storage.Runner {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]storage.Runner, 0, len(r.view.members))
	for _, m := range r.view.members {
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b storage.Runner) int { return strings.Compare(a.ID, b.ID) })
	return out
}
