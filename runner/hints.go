package runner

import (
	"slices"
	"sync"

	"github.com/shardhost/shardhost/sharding"
)

// Without a full lock view (Config.FullLockView), a runner routes a send
// to the shard's assignee unless it knows better: a lock in its view (a
// shard that concerns it), the runner it just handed the shard to, or a
// hint — the owner named by a runner that answered "not the owner" for
// the shard, or to which this runner handed it off. Hints are bounded
// (maxOwnerHints: a full table forgets its oldest) and only ever
// route: a wrong one costs an answer "not the owner", with a better hint,
// or a send to the assignee.

// maxOwnerHints bounds the owner hints a runner keeps.
const maxOwnerHints = 4096

// ownerHints is the owner hints, by shard, with a lock of their own (a
// remote send reads them and records its reply's owner, without the
// runner's lock); a full table forgets its oldest hint first.
type ownerHints struct {
	mu    sync.Mutex
	m     map[sharding.ShardID]string
	order []sharding.ShardID // shards hinted, oldest first (some forgotten since)
}

// get returns the runner hinted as shard id's owner.
func (h *ownerHints) get(id sharding.ShardID) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	owner, ok := h.m[id]
	return owner, ok
}

// set hints owner as shard id's owner.
func (h *ownerHints) set(id sharding.ShardID, owner string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.m[id]; ok && cur == owner {
		return // most replies confirm what is known: no write
	}
	if h.m == nil {
		h.m = make(map[sharding.ShardID]string)
	}
	if _, ok := h.m[id]; !ok {
		for len(h.m) >= maxOwnerHints && len(h.order) > 0 {
			delete(h.m, h.order[0])
			h.order = h.order[1:]
		}
		if len(h.order) >= 2*maxOwnerHints { // forgotten ones pile up: compact
			h.order = slices.DeleteFunc(h.order, func(s sharding.ShardID) bool { _, ok := h.m[s]; return !ok })
		}
		h.order = append(h.order, id)
	}
	h.m[id] = owner
}

// seed hints owner as shard id's owner unless a hint is known (an
// answer is newer news than an assignment).
func (h *ownerHints) seed(id sharding.ShardID, owner string) {
	h.mu.Lock()
	_, ok := h.m[id]
	h.mu.Unlock()
	if !ok {
		h.set(id, owner)
	}
}

// seedPreviousAssigneesLocked keeps, for each shard a new assignment gives
// to another runner, its previous assignee as the owner hint when no
// answer named one and that runner is still a member: it owns the shard
// until it hands it off (a planned move's new owner warms first), so sends
// keep going to the owner instead of to a new assignee that does not own
// the shard yet — one that, should it die while warming, leaves a send it
// was given undecided (ErrMaybeDelivered). Once the shard moved, the old
// owner names the new one. Only without a full lock view; a cold start
// (no previous assignment) seeds nothing.
func (r *Runner) seedPreviousAssigneesLocked(old, a sharding.Assignment) {
	if r.fullView || len(old) != len(a) {
		return
	}
	for id, was := range old {
		if was == a[id] || was == "" || was == r.cfg.ID {
			continue
		}
		if _, member := r.view.members[was]; member {
			r.hints.seed(sharding.ShardID(id), was)
		}
	}
}

// forget drops the hint of shard id if it names owner ("": whatever it
// names).
func (h *ownerHints) forget(id sharding.ShardID, owner string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.m[id]; ok && (owner == "" || cur == owner) {
		delete(h.m, id)
	}
}

// learned records what a send learned of shard id's owner (routing calls
// it through routingDir.Learned): a runner answered "not the owner" naming
// owner, or refused without a hint (owner "": the hint naming that runner,
// refused, is forgotten), or owner answered the send (refusedBy ""). A
// runner whose replies came last is kept as the shard's owner when the
// assignment changes, until it hands the shard off (it then names the new
// owner): sends keep going to the owner, not to an assignee that does not
// own the shard yet. Only without a full lock view: with one, the lock
// watch says. A hint names a member; routing checks again that it still
// is one.
func (r *Runner) learned(id sharding.ShardID, owner, refusedBy string) {
	if r.fullView || int(id) >= r.cfg.NumShards || owner == r.cfg.ID {
		return
	}
	if owner == "" || owner == refusedBy {
		r.hints.forget(id, refusedBy)
		return
	}
	if refusedBy == "" { // a reply: the sender routed there, a member
		r.hints.set(id, owner)
		return
	}
	r.mu.Lock()
	_, member := r.view.members[owner]
	r.mu.Unlock()
	if member {
		r.hints.set(id, owner)
	}
}

// ownerHintLocked names the runner this runner believes owns shard id, for
// a sender it answers "not the owner": the lock's holder in its view, the
// runner it handed the shard to, a hint, else the shard's assignee when
// that is another member ("": none known).
func (r *Runner) ownerHintLocked(id sharding.ShardID) string {
	if l, held := r.view.locks.Get(id); held {
		if m, ok := r.view.byLease[l.Lease]; ok {
			return m.ID
		}
	}
	if to := r.shards.at(id).movedTo; to != "" {
		return to
	}
	if to, ok := r.hints.get(id); ok {
		if _, member := r.view.members[to]; member {
			return to
		}
	}
	if !r.fullView {
		if to := r.assigneeToTellLocked(id); to != "" {
			return to
		}
	}
	return ""
}
