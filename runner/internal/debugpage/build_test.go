package debugpage

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

var t0 = time.Unix(1_000_000, 0)

func member(id string, lease storage.LeaseID) storage.Runner {
	return storage.Runner{RunnerRecord: storage.RunnerRecord{ID: id, Weight: 1, Incarnation: id + "-inc"}, Lease: lease}
}

// clusterSnapshot is runner a's view of 8 shards: a (lease 1) owns 0, 1;
// b (lease 2) owns 2; shard 3 is locked under a lease of no runner, shard
// 4 under the lease of a runner not listed (z), 5-7 under none, and a
// stray lock names shard 9 of 8. The assignment gives 0, 1, 2, 5 to a, 3
// and 4 to b, 6 to nobody, and is too short for 7. Runner c (lease 3,
// weight 0) is registered and owns nothing.
func clusterSnapshot() Snapshot {
	return Snapshot{
		ID: "a", Incarnation: "a-inc", NumShards: 8, Strategy: "rendezvous", Weight: 1, DetachMargin: 2 * time.Second,
		Phase: "attached", Attached: true, Started: t0.Add(-time.Minute),
		Lease: 0x2a, LeaseTTL: 10 * time.Second, LeaseDeadline: t0.Add(7 * time.Second), Owned: 2,
		Members: []storage.Runner{member("a", 1), member("b", 2), member("c", 3)},
		Locks: []storage.Lock{
			{Shard: 0, Lease: 1, Epoch: 10}, {Shard: 1, Lease: 1, Epoch: 11}, {Shard: 2, Lease: 2, Epoch: 12},
			{Shard: 3, Lease: 99, Epoch: 13}, {Shard: 4, Lease: 5, Epoch: 14}, {Shard: 9, Lease: 1, Epoch: 19},
		},
		ByLease:    map[storage.LeaseID]string{1: "a", 2: "b", 3: "c", 5: "z"},
		Assignment: sharding.Assignment{"a", "a", "a", "b", "b", "a", ""},
		Handoffs: []storage.Handoff{
			{Shard: 1, HandoffRecord: storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffWarming}, Lease: 2},
			{Shard: 2, Lease: 3},  // between b and c: not decoded by a
			{Shard: 3, Lease: 3},  // to c, from an unknown owner
			{Shard: 20, Lease: 3}, // past the shard count
		},
	}
}

// TestBuildShardMap: each shard's owner is the runner whose lease holds
// its lock, a lock under a lease of no listed runner is an unknown owner,
// and every assigned shard not locked by its assignee is a move.
func TestBuildShardMap(t *testing.T) {
	st := build(clusterSnapshot(), t0, true, &rateSampler{})
	sh := st.Shards
	if want := []int{0, 0, 1, UnknownOwner, UnknownOwner, Unowned, Unowned, Unowned}; !slices.Equal(sh.Owner, want) {
		t.Errorf("Owner = %v, want %v", sh.Owner, want)
	}
	if want := []int64{10, 11, 12, 13, 14, 0, 0, 0}; !slices.Equal(sh.Epoch, want) {
		t.Errorf("Epoch = %v, want %v", sh.Epoch, want)
	}
	if sh.Count != 8 || sh.Owned != 3 || sh.UnknownOwner != 2 || sh.Unowned != 3 {
		t.Errorf("count %d, owned %d, unknown %d, unowned %d; want 8, 3, 2, 3", sh.Count, sh.Owned, sh.UnknownOwner, sh.Unowned)
	}
	wantMoves := []Move{{Shard: 2, From: "b", To: "a"}, {Shard: 3, To: "b"}, {Shard: 4, To: "b"}, {Shard: 5, To: "a"}}
	if !slices.Equal(sh.Moves, wantMoves) {
		t.Errorf("Moves = %+v, want %+v", sh.Moves, wantMoves)
	}
	for i, want := range []struct {
		id              string
		owned, assigned int
		self            bool
	}{{"a", 2, 4, true}, {"b", 1, 2, false}, {"c", 0, 0, false}} {
		r := st.Runners[i]
		if r.ID != want.id || r.Owned != want.owned || r.Assigned != want.assigned || r.Self != want.self {
			t.Errorf("Runners[%d] = %s owned %d assigned %d self %v; want %s %d %d %v",
				i, r.ID, r.Owned, r.Assigned, r.Self, want.id, want.owned, want.assigned, want.self)
		}
	}
	if st.Self.Assigned != 4 || st.Self.Owned != 2 {
		t.Errorf("Self assigned %d, owned %d; want 4, 2", st.Self.Assigned, st.Self.Owned)
	}
	if colors := runnerColors([]string{"a", "b", "c"}); st.Runners[0].Color != colors[0] || st.Runners[2].Color != colors[2] {
		t.Errorf("colours %q %q %q, want %v", st.Runners[0].Color, st.Runners[1].Color, st.Runners[2].Color, colors)
	}
	if st := build(clusterSnapshot(), t0, false, &rateSampler{}); st.Shards.Epoch != nil {
		t.Errorf("Epoch = %v without epochs, want none", st.Shards.Epoch)
	}
}

