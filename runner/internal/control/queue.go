package control

import (
	"container/heap"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// Queue is the control loop's queue of dirty shards, in the style of a
// Kubernetes controller's work queue: events (a lock or handoff record
// changed, an operation finished, a per-shard timer fired) mark the shards
// they concern, and a round decides each marked shard once. A full
// reconcile (membership changed, attach, resync) marks every shard: it
// costs O(shards) once, never per event.
type Queue struct {
	queued []uint64           // by shard, a bit each
	ids    []sharding.ShardID // the marked shards, in marking order
	all    bool               // every shard is marked (ids is empty)
	n      int                // the number of shards

	timers timerHeap                      // per-shard re-checks, earliest first
	at     map[sharding.ShardID]time.Time // each shard's earliest pending re-check
}

// NewQueue returns an empty queue for shards 0 to n-1.
func NewQueue(n int) *Queue {
	return &Queue{queued: make([]uint64, (n+63)/64), n: n, at: map[sharding.ShardID]time.Time{}}
}

// Add marks shard id dirty. Marking a marked shard, or any shard during a
// full reconcile, changes nothing; a shard out of range is ignored.
func (q *Queue) Add(id sharding.ShardID) {
	if q.all || int(id) >= q.n || q.queued[id/64]&(1<<(id%64)) != 0 {
		return
	}
	q.queued[id/64] |= 1 << (id % 64)
	q.ids = append(q.ids, id)
}

// AddMoved marks the shards that assignment a gives to runner me or takes
// from it, compared with assignment old (one pass of string comparisons).
// A shard beyond the end of old is not marked: a longer assignment is a
// new cluster size, which a full reconcile handles.
func (q *Queue) AddMoved(old, a Assignment, me string) {
	for id, to := range a.All() {
		if int(id) < old.Len() && (old.Of(id) == me) != (to == me) {
			q.Add(id)
		}
	}
}

// AddAll marks every shard dirty (a full reconcile).
func (q *Queue) AddAll() {
	for _, id := range q.ids {
		q.queued[id/64] &^= 1 << (id % 64)
	}
	q.ids = q.ids[:0]
	q.all = true
}

// Empty reports whether no shard is marked.
func (q *Queue) Empty() bool { return !q.all && len(q.ids) == 0 }

// Take returns the marked shards, in marking order, and unmarks them; all
// reports a full reconcile (ids is then nil: every shard).
func (q *Queue) Take() (ids []sharding.ShardID, all bool) {
	if q.all {
		q.all = false
		return nil, true
	}
	ids = q.ids
	for _, id := range ids {
		q.queued[id/64] &^= 1 << (id % 64)
	}
	q.ids = make([]sharding.ShardID, 0, min(cap(ids), 64))
	return ids, false
}

// After asks for shard id to be marked at t (a retry, a deadline). Only
// the earliest request per shard is kept; a later decision asks again if it
// still needs one.
func (q *Queue) After(id sharding.ShardID, t time.Time) {
	if cur, ok := q.at[id]; ok && !t.Before(cur) {
		return
	}
	q.at[id] = t
	heap.Push(&q.timers, timerEntry{at: t, id: id})
}

// Fire marks the shards whose re-check is due at now and returns when the
// next one is (ok false: none).
func (q *Queue) Fire(now time.Time) (next time.Time, ok bool) {
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
		q.Add(e.id)
	}
	return time.Time{}, false
}

// Reset forgets every mark and timer (detach).
func (q *Queue) Reset() {
	q.Take()
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
