package runner

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/sparse"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// What this runner knows about each shard it owns, acquires, takes over,
// releases or once hosted lives in one record per shard (shardState), in
// a slice indexed by shard (shardTable, like control.LockView for the
// locks), guarded by Runner.mu. Every write to a record is one of the
// transitions in this file; everything else reads. (The acquisition's own
// counters — its last try, attempts, exhaustion — are updated in place by
// the round and acquire.)
//
// A record's parts, and who sets and ends them:
//
//   - own: the shard is owned (hosted) here at own.epoch. Set by an
//     install (an acquire or rewrite that got the lock, a lock of ours in
//     the watch, the end of a takeover); ended by disown (a release, a
//     handoff, a lost lock, a detach, a stop).
//   - releasing: this runner is releasing, cutting over or deleting its
//     lock at that epoch; the control loop leaves the shard alone
//     meanwhile. Set with a release, a cutover, a Shutdown or an orphan
//     delete; cleared when the call ended (by epoch: a newer mark stays)
//     or by a detach or stop, or by an install at a newer epoch (the call
//     is fenced by its epoch: it cannot touch the newer lock).
//   - pending: the shard is assigned here and not owned: acquired or
//     taken over. Started and dropped by the round (control.Decide),
//     ended by an install, dropped by a detach.
//   - inbound: a takeover by handoff runs (none ended). Started by the
//     round, ended by an install (cutover, or the old owner died), an
//     abort (round, runInbound, Shutdown) or a detach.
//   - lastHost: the last host here of a shard no longer owned, whose
//     handlers may still run (stragglers); the next install waits for
//     them (hosting.ShardSpec.Prev).
//   - lastReleased: the epoch at which the shard last left by a release
//     or a handoff: a late watch PUT at or below it is history, not an
//     ownership.
//   - movedTo: the runner the shard was just handed off to, routed
//     to until the watch shows the move.
//   - takeoverHold: no new takeover before then (one was aborted).
//   - record: our handoff record of the shard (a takeover's, or one left
//     behind by one), handoffs/{from}/{shard} at a revision: set when a
//     write of it succeeded, ended when it is deleted (by us, or by its
//     old owner's transfer or release: a notice says so) or by a detach.
//   - deletingRecord: our handoff record at that revision is being
//     deleted, so it is deleted once.
//
// Invariants (shardState.check; asserted after every transition while the
// package's tests run):
//
//   - An owned shard has no takeover, no acquisition, no last host and
//     no moved-to: the install ends the first two, takes the last host
//     over as Prev and forgets where the shard last moved; a handoff sets
//     moved-to in the step that disowns.
//   - An owned shard is released at its own epoch only: releasing, when
//     set on an owned shard, equals own.epoch.
//   - A takeover runs only for a shard being acquired: inbound implies
//     pending (the round drops both together when the shard is assigned
//     elsewhere).
//   - The table's owned count is the number of owned records, and it
//     keeps no empty record (a shard it knows nothing about costs a nil
//     pointer).
//   - After a detach nothing of the attachment remains: no shard is owned,
//     pending, taken over, released or moved-to (afterDetach says what
//     survives, and why).

// shard is one owned shard. Its context is cancelled, with the cause, when
// ownership ends; everything hosted in the shard hangs off it.
type shard struct {
	id     sharding.ShardID
	epoch  storage.Epoch
	ctx    context.Context
	cancel context.CancelCauseFunc
	host   *hosting.Shard
	// unassignedSince: when the shard was first seen assigned elsewhere
	// (zero while assigned here); bounds the wait for a handoff.
	unassignedSince time.Time
	// cutoverRetryAt: no cutover before (a drain timed out on a handler).
	cutoverRetryAt time.Time
	// releasing plainly (release): its reminders are kept, stopped, for
	// the progress written once its handlers returned.
	plainRelease bool
}

// pending tracks an assigned shard this runner does not own yet.
type pending struct {
	since     time.Time // start of the current retry window
	last      time.Time // last attempt
	attempts  int       // attempts in the window
	exhausted bool      // window ran out; wait for a DELETE or a resync
	checked   time.Time // last re-read of the lock of its running takeover (no full lock view)
	// goneAt: the revision of the latest release of its lock told by a
	// notice (the deletion's own revision): a holder read before it — an
	// acquire's HeldElsewhere whose reply came after the notice — is
	// history, not a lock to wait for (no full lock view).
	goneAt storage.Epoch
}

