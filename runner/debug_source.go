package runner

import (
	"fmt"
	"strings"

	"github.com/shardhost/shardhost/internal/debugpage"
	"github.com/shardhost/shardhost/sharding"
)

// debugSource is a runner as its debug page reads it.
type debugSource struct{ r *Runner }

var _ debugpage.Source = debugSource{}

// Snapshot copies the runner's state for one request of its debug page:
// its view of the cluster under r.mu (O(shards)), its lease keeper's and
// detachment machine's states, its kinds' counters and resident entities
// (O(entities)), and its latest events. It changes nothing.
func (s debugSource) Snapshot() debugpage.Snapshot {
	r := s.r
	v := r.view()
	health, det := r.health()
	snap := debugpage.Snapshot{
		ID: r.cfg.ID, Incarnation: r.incarnation, ClientOnly: r.cfg.ClientOnly, NumShards: r.cfg.NumShards,
		Strategy: r.cfg.Strategy.Name(), Weight: r.cfg.Weight, DetachMargin: r.cfg.DetachMargin,
		Address: v.address, Phase: v.phase.String(), Attached: v.phase == phaseAttached, Started: v.started,
		Lease: health.Lease, LeaseTTL: health.TTL, LeaseDeadline: health.Deadline, KeepAliveFailureStreak: health.FailureStreak,
		Owned: len(v.owned), Pending: v.pending, Releasing: v.releasing, InboundHandoffs: v.inbound,
		Members: v.members, Locks: v.locks, ByLease: v.byLease, Handoffs: v.handoffs, Assignment: v.assignment,
	}
	if v.phase == phaseDetached {
		snap.Detached = &debugpage.Detach{Reason: det.Reason.String(), Detail: det.Detail, Since: det.Since}
	}
	if v.assignErr != nil {
		snap.AssignmentError = v.assignErr.Error()
	}
	for _, k := range r.kindCounts() {
		snap.Kinds = append(snap.Kinds, debugpage.KindCount{Name: k.name, Active: k.active, Handled: k.handled, Rejected: k.rejected})
	}
	snap.Entities = r.EntityCount()
	for _, ev := range r.recentEvents(debugpage.MaxEvents) {
		snap.Events = append(snap.Events, debugEvent(ev))
	}
	return snap
}

// debugEvent is ev as the debug page lists it.
func debugEvent(ev Event) debugpage.Event {
	shard := func(id sharding.ShardID) *sharding.ShardID { return &id }
	out := debugpage.Event{Time: ev.Base().Time}
	switch e := ev.(type) {
	case ShardAcquired:
		out.Type, out.Shard, out.Epoch = "ShardAcquired", shard(e.Shard), e.Epoch
	case ShardReleased:
		out.Type, out.Shard, out.Epoch = "ShardReleased", shard(e.Shard), e.Epoch
	case ShardLost:
		out.Type, out.Shard, out.Epoch = "ShardLost", shard(e.Shard), e.Epoch
		if e.Cause != nil {
			out.Detail = e.Cause.Error()
		}
	case Registered:
		out.Type, out.Detail = "Registered", fmt.Sprintf("lease %x", e.Lease)
	case Detached:
		out.Type, out.Detail = "Detached", e.Reason.String()
		if e.Detail != "" {
			out.Detail += ": " + e.Detail
		}
	case Reattached:
		out.Type, out.Detail = "Reattached", fmt.Sprintf("lease %x", e.Lease)
		if e.NewLease {
			out.Detail += " (new lease)"
		}
	case HandoffPhase:
		out.Type, out.Shard = "HandoffPhase", shard(e.Shard)
		out.Detail = fmt.Sprintf("%s %s -> %s", e.Phase, e.From, e.To)
		if e.Detail != "" {
			out.Detail += ": " + e.Detail
		}
	default:
		out.Type = strings.TrimPrefix(fmt.Sprintf("%T", ev), "runner.")
	}
	return out
}
