package control

import (
	"reflect"
	"testing"
	"time"

	"github.com/shardhost/shardhost/storage"
)

const (
	ours   storage.LeaseID = 10
	theirs storage.LeaseID = 20
)

func round() Round {
	return Round{Now: t0, Self: "me", Lease: ours, Interval: time.Second, Registered: true}
}

// TestDecideAcquiresAFreeAssignedShardAtMostOncePerInterval: a shard
// assigned here is acquired when its lock is free, ours, or under a lease
// no live member has; again only once the retry interval has passed since
// the last attempt, and not at all after the retry window ran out or
// while a release of it is under way.
func TestDecideAcquiresAFreeAssignedShardAtMostOncePerInterval(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Shard
		want Decision
	}{
		{"free, first look", Shard{Want: true},
			Decision{Pending: PendingStarted, Acquire: true, Tried: true}},
		{"held by a dead lease", Shard{Want: true, Held: true, Lease: theirs},
			Decision{Pending: PendingStarted, Acquire: true, Tried: true}},
		{"held under our own lease", Shard{Want: true, Held: true, Lease: ours, Holder: "me"},
			Decision{Pending: PendingStarted, Acquire: true, Tried: true}},
		{"under our lease, named another's (a view out of step)", Shard{Want: true, Held: true, Lease: ours, Holder: "other"},
			Decision{Pending: PendingStarted, Acquire: true, Tried: true}},
		{"held by another incarnation of ours", Shard{Want: true, Held: true, Lease: theirs, Holder: "me"},
			Decision{Pending: PendingStarted, Acquire: true, Tried: true}},
		{"tried 400ms ago", Shard{Want: true, Pending: true, LastTry: t0.Add(-400 * time.Millisecond)},
			Decision{RetryAt: t0.Add(600 * time.Millisecond)}},
		{"tried an interval ago", Shard{Want: true, Pending: true, LastTry: t0.Add(-time.Second)},
			Decision{Acquire: true, Tried: true}},
		{"window exhausted", Shard{Want: true, Pending: true, Exhausted: true},
			Decision{}},
		{"pending, never tried", Shard{Want: true, Pending: true},
			Decision{Acquire: true, Tried: true}},
		{"being released, not pending", Shard{Want: true, Leaving: true},
			Decision{}},
		{"being released, pending", Shard{Want: true, Leaving: true, Pending: true},
			Decision{}},
		{"a new window ignores stale state", Shard{Want: true, Exhausted: true, LastTry: t0},
			Decision{Pending: PendingStarted, Acquire: true, Tried: true}},
		{"owned", Shard{Want: true, Owned: true, Held: true, Lease: ours},
			Decision{Owned: Keep}},
		{"not assigned here", Shard{Pending: true, LastTry: t0.Add(-time.Hour)},
			Decision{Pending: PendingDropped}},
		{"owned, assigned elsewhere, still pending", Shard{Owned: true, Pending: true, Held: true, Lease: ours},
			Decision{Pending: PendingDropped, Owned: HandOff}},
		{"owned, a takeover's record", Shard{Want: true, Owned: true, Inbound: true, OurRecord: true, Held: true, Lease: ours},
			Decision{Owned: Keep}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := round()
			if got := decide(&r, &tc.s); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decide = %+v\nwant     %+v", got, tc.want)
			}
		})
	}
}

// TestDecideTakesOverFromALiveOwnerByHandoffOnly: a shard another live
// runner holds is never acquired: it is taken over by handoff, one
// takeover at a time; a takeover whose lock changed hands or was
// rewritten is aborted and started over; after an abort the next one
// waits; with handoffs disabled none starts. Every look counts as a try.
func TestDecideTakesOverFromALiveOwnerByHandoffOnly(t *testing.T) {
	held := Shard{Want: true, Held: true, Lease: theirs, Holder: "other"}
	for _, tc := range []struct {
		name string
		r    func(*Round)
		s    Shard
		want Decision
	}{
		{"first look", nil, held,
			Decision{Pending: PendingStarted, TakeOver: true, Tried: true}},
		{"a takeover runs", nil, with(held, func(s *Shard) { s.Pending, s.Inbound = true, true }),
			Decision{Tried: true}},
		{"the running takeover is stale", nil, with(held, func(s *Shard) { s.Pending, s.Inbound, s.Stale = true, true, "rewritten" }),
			Decision{Abort: "rewritten", TakeOver: true, Tried: true}},
		{"held back after an abort", nil, with(held, func(s *Shard) { s.Pending, s.NoTakeoverBefore = true, t0.Add(time.Second) }),
			Decision{RetryAt: t0.Add(time.Second), Tried: true}},
		{"the hold-back ended", nil, with(held, func(s *Shard) { s.Pending, s.NoTakeoverBefore = true, t0 }),
			Decision{TakeOver: true, Tried: true}},
		{"stale, then held back", nil, with(held, func(s *Shard) {
			s.Pending, s.Inbound, s.Stale, s.NoTakeoverBefore = true, true, "moved", t0.Add(time.Second)
		}), Decision{Abort: "moved", RetryAt: t0.Add(time.Second), Tried: true}},
		{"handoff disabled", func(r *Round) { r.NoHandoff = true }, with(held, func(s *Shard) { s.Pending = true }),
			Decision{Tried: true}},
		{"handoff disabled, stale takeover", func(r *Round) { r.NoHandoff = true }, with(held, func(s *Shard) { s.Pending, s.Inbound, s.Stale = true, true, "x" }),
			Decision{Abort: "x", Tried: true}},
		{"being released: still taken over", nil, with(held, func(s *Shard) { s.Pending, s.Leaving = true, true }),
			Decision{TakeOver: true, Tried: true}},
		{"handoff disabled, stale takeover with our record", func(r *Round) { r.NoHandoff = true },
			with(held, func(s *Shard) { s.Pending, s.Inbound, s.Stale, s.OurRecord = true, true, "x", true }),
			Decision{Abort: "x", Tried: true, DeleteRecord: true}},
		{"exhausted window: still taken over", nil, with(held, func(s *Shard) { s.Pending, s.Exhausted = true, true }),
			Decision{TakeOver: true, Tried: true}},
		{"reassigned while taking over", nil, with(held, func(s *Shard) { s.Want, s.Pending, s.Inbound = false, true, true }),
			Decision{Pending: PendingDropped, Abort: "the shard was assigned elsewhere", AbortRecord: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := round()
			if tc.r != nil {
				tc.r(&r)
			}
			if got := decide(&r, &tc.s); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Decide = %+v\nwant     %+v", got, tc.want)
			}
		})
	}
}