// shardState is what this runner knows about one shard (see above).
type shardState struct {
	own            *shard           // owned here (nil: not)
	pending        *pending         // being acquired or taken over (nil: not)
	inbound        *handoff.Inbound // the takeover running here (nil: none)
	lastHost       *hosting.Shard   // last host here while not owned (nil: none)
	releasing      storage.Epoch    // our lock at this epoch is being released (0: not; epochs are > 0)
	lastReleased   storage.Epoch    // last left by release or handoff at this epoch (0: never)
	movedTo        string           // just handed off to this runner ID ("": not)
	takeoverHold   time.Time        // no new takeover before (zero: none)
	record         *ownRecord       // our handoff record of the shard (nil: none known)
	deletingRecord storage.Revision // our handoff record at this revision is being deleted (0: none)
}

// ownRecord is a handoff record this runner wrote: handoffs/{from}/{shard}
// at rev, in phase.
type ownRecord struct {
	from  string
	rev   storage.Revision
	phase storage.HandoffPhase
}

// busy reports whether this runner owns, acquires, takes over or
// releases the shard.
func (x *shardState) busy() bool {
	return x.own != nil || x.pending != nil || x.inbound != nil || x.releasing != 0
}

// afterDetach returns what of record x survives a detach, and why:
//
//   - own and releasing do not: the detach dropped every shard (cause
//     ErrDetached) and cancelled the attachment's release and delete
//     calls; locks left under the lease are rewritten or deleted after the
//     re-attachment.
//   - pending and inbound do not: acquisitions and takeovers belong to the
//     attachment (its context ended them; handoffs never block a detach);
//     the re-attachment decides every shard again.
//   - movedTo does not: it only bridged the watch's lag after a handoff;
//     routing follows the lock view from now on.
//   - lastHost does: the dropped shards' handlers may outlive the detach,
//     and a host installed after the re-attachment must wait for them.
//   - lastReleased does: a watch event of an old ownership may arrive
//     after the re-attachment.
//   - takeoverHold does: an aborted takeover's pause is a bound in time
//     that holds whatever the attachment.
//   - record and deletingRecord do not: the detach cancelled the delete,
//     perhaps before it reached the store, and a record of a lease that
//     survived is still there at the same revision; the re-attachment
//     lists the keys of its lease and deletes it again (deleting a deleted
//     record changes nothing).
func (x shardState) afterDetach() shardState {
	return shardState{
		lastHost: x.lastHost, lastReleased: x.lastReleased,
		takeoverHold: x.takeoverHold,
	}
}

// check returns an error naming the first invariant record x of shard id
// breaks (nil: none).
func (x *shardState) check(id sharding.ShardID) error {
	switch {
	case x.own != nil && x.own.id != id:
		return fmt.Errorf("shard %d: owned record of shard %d", id, x.own.id)
	case x.own != nil && x.inbound != nil:
		return fmt.Errorf("shard %d: owned and taken over", id)
	case x.own != nil && x.pending != nil:
		return fmt.Errorf("shard %d: owned and pending", id)
	case x.own != nil && x.lastHost != nil:
		return fmt.Errorf("shard %d: owned with a last host", id)
	case x.own != nil && x.movedTo != "":
		return fmt.Errorf("shard %d: owned and moved to %q", id, x.movedTo)
	case x.own != nil && x.releasing != 0 && x.releasing != x.own.epoch:
		return fmt.Errorf("shard %d: owned at epoch %d, releasing epoch %d", id, x.own.epoch, x.releasing)
	case x.inbound != nil && x.pending == nil:
		return fmt.Errorf("shard %d: taken over, not pending", id)
	}
	return nil
}

// checkInvariants makes the state machines check their invariants at
// every transition — a shard record's (below), the lifecycle's
// (toLocked) — and panic on a breach (the package's tests set it).
var checkInvariants = false

// shardTable is the records of every shard, indexed by shard. A record is
// allocated by the first transition that sets something in it and freed
// when a transition leaves it empty: a runner of NumShards (up to
// 65 536, and up to 100 runners in one bench/churn process) knows
// something about few of them — what it owns, moves and once hosted — and
// the table allocates its entries by chunk as they are set.
type shardTable struct {
	s     *sparse.Table[*shardState] // nil: nothing known (the zero record)
	owned int                        // records with own set
}

func newShardTable(n int) shardTable { return shardTable{s: sparse.New[*shardState](n)} }

// get returns shard id's record, nil when there is none.
func (t *shardTable) get(id sharding.ShardID) *shardState {
	if p := t.s.Peek(int(id)); p != nil {
		return *p
	}
	return nil
}

// noShard is the record of every shard with none, for reading only.
var noShard shardState

// at returns shard id's record, to read (never to write: it may be
// noShard).
func (t *shardTable) at(id sharding.ShardID) *shardState {
	if x := t.get(id); x != nil {
		return x
	}
	return &noShard
}

