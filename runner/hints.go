package runner

import (
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/runner/internal/control"
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
	m     map[sharding.ShardID]ownerHint
	order []sharding.ShardID // shards hinted, oldest first (some forgotten since)
}

// ownerHint is one shard's hint: confirmed (an answer named the owner, or
// this runner handed the shard to it) or tentative until a time (a moved
// shard's previous assignee: seed).
type ownerHint struct {
	owner string
	until time.Time // zero: confirmed
}

// get returns the runner a confirmed hint names as shard id's owner.
func (h *ownerHints) get(id sharding.ShardID) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x, ok := h.m[id]
	return x.owner, ok && x.until.IsZero()
}

// route returns the runner sends of shard id go to by its hint: a
// confirmed one, or a tentative one not past its time (tentative true).
func (h *ownerHints) route(id sharding.ShardID, now time.Time) (owner string, tentative, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	x, ok := h.m[id]
	if ok && !x.until.IsZero() && !now.Before(x.until) {
		delete(h.m, id)
		return "", false, false
	}
	return x.owner, !x.until.IsZero(), ok
}

// set hints owner as shard id's owner (confirmed).
func (h *ownerHints) set(id sharding.ShardID, owner string) {
	h.put(id, ownerHint{owner: owner})
}

// put records shard id's hint.
func (h *ownerHints) put(id sharding.ShardID, x ownerHint) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.m[id]; ok && cur == x {
		return // most replies confirm what is known: no write
	}
	if h.m == nil {
		h.m = make(map[sharding.ShardID]ownerHint)
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
	h.m[id] = x
}

// seed hints owner, tentatively until until, as shard id's owner unless
// a hint is known (an answer is newer news than an assignment).
func (h *ownerHints) seed(id sharding.ShardID, owner string, until time.Time) {
	h.mu.Lock()
	_, ok := h.m[id]
	h.mu.Unlock()
	if !ok {
		h.put(id, ownerHint{owner: owner, until: until})
	}
}

// seedPreviousAssigneesLocked keeps, for each shard a new assignment gives
// to another runner, its previous assignee as a tentative route when no
// answer named an owner and that runner is still a member: it owns the
// shard until it hands it off (a planned move's new owner warms first),
// so sends keep going to the owner instead of to a new assignee that does
// not own the shard yet — one that, should it die while warming, leaves
// a send it was given undecided (ErrMaybeDelivered). Once the shard
// moved, the old owner names the new one. A tentative route lasts as long
// as a planned move may (WarmTimeout + DrainTimeout) and is not an owner
// this runner names to others (OwnerOf, NotOwner answers): it only
// routes. Only without a full lock view, and only towards a runner that
// has been a member long enough to own anything.
func (r *Runner) seedPreviousAssigneesLocked(old, a control.Assignment) {
	if r.view.full || old.Len() != a.Len() {
		return
	}
	now := time.Now()
	until := now.Add(r.cfg.WarmTimeout + r.cfg.DrainTimeout)
	for id, was := range old.All() {
		if was == a.Of(id) || was == "" || was == r.cfg.ID {
			continue
		}
		// A member for less than a few debounces owns nothing yet: the
		// storm rule keeps a runner that owns nothing from acquiring until
		// its view was quiet for 5 x RebalanceDebounce (runners starting
		// together: the first assignments' assignees never owned a shard).
		if m, member := r.view.members[was]; member && now.Sub(m.Started) >= 5*r.cfg.RebalanceDebounce {
			r.view.hints.seed(id, was, until)
		}
	}
}

// forget drops the hint of shard id if it names owner ("": whatever it
// names).
func (h *ownerHints) forget(id sharding.ShardID, owner string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if cur, ok := h.m[id]; ok && (owner == "" || cur.owner == owner) {
		delete(h.m, id)
	}
}

// learned records what a send learned of shard id's owner (routing calls
// it through routingDir.Learned): a runner answered "not the owner" naming
// owner (the hint naming the refusing runner is forgotten; owner, if a
// member, is hinted), or refused without a hint (owner ""), or owner
// answered the send (refusedBy ""). A
// runner whose replies came last is kept as the shard's owner when the
// assignment changes, until it hands the shard off (it then names the new
// owner): sends keep going to the owner, not to an assignee that does not
// own the shard yet. Only without a full lock view: with one, the lock
// watch says. A hint names a member; routing checks again that it still
// is one.
func (r *Runner) learned(id sharding.ShardID, owner, refusedBy string) {
	if r.view.full || int(id) >= r.cfg.NumShards {
		return
	}
	if owner == r.cfg.ID {
		owner = "" // this runner: no hint
	}
	if refusedBy == "" { // a reply: the sender routed there, a member
		if owner != "" {
			r.view.hints.set(id, owner)
		}
		return
	}
	// refusedBy is not the owner: a hint naming it is wrong, whatever it
	// names instead.
	r.view.hints.forget(id, refusedBy)
	if owner == "" || owner == refusedBy {
		return
	}
	r.mu.Lock()
	_, member := r.view.members[owner]
	r.mu.Unlock()
	if member {
		r.view.hints.set(id, owner)
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
	if to, ok := r.view.hints.get(id); ok {
		if _, member := r.view.members[to]; member {
			return to
		}
	}
	if !r.view.full {
		if to := r.view.assigneeToTell(id, r.cfg.ID); to != "" {
			return to
		}
	}
	return ""
}