// TestDecideShedsOwnedShardsOnlyOnACompleteView: an owned shard is kept
// while assigned here or while the view does not hold this incarnation;
// handed off when assigned elsewhere on a complete view, and always once
// superseded; nothing is decided for one already leaving.
func TestDecideShedsOwnedShardsOnlyOnACompleteView(t *testing.T) {
	owned := Shard{Owned: true, Held: true, Lease: ours, Holder: "me"}
	for _, tc := range []struct {
		name                   string
		registered, superseded bool
		want, leaving          bool
		decided                Owned
	}{
		{"assigned here", true, false, true, false, Keep},
		{"assigned elsewhere", true, false, false, false, HandOff},
		{"incomplete view, assigned elsewhere", false, false, false, false, Keep},
		{"superseded, assigned here", true, true, true, false, HandOff},
		{"superseded, incomplete view", false, true, false, false, HandOff},
		{"leaving", true, false, false, true, NotOwned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := round()
			r.Registered, r.Superseded = tc.registered, tc.superseded
			s := owned
			s.Want, s.Leaving = tc.want, tc.leaving
			d := decide(&r, &s)
			if d.Owned != tc.decided {
				t.Errorf("Owned = %d, want %d", d.Owned, tc.decided)
			}
			if d.Orphan || d.Acquire || d.TakeOver || d.Pending == PendingStarted {
				t.Errorf("an owned shard got %+v", d)
			}
		})
	}
}

// TestDecideDeletesOnlyOrphansAndDeadRecords: a lock under this runner's
// lease that it neither owns, releases nor wants (on a complete view, or
// superseded) is deleted, and a handoff record of its lease without a
// takeover behind it, once per revision; nothing else is.
func TestDecideDeletesOnlyOrphansAndDeadRecords(t *testing.T) {
	orphan := Shard{Held: true, Lease: ours, Holder: "me"}
	for _, tc := range []struct {
		name       string
		r          func(*Round)
		s          Shard
		orphan     bool
		deleteRec  bool
		takeover   bool
		abortedRec bool
	}{
		{"ours, unwanted", nil, orphan, true, false, false, false},
		{"ours, wanted", nil, with(orphan, func(s *Shard) { s.Want = true }), false, false, false, false},
		{"ours, being released", nil, with(orphan, func(s *Shard) { s.Leaving = true }), false, false, false, false},
		{"ours, owned", nil, with(orphan, func(s *Shard) { s.Owned = true }), false, false, false, false},
		{"ours, incomplete view", func(r *Round) { r.Registered = false }, orphan, false, false, false, false},
		{"ours, superseded and wanted", func(r *Round) { r.Superseded = true }, with(orphan, func(s *Shard) { s.Want = true }), true, false, false, false},
		{"theirs, unwanted", nil, Shard{Held: true, Lease: theirs, Holder: "other"}, false, false, false, false},
		{"record, no takeover", nil, Shard{OurRecord: true}, false, true, false, false},
		{"record being deleted", nil, Shard{OurRecord: true, RecordDeleting: true}, false, false, false, false},
		{"record of a running takeover", nil, Shard{Want: true, Pending: true, Inbound: true, OurRecord: true,
			Held: true, Lease: theirs, Holder: "other"}, false, false, false, false},
		{"record of a stale takeover started over", nil, Shard{Want: true, Pending: true, Inbound: true, Stale: "x", OurRecord: true,
			Held: true, Lease: theirs, Holder: "other"}, false, false, true, false},
		{"record of a stale takeover held back", nil, Shard{Want: true, Pending: true, Inbound: true, Stale: "x", OurRecord: true,
			NoTakeoverBefore: t0.Add(time.Second), Held: true, Lease: theirs, Holder: "other"}, false, true, false, false},
		{"record of a takeover of a reassigned shard", nil, Shard{Inbound: true, OurRecord: true}, false, true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := round()
			if tc.r != nil {
				tc.r(&r)
			}
			d := decide(&r, &tc.s)
			if d.Orphan != tc.orphan || d.DeleteRecord != tc.deleteRec || d.TakeOver != tc.takeover || d.AbortRecord != tc.abortedRec {
				t.Errorf("Decide = %+v; want Orphan %v, DeleteRecord %v, TakeOver %v, AbortRecord %v",
					d, tc.orphan, tc.deleteRec, tc.takeover, tc.abortedRec)
			}
		})
	}
}

func with(s Shard, f func(*Shard)) Shard { f(&s); return s }

func decide(r *Round, s *Shard) Decision {
	d := Decision{Acquire: true, Abort: "left from an earlier shard"} // Decide resets it
	Decide(r, s, &d)
	return d
}
