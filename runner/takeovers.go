package runner

import (
	"context"
	"slices"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Without a full lock view, a new owner taking a shard over does not see
// its old owner's lock change — a rewrite after the old owner re-attached
// under the same lease (a new epoch: the takeover, at the old one, can
// never be cut over), or a transfer whose notice this runner missed. So a
// takeover that has not completed re-reads the lock every takeoverRecheck:
// an acquisition attempt, which writes nothing while
// the lock is held (it returns the holder, and the round restarts a
// takeover whose lock changed), takes the lock if it was freed, and finds
// it under this runner's lease if it was transferred.

// takeoverRecheck is how long a takeover waits for its cutover before it
// reads its lock again (and again after as long): the retry window,
// between 1 s and 2 s (a takeover usually completes well within 1 s).
func (c Config) takeoverRecheck() time.Duration {
	return max(time.Second, min(c.AcquireRetryWindow, 2*time.Second))
}

// recheckTakeoverLocked adds shard id to the round's re-reads when its
// takeover has waited takeoverRecheck since it started or was last
// re-read, and asks for the shard to be decided again then. It runs once
// the round applied its decision on the shard: the takeover running then
// was left running or just started (restarts too). One just started arms
// its first re-read here: nothing else may ever decide the shard again —
// the lock may have been freed before the takeover started (a view older
// than a release told to another assignee), and then neither a cutover
// nor a notice comes.
func (r *Runner) recheckTakeoverLocked(id sharding.ShardID, now time.Time, p *plan) {
	x := r.shards.at(id)
	if r.view.full || x.inbound == nil || x.pending == nil {
		return
	}
	every := r.cfg.takeoverRecheck()
	since := x.inbound.Started()
	if x.pending.checked.After(since) {
		since = x.pending.checked
	}
	if now.Sub(since) >= every {
		x.pending.checked = now
		p.recheck = append(p.recheck, id)
		since = now
	}
	r.retryLocked(id, since.Add(every))
}

// recheckTakeovers reads the locks of takeovers again (see above).
func (r *Runner) recheckTakeovers(actx context.Context, gen uint64, leaseID storage.LeaseID, ids []sharding.ShardID) {
	r.mu.Lock()
	ids = slices.DeleteFunc(ids, func(id sharding.ShardID) bool { // completed meanwhile
		x := r.shards.at(id)
		return x.own != nil || x.inbound == nil
	})
	r.mu.Unlock()
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	cctx, cancel := r.opCtx(actx)
	res, err := r.store.Acquire(cctx, leaseID, r.owner(), ids)
	cancel()
	if actx.Err() != nil || err != nil {
		return // read again after takeoverRecheck
	}
	var rewrite []sharding.ShardID
	r.mu.Lock()
	if r.att.gen != gen || !r.mayOwnLocked() {
		r.mu.Unlock()
		return
	}
	for _, a := range res {
		switch a.Status {
		case storage.HeldElsewhere:
			if a.Holder.Epoch > 0 {
				r.applyLockPutLocked(a.Holder) // a changed lock restarts the takeover
			}
		case storage.Acquired:
			r.installLocked(a.Shard, a.Epoch) // freed meanwhile (a lock we just created: not installed here)
		case storage.AlreadyOwned:
			rewrite = append(rewrite, a.Shard) // transferred: never reuse an epoch we did not install
		}
	}
	r.mu.Unlock()
	if len(rewrite) > 0 {
		r.rewrite(actx, gen, leaseID, rewrite)
	}
}