// TestBuildHandoffs: a decoded record is listed as it is; a record between
// two other runners is named by the shard's owner and the record's lease.
func TestBuildHandoffs(t *testing.T) {
	st := build(clusterSnapshot(), t0, false, &rateSampler{})
	want := []Handoff{
		{Shard: 1, From: "a", To: "b", Phase: "warming"},
		{Shard: 2, From: "b", To: "c"},
		{Shard: 3, To: "c"},
		{Shard: 20, To: "c"},
	}
	if !slices.Equal(st.Handoffs, want) {
		t.Errorf("Handoffs = %+v, want %+v", st.Handoffs, want)
	}
}

// TestBuildSelf: the runner's own lease is shown with its deadline lag
// (hidden for a client-only runner), and its counters are the sums of its
// kinds', with rates from the second request a second or more later.
func TestBuildSelf(t *testing.T) {
	s := clusterSnapshot()
	s.Kinds = []KindCount{{Name: "x", Active: 2, Handled: 10, Rejected: 1}, {Name: "y", Handled: 5}}
	var rates rateSampler
	st := build(s, t0, false, &rates)
	self := st.Self
	if self.Lease != "2a" || self.LeaseTTLMS != 10000 || self.LeaseDeadlineLagMS == nil || *self.LeaseDeadlineLagMS != 7000 ||
		self.DetachMarginMS != 2000 {
		t.Errorf("lease %q ttl %v lag %v margin %v; want 2a, 10000, 7000, 2000",
			self.Lease, self.LeaseTTLMS, self.LeaseDeadlineLagMS, self.DetachMarginMS)
	}
	if self.Messages != 15 || self.MailboxRejections != 1 || self.MessagesPerSec != nil {
		t.Errorf("messages %d, rejections %d, rate %v; want 15, 1, none yet", self.Messages, self.MailboxRejections, self.MessagesPerSec)
	}
	if len(st.Kinds) != 2 || st.Kinds[0] != (Kind{Kind: "x", Active: 2, Messages: 10, MailboxRejections: 1}) {
		t.Errorf("Kinds = %+v", st.Kinds)
	}

	s.Kinds = []KindCount{{Name: "x", Handled: 30}, {Name: "y", Handled: 5}}
	st = build(s, t0.Add(2*time.Second), false, &rates)
	if r := st.Self.MessagesPerSec; r == nil || *r != 10 {
		t.Errorf("total rate %v, want 10/s", r)
	}
	if r := st.Kinds[0].MessagesPerSec; r == nil || *r != 10 {
		t.Errorf("rate of x %v, want 10/s", r)
	}
	if r := st.Kinds[1].MessagesPerSec; r == nil || *r != 0 {
		t.Errorf("rate of y %v, want 0/s", r)
	}

	s.ClientOnly = true
	if self := build(s, t0, false, &rateSampler{}).Self; self.Lease != "" || self.LeaseTTLMS != 0 || self.LeaseDeadlineLagMS != nil {
		t.Errorf("client-only: lease %q ttl %v lag %v, want none", self.Lease, self.LeaseTTLMS, self.LeaseDeadlineLagMS)
	}
}

// TestBuildEvents: the state carries at most MaxEvents events, in the
// source's order.
func TestBuildEvents(t *testing.T) {
	s := clusterSnapshot()
	for i := range MaxEvents + 50 {
		s.Events = append(s.Events, Event{Time: t0.Add(-time.Duration(i) * time.Second), Type: fmt.Sprint(i)})
	}
	evs := build(s, t0, false, &rateSampler{}).Events
	if len(evs) != MaxEvents || evs[0].Type != "0" || evs[MaxEvents-1].Type != fmt.Sprint(MaxEvents-1) {
		t.Errorf("%d events from %v to %v, want the first %d", len(evs), evs[0], evs[len(evs)-1], MaxEvents)
	}
}

// TestBuildEmptyJSON: a runner that knows nothing yet serves empty lists,
// never null, and every shard unowned.
func TestBuildEmptyJSON(t *testing.T) {
	b, err := json.Marshal(build(Snapshot{ID: "idle", NumShards: 2, Phase: "new"}, t0, false, &rateSampler{}))
	if err != nil {
		t.Fatal(err)
	}
	js := string(b)
	for _, want := range []string{`"schema":"shardhost.debug/v1"`, `"runners":[]`, `"handoffs":[]`, `"kinds":[]`, `"events":[]`,
		`"moves":[]`, `"owner":[-1,-1]`, `"unowned":2`} {
		if !strings.Contains(js, want) {
			t.Errorf("JSON lacks %s: %s", want, js)
		}
	}
	if strings.Contains(js, "null") || strings.Contains(js, `"lease"`) {
		t.Errorf("JSON has null or a lease: %s", js)
	}
}
