package runner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/shardhost/shardhost/runner/internal/debugpage"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// debugSource is a runner as its debug page reads it.
type debugSource struct{ r *Runner }

var _ debugpage.Source = debugSource{}

// Snapshot copies the runner's state for one request of its debug page:
// its view of the cluster under r.mu (O(shards): the lock view, without an
// allocation per shard), its lease keeper's and detachment machine's
// states, its kinds' counters and resident entities (O(entities)), and its
// latest events. It changes nothing.
func (s debugSource) Snapshot() debugpage.Snapshot {
	r := s.r
	health, _ := r.keeper.Health()
	snap := debugpage.Snapshot{
		ID: r.cfg.ID, Incarnation: r.incarnation, ClientOnly: r.cfg.ClientOnly, NumShards: r.cfg.NumShards,
		Strategy: r.cfg.Strategy.Name(), Weight: r.cfg.Weight, DetachMargin: r.cfg.DetachMargin,
		Lease: health.Lease, LeaseTTL: health.TTL, LeaseDeadline: health.Deadline, KeepAliveFailureStreak: health.FailureStreak,
	}
	snap.NotStarted, _ = r.st.notStarted()
	var ready HealthCheck
	if r.cfg.ClientOnly {
		ready = r.CheckReadiness()
	}
	detached := r.copyView(&snap)
	if g := snap.Gateway; g != nil {
		g.Ready, g.Reason = ready.OK, ready.Reason
	}
	if detached {
		det := r.wd.machine.State()
		snap.Detached = &debugpage.Detach{Reason: det.Reason.String(), Detail: det.Detail, Since: det.Since}
	}
	for _, k := range r.hosting.KindCounts() {
		snap.Kinds = append(snap.Kinds, debugpage.KindCount{Name: k.Name, Active: k.Active, Handled: k.Handled, Rejected: k.Rejected})
	}
	snap.Entities = r.hosting.EntityCount()
	for id := range r.cfg.NumShards {
		sh := r.hosting.Lookup(sharding.ShardID(id))
		if sh == nil {
			continue
		}
		for _, w := range sh.Workers() {
			snap.Workers = append(snap.Workers, debugpage.WorkerRun{Name: w.Name, Singleton: w.Singleton, Shard: sh.ID(), Epoch: sh.Epoch(), Since: w.Since})
		}
	}
	snap.Remembered = r.reminders.RememberedByShard()
	for _, ev := range r.hub.Recent(debugpage.MaxEvents) {
		snap.Events = append(snap.Events, debugEvent(ev))
	}
	return snap
}

// copyView copies the runner's own state and its view of the cluster into
// snap, under r.mu, and reports whether the runner is detached.
func (r *Runner) copyView(snap *debugpage.Snapshot) (detached bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	snap.Address, snap.Phase, snap.Attached, snap.Started = r.address, r.lifecycle.phase.String(), r.lifecycle.phase == phaseAttached, r.started
	snap.Owned, snap.Pending, snap.Releasing, snap.InboundHandoffs = r.shards.counts()
	snap.Members = slices.SortedFunc(maps.Values(r.view.members), func(a, b storage.Runner) int { return strings.Compare(a.ID, b.ID) })
	snap.Locks = make([]storage.Lock, 0, r.shards.owned*2)
	for _, l := range r.view.locks.All() {
		snap.Locks = append(snap.Locks, l)
	}
	if !r.view.full {
		// It knows the locks of its own shards only: the others are shown
		// with their assignee (or the runner it handed one to), at epoch
		// 0 — not with its owner hints, which only route and may be old
		// (a shard it has not sent to since it moved).
		for id := range r.cfg.NumShards {
			sid := sharding.ShardID(id)
			if _, known := r.view.locks.Get(sid); known {
				continue
			}
			to := r.shards.at(sid).movedTo
			if to == "" {
				to = r.view.assignment.Of(sid)
			}
			if to != "" {
				if m, ok := r.view.members[to]; ok {
					snap.Locks = append(snap.Locks, storage.Lock{Shard: sid, Owner: storage.Owner{RunnerID: to, Incarnation: m.Incarnation}, Lease: m.Lease})
				}
			}
		}
	}
	slices.SortFunc(snap.Locks, func(a, b storage.Lock) int { return int(a.Shard) - int(b.Shard) })
	if r.cfg.ClientOnly {
		snap.Gateway = r.view.gatewayView(r.cfg.NumShards)
		if r.lifecycle.phase == phaseStarting && closed(r.st.ready) {
			snap.Phase = "routing" // a gateway never attaches: past its start, it routes
		}
	}
	snap.ByLease = make(map[storage.LeaseID]string, len(r.view.byLease))
	for id, m := range r.view.byLease {
		snap.ByLease[id] = m.ID
	}
	// The records addressed to this runner (its shards' new owners'), and
	// its own (its takeovers').
	snap.Handoffs = slices.Collect(maps.Values(r.view.handoffs))
	for id, x := range r.shards.known() {
		if rec := x.record; rec != nil {
			snap.Handoffs = append(snap.Handoffs, storage.Handoff{
				Shard: id, HandoffRecord: storage.HandoffRecord{From: rec.from, To: r.cfg.ID, Phase: rec.phase, ToIncarnation: r.incarnation},
				Lease: r.att.lease, ModRevision: rec.rev,
			})
		}
	}
	slices.SortFunc(snap.Handoffs, func(a, b storage.Handoff) int { return int(a.Shard) - int(b.Shard) })
	snap.Assignment = r.view.assignment.Expand()
	if r.view.assignErr != nil {
		snap.AssignmentError = r.view.assignErr.Error()
	}
	return r.lifecycle.phase == phaseDetached
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
	case RemindersUnrecorded:
		out.Type, out.Shard, out.Epoch = "RemindersUnrecorded", shard(e.Shard), e.Epoch
		if e.Err != nil {
			out.Detail = e.Err.Error()
		}
	case WorkerStarted:
		out.Type, out.Shard, out.Epoch, out.Detail = "WorkerStarted", shard(e.Shard), e.Epoch, workerDetail(e.Name, e.Singleton, nil)
	case WorkerStopped:
		out.Type, out.Shard, out.Epoch, out.Detail = "WorkerStopped", shard(e.Shard), e.Epoch, workerDetail(e.Name, e.Singleton, e.Err)
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

func workerDetail(name string, singleton bool, err error) string {
	d := "worker " + name
	if singleton {
		d = "singleton " + name
	}
	if err != nil {
		d += ": " + err.Error()
	}
	return d
}
