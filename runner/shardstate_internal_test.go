package runner

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/reminders"
	"github.com/shardhost/shardhost/sharding"
)

// Every transition of the package's tests (the simulation included)
// checks the invariants of the record it changed (shardState.check), and
// of every reminder set (reminders.CheckInvariants).
func init() {
	checkInvariants = true
	reminders.CheckInvariants = true
}

func TestShardTransitionsKeepTheInvariants(t *testing.T) {
	tab := newShardTable(8)
	step := func(what string) {
		t.Helper()
		if err := tab.check(); err != nil {
			t.Fatalf("after %s: %v", what, err)
		}
	}
	const id = sharding.ShardID(3)
	now := time.Now()
	in := new(handoff.Inbound)

	tab.holdTakeovers(id, now.Add(time.Second))
	tab.startPending(id, now)
	tab.startInbound(id, in)
	step("a takeover started")
	if x := tab.at(id); !x.takeoverHold.IsZero() {
		t.Fatalf("a started takeover kept the hold until %v", x.takeoverHold)
	}
	if !tab.busy(id) || tab.busy(id+1) {
		t.Fatal("busy: want shard 3 only")
	}
	if got := tab.endInbound(id); got != in {
		t.Fatalf("endInbound = %p, want %p", got, in)
	}
	s := &shard{id: id, epoch: 7, host: new(hosting.Shard)}
	tab.install(s)
	step("install")
	if x := tab.at(id); x.pending != nil || tab.owned != 1 || tab.owner(id) != s {
		t.Fatalf("after install: pending %v, owned %d, owner %p; want none, 1, %p", x.pending, tab.owned, tab.owner(id), s)
	}

	tab.markReleasing(id, s.epoch)
	step("releasing")
	tab.handedOff(s, "b")
	tab.disown(s)
	step("handed off")
	x := tab.at(id)
	if x.own != nil || x.lastHost != s.host || x.movedTo != "b" || x.lastReleased != 7 || tab.owned != 0 {
		t.Fatalf("after a handoff: own %p, lastHost %p, movedTo %q, lastReleased %d, owned %d; want nil, %p, b, 7, 0",
			x.own, x.lastHost, x.movedTo, x.lastReleased, tab.owned, s.host)
	}
	tab.clearReleasing(id, 6)
	if !tab.leaving(id) {
		t.Fatal("clearing another epoch's mark ended the releasing mark")
	}
	tab.clearReleasing(id, 7)
	tab.moveSeen(id)
	step("move seen")
	if x.releasing != 0 || x.movedTo != "" {
		t.Fatalf("releasing %d, movedTo %q; want both cleared", x.releasing, x.movedTo)
	}

	s2 := &shard{id: id, epoch: 9, host: new(hosting.Shard)}
	tab.install(s2)
	step("install again")
	if x.lastHost != nil {
		t.Fatal("the last host outlived the install that took it as Prev")
	}
	for s := range tab.ownedShards() {
		if s != s2 {
			t.Fatalf("ownedShards yielded %p, want only %p", s, s2)
		}
	}
}

// A release of an older lock of ours (an orphan delete, a transfer) may
// still be in flight when the shard is installed at a newer epoch (a
// takeover's re-check rewrote the lock): the call is fenced by its epoch,
// so the install ends its mark, and the call's end changes nothing.
func TestInstallAtANewerEpochEndsAStaleReleasingMark(t *testing.T) {
	tab := newShardTable(8)
	const id = sharding.ShardID(6)
	tab.markReleasing(id, 442) // the round deletes our lock at 442 as an orphan
	s := &shard{id: id, epoch: 458, host: new(hosting.Shard)}
	tab.install(s) // the re-check rewrote it to 458 and installs it
	if err := tab.check(); err != nil {
		t.Fatalf("after the install: %v", err)
	}
	if tab.leaving(id) {
		t.Fatal("the shard is still leaving after its install at a newer epoch")
	}
	tab.clearReleasing(id, 442) // the delete's end (it deleted nothing)
	if tab.owner(id) != s || tab.leaving(id) {
		t.Fatalf("after the stale delete ended: owner %p, leaving %v; want %p, false", tab.owner(id), tab.leaving(id), s)
	}
	tab.markReleasing(id, 458) // a release at its own epoch is one
	if !tab.leaving(id) {
		t.Fatal("a release at the owned epoch does not mark the shard leaving")
	}
}