// rec returns shard id's record to change, allocating it.
func (t *shardTable) rec(id sharding.ShardID) *shardState {
	p := t.s.At(int(id))
	if *p == nil {
		*p = new(shardState)
	}
	return *p
}

// done ends a transition of shard id: an empty record is freed, and the
// invariants are checked (tests).
func (t *shardTable) done(id sharding.ShardID) {
	x := t.get(id)
	if x == nil {
		return
	}
	if *x == (shardState{}) {
		*t.s.At(int(id)) = nil
		return
	}
	if checkInvariants {
		if err := x.check(id); err != nil {
			panic("runner: shard state: " + err.Error())
		}
	}
}

// owner returns the owned shard id (nil: not owned).
func (t *shardTable) owner(id sharding.ShardID) *shard { return t.at(id).own }

// leaving reports whether our lock of shard id is being released.
func (t *shardTable) leaving(id sharding.ShardID) bool { return t.at(id).releasing != 0 }

// busy reports whether this runner owns, acquires, takes over or
// releases shard id.
func (t *shardTable) busy(id sharding.ShardID) bool { return t.at(id).busy() }

// known yields the shards with a record, in shard order. A transition of
// the yielded shard may run meanwhile.
func (t *shardTable) known() iter.Seq2[sharding.ShardID, *shardState] {
	return func(yield func(sharding.ShardID, *shardState) bool) {
		for i, p := range t.s.Allocated() {
			if x := *p; x != nil && !yield(sharding.ShardID(i), x) {
				return
			}
		}
	}
}

// ownedShards yields the owned shards in shard order. A transition of the
// yielded shard may run meanwhile.
func (t *shardTable) ownedShards() iter.Seq[*shard] {
	return func(yield func(*shard) bool) {
		if t.owned == 0 {
			return
		}
		for _, p := range t.s.Allocated() {
			if x := *p; x != nil && x.own != nil && !yield(x.own) {
				return
			}
		}
	}
}

// counts returns how many shards are owned, pending, released and taken
// over (O(shards): for the debug page).
func (t *shardTable) counts() (owned, pending, releasing, inbound int) {
	for _, x := range t.known() {
		if x.pending != nil {
			pending++
		}
		if x.releasing != 0 {
			releasing++
		}
		if x.inbound != nil {
			inbound++
		}
	}
	return t.owned, pending, releasing, inbound
}

// check returns the first broken invariant of the whole table (nil: none).
func (t *shardTable) check() error {
	n := 0
	for id, x := range t.known() {
		if *x == (shardState{}) {
			return fmt.Errorf("shard %d: empty record kept", id)
		}
		if err := x.check(id); err != nil {
			return err
		}
		if x.own != nil {
			n++
		}
	}
	if n != t.owned {
		return fmt.Errorf("owned count %d, %d owned records", t.owned, n)
	}
	return nil
}

// The transitions of the records. Each is the only writer of what it
// changes.

// install records s as owned: its acquisition and any moved-to end; its
// last host is forgotten (the new host took it as Prev). A releasing mark
// of an older lock of ours ends too: that call (a release, a transfer, an
// orphan delete) is fenced by its epoch and cannot touch the lock at
// s.epoch — as when a takeover's re-check rewrites a transferred lock
// while the round deletes it as an orphan.
func (t *shardTable) install(s *shard) {
	x := t.rec(s.id)
	x.own, x.pending, x.lastHost, x.movedTo = s, nil, nil, ""
	if x.releasing != 0 && x.releasing < s.epoch {
		x.releasing = 0
	}
	t.owned++
	t.done(s.id)
}

// disown records that s is no longer owned; its host stays as the
// shard's last host (its stragglers).
func (t *shardTable) disown(s *shard) {
	x := t.rec(s.id)
	x.own, x.lastHost = nil, s.host
	t.owned--
	t.done(s.id)
}

// handedOff records that owned shard s moved to runner to: routed there
// until the watch shows it; s leaves at its epoch. disown follows in the
// same step.
func (t *shardTable) handedOff(s *shard, to string) {
	x := t.rec(s.id)
	x.lastReleased, x.movedTo = s.epoch, to
}

// released records that shard id left this runner at epoch by a release.
func (t *shardTable) released(id sharding.ShardID, epoch storage.Epoch) {
	t.rec(id).lastReleased = epoch
	t.done(id)
}

// moveSeen forgets where shard id was handed off to: the watch shows its
// lock elsewhere.
func (t *shardTable) moveSeen(id sharding.ShardID) {
	if x := t.get(id); x != nil && x.movedTo != "" {
		x.movedTo = ""
		t.done(id)
	}
}

