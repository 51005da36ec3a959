package runner

import (
	"slices"
	"strings"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/lease"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Read-only accessors for the debug handler. Each takes the lock it needs
// briefly and copies; none changes the runner's state.

// recentEvents returns up to n of the runner's latest events, newest first.
func (r *Runner) recentEvents(n int) []Event { return r.hub.Recent(n) }

// clusterView is a copy of what a runner knows about the cluster and
// about itself, taken under r.mu at one instant.
type clusterView struct {
	phase       phase
	lease       storage.LeaseID
	address     string
	started     time.Time
	stopping    bool
	drainMode   bool
	membersSeen bool
	members     []storage.Runner // by ID
	locks       []storage.Lock   // by shard
	byLease     map[storage.LeaseID]string
	handoffs    []storage.Handoff // by shard
	assignment  sharding.Assignment
	assignErr   error
	owned       map[sharding.ShardID]storage.Epoch
	pending     int
	releasing   int
	inbound     int
}

// view copies the runner's view of the cluster. It costs O(shards) under
// r.mu (a copy of the lock view, no allocation per shard).
func (r *Runner) view() clusterView {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := clusterView{
		phase: r.phase, lease: r.lease, address: r.address, started: r.started,
		stopping: r.stopping, drainMode: r.drainMode, membersSeen: r.membersSeen,
		members:    make([]storage.Runner, 0, len(r.members)),
		locks:      make([]storage.Lock, 0, len(r.owned)*2),
		byLease:    make(map[storage.LeaseID]string, len(r.byLease)),
		handoffs:   make([]storage.Handoff, 0, len(r.handoffs)),
		assignment: slices.Clone(r.assignment),
		assignErr:  r.assignErr,
		owned:      make(map[sharding.ShardID]storage.Epoch, len(r.owned)),
		pending:    len(r.pending),
		releasing:  len(r.releasing),
		inbound:    len(r.inbound),
	}
	for _, m := range r.members {
		v.members = append(v.members, m)
	}
	for id := range r.locks {
		if l, held := r.locks.Get(sharding.ShardID(id)); held {
			v.locks = append(v.locks, l)
		}
	}
	for id, m := range r.byLease {
		v.byLease[id] = m.ID
	}
	for _, h := range r.handoffs {
		v.handoffs = append(v.handoffs, h)
	}
	for id, s := range r.owned {
		v.owned[id] = s.epoch
	}
	slices.SortFunc(v.members, func(a, b storage.Runner) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(v.handoffs, func(a, b storage.Handoff) int { return int(a.Shard) - int(b.Shard) })
	return v
}

// health returns the lease keeper's health and the detachment state.
func (r *Runner) health() (lease.Health, detachment.State) {
	h, _ := r.keeper.Health()
	return h, r.machine.State()
}

// kindCount is what the debug handler shows of one registered kind.
type kindCount struct {
	name     string
	active   int    // resident instances
	handled  uint64 // messages whose handler ran
	rejected uint64 // messages refused by a full mailbox
}

// kindCounts returns the registered kinds by name with their resident
// entities and message counters (see hosting.Host.KindCounts).
func (r *Runner) kindCounts() []kindCount {
	counts := r.hosting.KindCounts()
	out := make([]kindCount, len(counts))
	for i, k := range counts {
		out[i] = kindCount{name: k.Name, active: k.Active, handled: k.Handled, rejected: k.Rejected}
	}
	return out
}