func TestShardStateCheckNamesEachBrokenInvariant(t *testing.T) {
	s := &shard{id: 1, epoch: 5}
	for _, tc := range []struct {
		name string
		x    shardState
	}{
		{"another shard's record", shardState{own: &shard{id: 2}}},
		{"owned and taken over", shardState{own: s, pending: &pending{}, inbound: new(handoff.Inbound)}},
		{"owned and pending", shardState{own: s, pending: &pending{}}},
		{"owned with a last host", shardState{own: s, lastHost: new(hosting.Shard)}},
		{"owned and moved", shardState{own: s, movedTo: "b"}},
		{"owned, releasing another epoch", shardState{own: s, releasing: 4}},
		{"taken over, not pending", shardState{inbound: new(handoff.Inbound)}},
	} {
		if err := tc.x.check(1); err == nil {
			t.Errorf("check(%s) = nil, want an error", tc.name)
		}
	}
	for _, ok := range []shardState{
		{},
		{own: s, releasing: 5, lastReleased: 3},
		{pending: &pending{}, inbound: new(handoff.Inbound), releasing: 2},
		{lastHost: new(hosting.Shard), movedTo: "b"},
	} {
		if err := ok.check(1); err != nil {
			t.Errorf("check(%+v) = %v, want nil", ok, err)
		}
	}
}

func TestDetachKeepsOnlyWhatOutlivesTheAttachment(t *testing.T) {
	tab := newShardTable(4)
	host, until := new(hosting.Shard), time.Now().Add(time.Minute)
	*tab.s.At(0) = &shardState{pending: &pending{}, releasing: 3, lastHost: host, lastReleased: 2,
		movedTo: "b", takeoverHold: until, deletingRecord: 11}
	*tab.s.At(1) = &shardState{pending: &pending{}, movedTo: "c"}
	*tab.s.At(2) = &shardState{releasing: 8}
	tab.detach()
	want := shardState{lastHost: host, lastReleased: 2, takeoverHold: until}
	if x := tab.get(sharding.ShardID(0)); x == nil || *x != want {
		t.Errorf("shard 0 after a detach: %+v; want %+v (the last host, lastReleased and the takeover hold)", x, want)
	}
	for id := 1; id < 4; id++ {
		if x := tab.get(sharding.ShardID(id)); x != nil {
			t.Errorf("shard %d after a detach: %+v, want no record", id, *x)
		}
	}
	if err := tab.check(); err != nil {
		t.Error(err)
	}
}

// Every runner holds a table of NumShards (65 536 at most, up to 100
// runners in one bench/churn process): a shard this runner knows nothing
// about costs at most one nil pointer, and a record that becomes empty is
// freed.
func TestShardRecordsExistOnlyWhileTheyHoldSomething(t *testing.T) {
	tab := newShardTable(4)
	now := time.Now()
	tab.startPending(1, now)
	tab.dropPending(1)
	tab.done(1)
	tab.markReleasing(2, 5)
	tab.clearReleasing(2, 5)
	tab.holdTakeovers(3, now)
	tab.holdTakeovers(3, time.Time{})
	for id, x := range tab.known() {
		if x != nil {
			t.Errorf("shard %d: record %+v kept, want none", id, *x)
		}
	}
	if tab.at(0).busy() || tab.owner(0) != nil || tab.at(0) != &noShard {
		t.Error("a shard never touched reads as something")
	}
	s := &shard{id: 1, epoch: 4, host: new(hosting.Shard)}
	tab.install(s)
	tab.disown(s)
	if x := tab.get(sharding.ShardID(1)); x == nil || x.lastHost != s.host {
		t.Error("the record of a shard that left lost its last host")
	}
	if allocs := testing.AllocsPerRun(100, func() { _ = tab.at(2).movedTo; _ = tab.busy(3) }); allocs != 0 {
		t.Errorf("reading an unknown shard allocates %v times", allocs)
	}
}
