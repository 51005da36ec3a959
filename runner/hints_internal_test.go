package runner

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestOwnerHintsFollowAnswersAndStayBounded: without a full lock view, a
// "not the owner" answer naming a member routes the shard's later sends
// there; one naming an unknown runner, this runner or the refusing runner
// itself is no hint; any refusal forgets the hint naming the refuser; the table
// keeps at most maxOwnerHints, forgetting its oldest first.
func TestOwnerHintsFollowAnswersAndStayBounded(t *testing.T) {
	r := attachedRunner(t, 100,
		storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "x", Address: "x:1", Incarnation: "x1"}, Lease: 101},
		storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "y", Address: "y:1", Incarnation: "y1"}, Lease: 102})
	d := routingDir{r}
	route := func(id sharding.ShardID) string {
		m, ok := d.Route(id)
		if !ok {
			return ""
		}
		return m.ID
	}
	d.Learned(1, "x", "y")
	if got := route(1); got != "x" {
		t.Fatalf("after y named x: route = %q, want x", got)
	}
	d.Learned(1, "ghost", "y") // y refuses naming an unknown runner: no hint, x's stays
	if got := route(1); got != "x" {
		t.Fatalf("after a hint naming no member: route = %q, want x still", got)
	}
	d.Learned(1, "ghost", "x") // x refuses: its hint goes; the unknown runner is none
	if got := route(1); got != "" {
		t.Fatalf("after x refused naming an unknown runner: route = %q, want none (the assignment decides)", got)
	}
	d.Learned(1, "x", "y")
	d.Learned(1, "me", "x") // x refuses naming this runner: forgotten, no hint
	if got := route(1); got != "" {
		t.Fatalf("after x refused naming this runner: route = %q, want none", got)
	}
	d.Learned(1, "x", "y")
	d.Learned(1, "x", "x") // x refuses, naming itself: forgotten
	if got := route(1); got != "" {
		t.Fatalf("after x refused naming itself: route = %q, want none (the assignment decides)", got)
	}
	d.Learned(2, "y", "x")
	d.Learned(2, "", "y") // y refuses without a hint: forgotten
	if got := route(2); got != "" {
		t.Fatalf("after y refused without a hint: route = %q, want none", got)
	}

	for i := range maxOwnerHints + 10 {
		d.Learned(sharding.ShardID(i%4)+4, "x", "y") // a few shards, hinted over and over
		r.mu.Lock()
		r.view.hints.set(sharding.ShardID(1000+i), "y")
		r.mu.Unlock()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := len(r.view.hints.m); n > maxOwnerHints {
		t.Errorf("%d hints kept, want at most %d", n, maxOwnerHints)
	}
	if _, ok := r.view.hints.get(1000); ok {
		t.Error("the oldest hint is kept in a full table")
	}
	if _, ok := r.view.hints.get(sharding.ShardID(1000 + maxOwnerHints + 9)); !ok {
		t.Error("the newest hint is not kept")
	}
	if len(r.view.hints.order) > 2*maxOwnerHints+1 {
		t.Errorf("the hints' order holds %d entries, want it compacted", len(r.view.hints.order))
	}
}

// TestMovedShardRoutesToItsPreviousAssigneeForAWhile: a new assignment
// routes each moved shard to its previous assignee (still a member: it
// owns the shard until its handoff), tentatively — not an owner OwnerOf
// names, not over an answer that named one, and only for as long as a
// planned move may take; a previous assignee that left routes nothing.
func TestMovedShardRoutesToItsPreviousAssigneeForAWhile(t *testing.T) {
	r := attachedRunner(t, 100,
		storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "x", Address: "x:1", Incarnation: "x1"}, Lease: 101},
		storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "y", Address: "y:1", Incarnation: "y1"}, Lease: 102})
	d := routingDir{r}
	d.Learned(2, "y", "x") // an answer named y for shard 2
	r.mu.Lock()
	r.seedPreviousAssigneesLocked(control.CompactAssignment(sharding.Assignment{"x", "x", "x", "gone"}), control.CompactAssignment(sharding.Assignment{"y", "x", "y", "y"}))
	r.mu.Unlock()
	route := func(id sharding.ShardID, at time.Time) string {
		to, _, _ := r.view.hints.route(id, at)
		return to
	}
	now := time.Now()
	if got := route(0, now); got != "x" {
		t.Errorf("moved shard 0 routes to %q, want its previous assignee x", got)
	}
	if owner, _ := r.OwnerOf(0); owner == "x" {
		t.Error("OwnerOf names the previous assignee: a tentative route is no owner")
	}
	r.mu.Lock()
	r.seedPreviousAssigneesLocked(control.CompactAssignment(sharding.Assignment{"x", "x", "x", "x"}), control.CompactAssignment(sharding.Assignment{"x", "x", "x", "y"}))
	r.mu.Unlock()
	d.Learned(3, "ghost", "x") // x refuses, naming a runner this one does not know
	if got := route(3, now); got != "" {
		t.Errorf("after its previous assignee refused it, shard 3 routes to %q, want none (the assignee)", got)
	}
	if got := route(1, now); got != "" {
		t.Errorf("unmoved shard 1 routes to %q by hint, want none", got)
	}
	if got := route(2, now); got != "y" {
		t.Errorf("shard 2 routes to %q, want y (the answer wins over the assignment)", got)
	}
	if got := route(3, now); got != "" {
		t.Errorf("shard 3, whose previous assignee left, routes to %q, want none", got)
	}
	if got := route(0, now.Add(r.cfg.WarmTimeout+r.cfg.DrainTimeout+time.Second)); got != "" {
		t.Errorf("shard 0 still routes to %q after a planned move's bound, want the assignee", got)
	}
}
