package runner

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// Moved notices: the old owner of a handoff, once its cutover transaction
// moved a shard's lock to the new owner, tells the new owner so directly
// (transport Moved) instead of leaving it to the new owner's lock watch,
// which at scale trails the store by the whole cluster's events (every
// runner watches every lock: a membership change's events reach each
// watcher behind everyone else's).
//
// The notice is only a hint to look now: the new owner trusts no peer
// with its ownership. For each move naming its own lease and incarnation
// at a revision its lock watch has not reached, it reads the lock back
// (storage Verify: the key under its lease at that revision, a
// linearizable read) and only then applies the lock as its watch would
// have — the same install, under the same conditions (attached, before
// the detach instant, the lease and incarnation its own). The watch's own
// event for that revision, when it comes, changes nothing; an older event
// of the shard's lock is skipped (applyLockLocked). A notice that is lost,
// late or refused costs the wait for the watch, as before.

// movedNoticeTimeout bounds the old owner's Moved call (the new owner
// reads the moves back from the store before it answers).
const movedNoticeTimeout = 3 * time.Second

// tellMoved tells each new owner of moved the shards whose locks this
// runner's cutover moved to it (one call per new owner, concurrently,
// bounded by ctx and movedNoticeTimeout). Errors are ignored: the new
// owner's watch shows the moves anyway.
func (r *Runner) tellMoved(ctx context.Context, moved map[string][]transport.ShardMove) {
	var wg sync.WaitGroup
	for to, moves := range moved {
		r.mu.Lock()
		m, ok := r.view.members[to]
		r.mu.Unlock()
		if !ok || m.Address == "" {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, movedNoticeTimeout)
			defer cancel()
			if err := r.net.Moved(cctx, m.Address, r.cfg.ID, moves); err != nil {
				r.log.Debug("telling the new owner of its shards failed (its watch will show them)", "to", to, "shards", len(moves), "err", err)
			}
		})
	}
	wg.Wait()
}

// heardMoved applies the moves another runner says it made to this runner
// once it has read them back from the store (see above).
func (r *Runner) heardMoved(from string, moves []transport.ShardMove) {
	r.mu.Lock()
	if r.lifecycle.phase != phaseAttached {
		r.mu.Unlock()
		return
	}
	gen, actx, lease := r.gen, r.attachCtx, r.lease
	var held []storage.Held
	for _, mv := range moves {
		if l, ok := r.movedLockLocked(mv); ok {
			held = append(held, storage.Held{Shard: l.Shard, Epoch: l.Epoch})
		}
	}
	r.mu.Unlock()
	if len(held) == 0 {
		return
	}
	cctx, cancel := r.opCtx(actx)
	lost, err := r.store.Verify(cctx, lease, held)
	cancel()
	if err != nil {
		r.log.Debug("reading back the shards a runner moved here failed (the watch will show them)", "from", from, "shards", len(held), "err", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen != gen {
		return // detached meanwhile
	}
	for _, mv := range moves {
		l, ok := r.movedLockLocked(mv)
		if !ok || slices.ContainsFunc(lost, func(x storage.LostLock) bool { return x.Shard == l.Shard }) {
			continue
		}
		r.applyLockPutLocked(l)
	}
	r.flushLostLocked()
}

// movedLockLocked returns the lock a move names, if it is one this runner
// may learn ahead of its watch: a shard of the cluster, under this
// runner's lease naming this incarnation, at a revision the lock watch has
// not reached and newer than the view's lock of the shard.
func (r *Runner) movedLockLocked(mv transport.ShardMove) (storage.Lock, bool) {
	l := storage.Lock{
		Shard: sharding.ShardID(mv.Shard), Lease: storage.LeaseID(mv.Lease), Epoch: storage.Epoch(mv.Epoch),
		Owner: storage.Owner{RunnerID: r.cfg.ID, Incarnation: mv.Incarnation},
	}
	if int(mv.Shard) >= r.cfg.NumShards || l.Lease != r.lease || l.Lease == storage.NoLease || l.Owner != r.owner() ||
		storage.Revision(l.Epoch) <= r.view.seen.Locks {
		return l, false
	}
	prev, _ := r.view.locks.Get(l.Shard)
	return l, prev.Epoch < l.Epoch
}
