package control

import (
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// TestQueueDecidesEachMarkedShardOnce: a shard marked many times between
// two rounds is taken once, in the order it was first marked, and is
// unmarked by Take (marking it again queues it again); a shard out of
// range is ignored.
func TestQueueDecidesEachMarkedShardOnce(t *testing.T) {
	q := NewQueue(8)
	if !q.Empty() {
		t.Fatal("a new queue is not empty")
	}
	for _, id := range []sharding.ShardID{5, 2, 5, 5, 7, 2, 8, 100} {
		q.Add(id)
	}
	if q.Empty() {
		t.Fatal("a queue with marked shards is empty")
	}
	ids, all := q.Take()
	if want := []sharding.ShardID{5, 2, 7}; all || !slices.Equal(ids, want) {
		t.Errorf("Take() = %v, %v; want %v, false", ids, all, want)
	}
	if !q.Empty() {
		t.Error("not empty after Take")
	}
	if ids, all := q.Take(); all || len(ids) != 0 {
		t.Errorf("a second Take() = %v, %v; want nothing", ids, all)
	}
	q.Add(2)
	if ids, _ := q.Take(); !slices.Equal(ids, []sharding.ShardID{2}) {
		t.Errorf("Take() after marking a taken shard again = %v, want [2]", ids)
	}
}

// TestQueueFullReconcileSupersedesMarks: AddAll marks every shard; Take
// then reports a full reconcile once (no list), shards marked before or
// during it are not decided a second time, and marks after the Take count
// again.
func TestQueueFullReconcileSupersedesMarks(t *testing.T) {
	q := NewQueue(8)
	q.Add(1)
	q.Add(3)
	q.AddAll()
	q.Add(4) // during the full reconcile: already covered
	if q.Empty() {
		t.Fatal("empty after AddAll")
	}
	if ids, all := q.Take(); !all || ids != nil {
		t.Fatalf("Take() after AddAll = %v, %v; want nil, true", ids, all)
	}
	if !q.Empty() {
		t.Fatalf("not empty after the full reconcile was taken")
	}
	q.Add(1) // was marked before AddAll: its mark must not linger
	if ids, all := q.Take(); all || !slices.Equal(ids, []sharding.ShardID{1}) {
		t.Errorf("Take() after the full reconcile = %v, %v; want [1], false", ids, all)
	}
}

// TestQueueAddMovedMarksTheShardsGivenOrTaken: only the shards whose
// assignment to the runner changed (given to it or taken from it) are
// marked, not those moving between two other runners.
func TestQueueAddMovedMarksTheShardsGivenOrTaken(t *testing.T) {
	q := NewQueue(6)
	old := sharding.Assignment{"me", "a", "me", "b", "a", "me"}
	now := sharding.Assignment{"me", "me", "a", "a", "b", "me"}
	q.AddMoved(CompactAssignment(old), CompactAssignment(now), "me")
	if ids, _ := q.Take(); !slices.Equal(ids, []sharding.ShardID{1, 2}) {
		t.Errorf("AddMoved(%v, %v) marked %v, want [1 2]", old, now, ids)
	}
	q.AddMoved(CompactAssignment(old[:2]), CompactAssignment(now), "me") // a shorter old assignment: only the shards it covers
	if ids, _ := q.Take(); !slices.Equal(ids, []sharding.ShardID{1}) {
		t.Errorf("AddMoved with a short old assignment marked %v, want [1]", ids)
	}
}

// TestQueueTimersFireInTimeOrder: re-checks asked for in any order mark
// their shards when due, earliest first, and Fire reports when the next is
// due.
func TestQueueTimersFireInTimeOrder(t *testing.T) {
	q := NewQueue(8)
	q.After(3, ms(30))
	q.After(1, ms(10))
	q.After(2, ms(20))
	if next, ok := q.Fire(ms(5)); !ok || !next.Equal(ms(10)) {
		t.Fatalf("Fire(5ms) = %v, %v; want 10ms, true", next, ok)
	}
	if !q.Empty() {
		t.Fatal("a shard was marked before its re-check was due")
	}
	if next, ok := q.Fire(ms(25)); !ok || !next.Equal(ms(30)) {
		t.Fatalf("Fire(25ms) = %v, %v; want 30ms, true", next, ok)
	}
	if ids, _ := q.Take(); !slices.Equal(ids, []sharding.ShardID{1, 2}) {
		t.Errorf("due at 25ms: %v, want [1 2] in time order", ids)
	}
	if _, ok := q.Fire(ms(30)); ok {
		t.Error("Fire reports a next re-check after the last one fired")
	}
	if ids, _ := q.Take(); !slices.Equal(ids, []sharding.ShardID{3}) {
		t.Errorf("due at 30ms: %v, want [3]", ids)
	}
}

// TestQueueKeepsTheEarliestTimerPerShard: a later request for a shard with
// a pending re-check changes nothing; an earlier one replaces it, and the
// shard is marked once, at the earlier time.
func TestQueueKeepsTheEarliestTimerPerShard(t *testing.T) {
	q := NewQueue(8)
	q.After(4, ms(20))
	q.After(4, ms(10)) // earlier: replaces
	q.After(4, ms(50)) // later: ignored
	if next, ok := q.Fire(ms(0)); !ok || !next.Equal(ms(10)) {
		t.Fatalf("Fire(0) = %v, %v; want 10ms, true", next, ok)
	}
	if next, ok := q.Fire(ms(10)); ok {
		t.Errorf("after the earliest fired, the superseded ones still pending: next %v", next)
	}
	if ids, _ := q.Take(); !slices.Equal(ids, []sharding.ShardID{4}) {
		t.Errorf("marked %v, want [4] once", ids)
	}
	q.After(4, ms(40)) // a new request after the timer fired counts again
	if next, ok := q.Fire(ms(10)); !ok || !next.Equal(ms(40)) {
		t.Errorf("a new request after firing: next %v, %v; want 40ms", next, ok)
	}
}

// TestQueueResetForgetsMarksAndTimers: after Reset nothing is marked, no
// re-check is pending, and a full reconcile asked for before is gone.
func TestQueueResetForgetsMarksAndTimers(t *testing.T) {
	q := NewQueue(8)
	q.Add(1)
	q.After(2, ms(10))
	q.Reset()
	if !q.Empty() {
		t.Error("marks survive Reset")
	}
	if next, ok := q.Fire(ms(100)); ok || !q.Empty() {
		t.Errorf("a timer survives Reset: next %v, %v, marked %v", next, ok, !q.Empty())
	}
	q.AddAll()
	q.Reset()
	if ids, all := q.Take(); all || len(ids) != 0 {
		t.Errorf("a full reconcile survives Reset: %v, %v", ids, all)
	}
	q.After(2, ms(50)) // the shard's forgotten timer does not hide a new one
	if next, ok := q.Fire(ms(0)); !ok || !next.Equal(ms(50)) {
		t.Errorf("a timer after Reset: next %v, %v; want 50ms", next, ok)
	}
}
