package handoff

import (
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Outbound is what the old owner knows, in one control round, of an owned
// shard the assignment gives to another runner.
type Outbound struct {
	Self     string        // this runner's ID
	Epoch    storage.Epoch // the shard's epoch here
	Assignee string        // the runner the assignment gives the shard to ("": none)
	// NoHandoff: this runner does not hand shards off (Config.DisableHandoff)
	// or must give up everything at once (another process took its ID).
	NoHandoff bool
	// UnassignedSince: when the shard was first seen assigned elsewhere;
	// the wait for a handoff counts from it.
	UnassignedSince time.Time
	// CutoverRetryAt: no cutover before (a drain left handlers running).
	CutoverRetryAt time.Time
	Now            time.Time
	HandoffWait    time.Duration // Config.HandoffWait
}

// Seen is the shard's handoff record as the old owner sees it, with the
// live runner holding the record's lease.
type Seen struct {
	Record storage.Handoff
	Holder string // the ID of the live runner whose lease the record is under ("": none)
}

// Action is what the old owner does with a shard assigned elsewhere.
type Action uint8

const (
	// Wait: keep serving; decide again at Decision.Until at the latest (the
	// handoff watch marks the shard earlier when its record changes).
	Wait Action = iota
	// CutOver: the new owner is ready; cut over with Decision.Record.
	CutOver
	// Release: release the shard plainly (its handlers are interrupted).
	Release
)

// String returns "wait", "cutover" or "release".
func (a Action) String() string {
	return [...]string{"wait", "cutover", "release"}[a]
}

// Decision is the old owner's decision for a shard assigned elsewhere.
type Decision struct {
	Action Action
	// Until: for Wait, when to decide again (the end of HandoffWait, or an
	// earlier cutover retry time).
	Until time.Time
	// Record, HasRecord: the handoff record seen (zero and false when the
	// decision did not need it).
	Record    storage.Handoff
	HasRecord bool
	// TimedOut: Release because no usable ready record came within
	// HandoffWait (the runner logs it: the move interrupts handlers).
	TimedOut bool
}

// DecideOutbound decides, for an owned shard assigned elsewhere, whether
// to cut over now, release it plainly or keep serving:
//
//   - release plainly when handoffs are off (o.NoHandoff) or the shard is
//     assigned to nobody;
//   - cut over when the record is ready, written by the assignee (the live
//     holder of its lease) for a move from this runner at the shard's
//     epoch here, and no cutover retry time is pending;
//   - otherwise release plainly once HandoffWait has passed since the
//     shard was first seen unassigned (TimedOut), else wait until then or
//     until the pending cutover retry time, whichever comes first.
//
// seen returns the shard's handoff record and whether there is one; it is
// called only when a handoff is possible (the runner decodes a record
// lazily, and a corrupt one is logged).
func DecideOutbound(o Outbound, seen func() (Seen, bool)) Decision {
	if o.NoHandoff || o.Assignee == "" {
		return Decision{Action: Release}
	}
	s, has := seen()
	h := s.Record
	d := Decision{Record: h, HasRecord: has}
	valid := has && h.From == o.Self && h.FromEpoch == o.Epoch && s.Holder == o.Assignee && h.To == o.Assignee
	switch {
	case valid && h.Phase == storage.HandoffReady && !o.Now.Before(o.CutoverRetryAt):
		d.Action = CutOver
	case o.Now.Sub(o.UnassignedSince) >= o.HandoffWait:
		d.Action, d.TimedOut = Release, true
	default:
		d.Action, d.Until = Wait, o.UnassignedSince.Add(o.HandoffWait)
		if o.CutoverRetryAt.After(o.Now) && o.CutoverRetryAt.Before(d.Until) {
			d.Until = o.CutoverRetryAt
		}
	}
	return d
}

// CutoverRetryIn returns how long an old owner waits before it cuts over
// again after a cutover it called off because handlers still ran after a
// drain that took drained: as long as the drain took, at least probe
// (Config.ProbeInterval: a drain cut short by the detach instant, its
// handlers stalled in an etcd leader failover, is retried soon) and at
// most drainTimeout (a straggler that outlived DrainTimeout gets as long
// again).
func CutoverRetryIn(drained, probe, drainTimeout time.Duration) time.Duration {
	return min(max(drained, probe), drainTimeout)
}
