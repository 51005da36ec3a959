package control

import (
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Round is what every decision of one control round reads.
type Round struct {
	Now      time.Time
	Self     string          // this runner's ID
	Lease    storage.LeaseID // this attachment's lease
	Interval time.Duration   // at most one acquisition attempt per Interval (Config.AcquireRetryInterval)
	// Registered: the membership view holds this incarnation under its
	// lease. Superseded: another incarnation took this runner's ID.
	Registered, Superseded bool
	NoHandoff              bool // Config.DisableHandoff: never take a shard over by handoff
}

// Shard is what a round knows about one dirty shard, read under the
// runner's mutex.
type Shard struct {
	Want    bool // assigned here, on a view holding this incarnation, not draining
	Owned   bool // hosted here
	Leaving bool // a release, cutover or delete of its lock by this runner is under way

	// Pending: this runner is acquiring it. LastTry is the last attempt
	// or takeover start (zero: none yet); Exhausted: the retry window ran
	// out (a DELETE of the lock or a resync starts a new one). Both are
	// read only when Pending.
	Pending   bool
	LastTry   time.Time
	Exhausted bool

	// Held: its lock exists in the view, under Lease.
	Held  bool
	Lease storage.LeaseID
	// Inbound: a takeover of it runs here.
	Inbound bool

	// Read only for a wanted shard not owned whose lock is held under
	// another lease (the caller may leave them zero otherwise): Holder is
	// the ID of the live member whose lease holds the lock ("" when no
	// member has that lease); Stale (when non-empty) says why the running
	// takeover must start over: the lock it takes over changed hands or
	// was rewritten (handoff.Inbound.Restart); NoTakeoverBefore: an
	// aborted takeover holds the next one back until then.
	Holder           string
	Stale            string
	NoTakeoverBefore time.Time

	// OurRecord: a handoff record of this runner's lease exists for it;
	// RecordDeleting (read only with OurRecord): that very record (by
	// revision) is being deleted.
	OurRecord, RecordDeleting bool
}

// PendingChange says what becomes of a shard's acquisition state.
type PendingChange uint8

// The changes of the acquisition state.
const (
	PendingKept    PendingChange = iota // unchanged
	PendingStarted                      // a new retry window starts now
	PendingDropped                      // no longer assigned here: forget it
)

// Owned says what becomes of an owned shard.
type Owned uint8

// The decisions on an owned shard.
const (
	NotOwned Owned = iota // not owned, or already leaving: nothing to decide
	Keep                  // still assigned here (or the view is incomplete): kept, and any wait for a handoff forgotten
	HandOff               // assigned elsewhere: hand off or release (handoff.DecideOutbound decides which, and when)
)

// Decision is what a round does about one shard. The runner carries it
// out in the order of the fields: the acquisition state, an abort, the
// takeover or acquisition, the owned shard, the orphan, the record.
type Decision struct {
	Pending PendingChange
	Tried   bool // an acquisition or takeover starts: LastTry becomes Round.Now

	// Abort (when non-empty) ends the running takeover, with this reason;
	// AbortRecord: and its handoff record is deleted.
	Abort       string
	AbortRecord bool

	Acquire  bool // try to acquire the lock (batched with the round's others)
	TakeOver bool // take it over from Holder, at its lock's epoch, by handoff

	Owned Owned
	// Orphan: its lock is under this runner's lease but neither owned,
	// being released, nor wanted: delete it (and count it as leaving).
	Orphan bool
	// DeleteRecord: this runner's handoff record for it has no takeover
	// behind it (an abort whose delete failed, a late write): delete it,
	// once per revision.
	DeleteRecord bool

	RetryAt time.Time // decide the shard again then (zero: no timer)
}

// Decide decides one dirty shard: the one place where a work item becomes
// decisions. It is pure; see the package documentation for what each
// decision guarantees. It writes into d (reset first), so that a round
// over every shard copies nothing.
func Decide(r *Round, s *Shard, d *Decision) {
	*d = Decision{}
	d.pending(r, s)
	inbound := s.Inbound && d.Abort == "" || d.TakeOver
	if s.Inbound && !s.Want {
		d.Abort, d.AbortRecord = "the shard was assigned elsewhere", true
		inbound = false
	}
	switch {
	case !s.Owned || s.Leaving:
	case !r.Superseded && (!r.Registered || s.Want):
		d.Owned = Keep // an incomplete view must not shed every shard
	default:
		d.Owned = HandOff
	}
	d.Orphan = s.Held && s.Lease == r.Lease && !s.Owned && !s.Leaving &&
		(r.Superseded || r.Registered && !s.Want)
	d.DeleteRecord = s.OurRecord && !inbound && !s.RecordDeleting
}

// pending decides an assigned shard this runner does not own: acquired
// when free (or held by a lease no member has: a dead incarnation), at
// most once per Interval, until the retry window is exhausted; taken over
// by handoff when another live runner holds it.
func (d *Decision) pending(r *Round, s *Shard) {
	switch {
	case !s.Want:
		d.Pending = PendingDropped
		return
	case s.Owned:
		return
	case !s.Pending && s.Leaving:
		return // pending again once the release finished
	case !s.Pending:
		d.Pending = PendingStarted
	}
	if s.Held && s.Lease != r.Lease && s.Holder != "" && s.Holder != r.Self {
		d.takeover(r, s)
		d.Tried = true
		return
	}
	last, exhausted := s.LastTry, s.Exhausted
	if !s.Pending {
		last, exhausted = time.Time{}, false // a new window
	}
	if s.Leaving || exhausted {
		return // a DELETE of the lock (watch) or the resync tries again
	}
	if due := last.Add(r.Interval); r.Now.Before(due) { // a zero last is long past
		d.RetryAt = due
		return
	}
	d.Acquire, d.Tried = true, true
}

// takeover starts taking the shard over from its live holder, unless a
// takeover is already running (and still current) or one was aborted
// recently. A running takeover whose lock changed hands or was rewritten
// is aborted and starts over.
func (d *Decision) takeover(r *Round, s *Shard) {
	running := s.Inbound
	if running && s.Stale != "" {
		d.Abort, running = s.Stale, false
	}
	if r.NoHandoff || running {
		return
	}
	if r.Now.Before(s.NoTakeoverBefore) {
		d.RetryAt = s.NoTakeoverBefore
		return
	}
	d.TakeOver = true
}
