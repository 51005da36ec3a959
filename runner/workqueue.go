package runner

import (
	"container/heap"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// workQueue is the control loop's queue of dirty shards, in the style of a
// Kubernetes controller's work queue: events (a lock or handoff record
// changed, an operation finished, a per-shard timer fired) mark the shards
// they concern, and a round decides each marked shard once. A full
// reconcile (membership changed, attach, resync) marks every shard: it
// costs O(shards) once, never per event. Guarded by Runner.mu.
type workQueue struct {
	queued []bool             // by shard
	ids    []sharding.ShardID // the marked shards, in marking order
	all    bool               // every shard is marked (ids is empty)
	n      int                // NumShards

	timers timerHeap                      // per-shard re-checks, earliest first
	at     map[sharding.ShardID]time.Time // each shard's earliest pending re-check
}

func newWorkQueue(n int) *workQueue {
	return &workQueue{queued: make([]bool, n), n: n, at: map[sharding.ShardID]time.Time{}}
}

// add marks shard id dirty.
func (q *workQueue) add(id sharding.ShardID) {
	if q.all || int(id) >= q.n || q.queued[id] {
		return
	}
	q.queued[id] = true
	q.ids = append(q.ids, id)
}

// addAll marks every shard dirty (a full reconcile).
func (q *workQueue) addAll() {
	for _, id := range q.ids {
		q.queued[id] = false
	}
	q.ids = q.ids[:0]
	q.all = true
}

// empty reports whether no shard is marked.
func (q *workQueue) empty() bool { return !q.all && len(q.ids) == 0 }

// take returns the marked shards and unmarks them; all reports a full
// reconcile (ids is then nil: every shard).
func (q *workQueue) take() (ids []sharding.ShardID, all bool) {
	if q.all {
		q.all = false
		return nil, true
	}
	ids = q.ids
	for _, id := range ids {
		q.queued[id] = false
	}
	q.ids = make([]sharding.ShardID, 0, min(cap(ids), 64))
	return ids, false
}

// after asks for shard id to be marked at t (a retry, a deadline). Only
// the earliest request per shard is kept; a later decision asks again if it
// still needs one.
func (q *workQueue) after(id sharding.ShardID, t time.Time) {
	if cur, ok := q.at[id]; ok && !t.Before(cur) {
		return
	}
	q.at[id] = t
	heap.Push(&q.timers, timerEntry{at: t, id: id})
}

// fire marks the shards whose re-check is due at now and returns when the
// next one is (ok false: none).
func (q *workQueue) fire(now time.Time) (next time.Time, ok bool) {
	for len(q.timers) > 0 {
		e := q.timers[0]
		if cur, live := q.at[e.id]; !live || !cur.Equal(e.at) {
			heap.Pop(&q.timers) // superseded by an earlier request
			continue
		}
		if e.at.After(now) {
			return e.at, true
		}
		heap.Pop(&q.timers)
		delete(q.at, e.id)
		q.add(e.id)
	}
	return time.Time{}, false
}

// reset forgets every mark and timer (detach).
func (q *workQueue) reset() {
	q.take()
	q.timers = q.timers[:0]
	clear(q.at)
}

type timerEntry struct {
	at time.Time
	id sharding.ShardID
}

type timerHeap []timerEntry

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timerEntry)) }
func (h *timerHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// lockView is this runner's view of every shard's lock (the lock watch),
// indexed by shard: every runner holds the whole table, and the control
// loop and routing read it on every decision, so it is a slice, not a map.
// A shard without a lock has Epoch 0 (epochs are revisions, > 0). Guarded
// by Runner.mu.
type lockView []storage.Lock

// get returns shard id's lock; held is false when it has none.
func (v lockView) get(id sharding.ShardID) (l storage.Lock, held bool) {
	l = v[id]
	return l, l.Epoch != 0
}

// set records l as its shard's lock.
func (v lockView) set(l storage.Lock) { v[l.Shard] = l }

// del records that shard id has no lock.
func (v lockView) del(id sharding.ShardID) { v[id] = storage.Lock{} }

// reset forgets every lock.
func (v lockView) reset() { clear(v) }