// markReleasing records that our lock of shard id at epoch is being
// released, cut over or deleted.
func (t *shardTable) markReleasing(id sharding.ShardID, epoch storage.Epoch) {
	t.rec(id).releasing = epoch
	t.done(id)
}

// clearReleasing ends the releasing mark of shard id at epoch (a newer
// mark stays).
func (t *shardTable) clearReleasing(id sharding.ShardID, epoch storage.Epoch) {
	if x := t.get(id); x != nil && x.releasing == epoch {
		x.releasing = 0
		t.done(id)
	}
}

// clearAllReleasing ends every releasing mark (every shard was dropped).
func (t *shardTable) clearAllReleasing() {
	for id, x := range t.known() {
		if x.releasing != 0 {
			x.releasing = 0
			t.done(id)
		}
	}
}

// startPending starts acquiring shard id: a new retry window from now.
func (t *shardTable) startPending(id sharding.ShardID, now time.Time) {
	t.rec(id).pending = &pending{since: now}
	t.done(id)
}

// newWindow gives the acquisition of shard id, if any, a fresh retry
// window from now.
func (t *shardTable) newWindow(id sharding.ShardID, now time.Time) {
	if p := t.at(id).pending; p != nil {
		*p = pending{since: now}
	}
}

// dropPending stops acquiring shard id (no longer assigned here). The
// round's step ends a running takeover too (applyLocked checks after it).
func (t *shardTable) dropPending(id sharding.ShardID) {
	if x := t.get(id); x != nil {
		x.pending = nil
	}
}

// startInbound records the takeover in of shard id; it ends any hold on
// takeovers.
func (t *shardTable) startInbound(id sharding.ShardID, in *handoff.Inbound) {
	x := t.rec(id)
	x.inbound, x.takeoverHold = in, time.Time{}
	t.done(id)
}

// endInbound ends the takeover of shard id, if one runs, and returns it.
// The caller's step ends with done (or with an install).
func (t *shardTable) endInbound(id sharding.ShardID) *handoff.Inbound {
	x := t.get(id)
	if x == nil {
		return nil
	}
	in := x.inbound
	x.inbound = nil
	return in
}

// holdTakeovers holds back new takeovers of shard id until then (one was
// aborted).
func (t *shardTable) holdTakeovers(id sharding.ShardID, until time.Time) {
	t.rec(id).takeoverHold = until
	t.done(id)
}

// deletingRecord records that our handoff record of shard id at revision
// rev is being deleted.
func (t *shardTable) deletingRecord(id sharding.ShardID, rev storage.Revision) {
	t.rec(id).deletingRecord = rev
	t.done(id)
}

// recordWritten records our handoff record of shard id, written at rev
// under the prefix of from in phase.
func (t *shardTable) recordWritten(id sharding.ShardID, from string, rev storage.Revision, phase storage.HandoffPhase) {
	t.rec(id).record = &ownRecord{from: from, rev: rev, phase: phase}
	t.done(id)
}

// recordGone forgets our handoff record of shard id if it is at most at
// rev (deleted at rev, or by a change at rev): a newer one stays.
func (t *shardTable) recordGone(id sharding.ShardID, rev storage.Revision) {
	if x := t.get(id); x != nil && x.record != nil && x.record.rev <= rev {
		x.record = nil
		if x.deletingRecord <= rev {
			x.deletingRecord = 0
		}
		t.done(id)
	}
}

// recordNotDeleted forgets that shard id's record is being deleted (the
// delete failed: the round may delete it again).
func (t *shardTable) recordNotDeleted(id sharding.ShardID) {
	if x := t.get(id); x != nil {
		x.deletingRecord = 0
		t.done(id)
	}
}

// detach takes every record through a detach (afterDetach). The caller
// dropped the owned shards and ended the takeovers first.
func (t *shardTable) detach() {
	if checkInvariants && t.owned != 0 {
		panic(fmt.Sprintf("runner: shard state: detached with %d shards owned", t.owned))
	}
	for id, x := range t.known() {
		if checkInvariants && (x.own != nil || x.inbound != nil) {
			panic(fmt.Sprintf("runner: shard state: shard %d detached while owned or taken over", id))
		}
		*x = x.afterDetach()
		t.done(id)
	}
}

// ownRecords returns our handoff records of shards ids (those we
// know of), to delete.
func (t *shardTable) ownRecords(ids []sharding.ShardID) []storage.HandoffRef {
	refs := make([]storage.HandoffRef, 0, len(ids))
	for _, id := range ids {
		if rec := t.at(id).record; rec != nil {
			refs = append(refs, storage.HandoffRef{Shard: id, From: rec.from})
		}
	}
	return refs
}
