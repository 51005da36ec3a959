package runner

import (
	"context"
	"sync"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Stuck shards: without a full lock view no watch shows a lock deleted —
// except the lock of a shard whose acquisition's retry window ran out
// (its holder is no live member that would hand it off or tell of its
// release: a lease of no registered runner, a squatter). Each such lock is
// watched on its own until the shard is acquired or no longer wanted, so
// its deletion wakes the acquirer at once, as the lock watch did. At most
// maxStuckWatches at once; beyond, the resync retries them.

// maxStuckWatches bounds the locks of stuck shards watched at once.
const maxStuckWatches = 256

// stuckWatch is a request to watch shard id's lock from revision from
// (start: its watch is number gen), or to stop watching it (stop).
type stuckWatch struct {
	id   sharding.ShardID
	from storage.Revision
	gen  uint64
	stop bool
}

// stuckWatches are the watched locks of stuck shards (guarded by
// Runner.mu), each with the number of its watch: a watch that ends forgets
// its shard only if no later watch of it started meanwhile (a stop then a
// start of the same shard, the old goroutine ending after both). The
// goroutines run in followStuck.
type stuckWatches struct {
	watched map[sharding.ShardID]uint64
	gen     uint64          // the last watch's number
	req     chan stuckWatch // to followStuck; buffered, never blocks a sender holding r.mu
}

func newStuckWatches() stuckWatches {
	return stuckWatches{watched: make(map[sharding.ShardID]uint64), req: make(chan stuckWatch, maxStuckWatches)}
}

// watch watches shard id's lock from revision from (the holder's write,
// plus one), unless it is watched already or maxStuckWatches are watched
// (under Runner.mu; a runner with a full lock view needs none).
func (s *stuckWatches) watch(id sharding.ShardID, from storage.Revision) {
	if _, ok := s.watched[id]; ok || len(s.watched) >= maxStuckWatches {
		return
	}
	gen := s.gen + 1
	select {
	case s.req <- stuckWatch{id: id, from: from, gen: gen}:
		s.gen, s.watched[id] = gen, gen
	default:
	}
}

// unwatch stops watching shard id's lock (it was acquired, or is no longer
// wanted here; under Runner.mu).
func (s *stuckWatches) unwatch(id sharding.ShardID) {
	if _, ok := s.watched[id]; !ok {
		return
	}
	select {
	case s.req <- stuckWatch{id: id, stop: true}:
		delete(s.watched, id)
	default: // the watch ends at its next event, or with the run
	}
}

// followStuck runs the watches of stuck shards' locks until ctx ends.
func (r *Runner) followStuck(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	cancels := make(map[sharding.ShardID]context.CancelFunc)
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-r.view.stuck.req:
			if cancel := cancels[w.id]; cancel != nil {
				cancel()
				delete(cancels, w.id)
			}
			if w.stop {
				continue
			}
			wctx, cancel := context.WithCancel(ctx)
			cancels[w.id] = cancel
			wg.Go(func() { r.watchStuck(wctx, w.id, w.from, w.gen) })
		}
	}
}

// watchStuck applies the events of shard id's lock from revision from
// until ctx ends, the watch fails (the resync retries the shard) or the
// shard is no longer stuck. It is watch number gen of the shard.
func (r *Runner) watchStuck(ctx context.Context, id sharding.ShardID, from storage.Revision, gen uint64) {
	defer func() {
		r.mu.Lock()
		if r.view.stuck.watched[id] == gen {
			delete(r.view.stuck.watched, id)
		}
		r.mu.Unlock()
	}()
	for resp := range r.store.WatchKey(ctx, storage.LockKey(id), from) {
		if resp.Err != nil {
			return
		}
		r.mu.Lock()
		for _, ev := range resp.Events {
			r.applyLockLocked(ev)
		}
		p := r.shards.at(id).pending
		stuck := p != nil && r.assignedHereLocked(id)
		r.mu.Unlock()
		if !stuck {
			return
		}
	}
}
