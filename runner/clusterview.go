package runner

import (
	"slices"
	"strings"

	"github.com/shardhost/shardhost/runner/internal/debugpage"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Queries of the cluster view (r.view, guarded by r.mu).

// registered reports whether the membership view holds the record of
// runner id's incarnation under lease.
func (v *clusterView) registered(id, incarnation string, lease storage.LeaseID) bool {
	m, ok := v.members[id]
	return ok && m.Incarnation == incarnation && m.Lease == lease
}

// liveAddresses returns the members' transport addresses.
func (v *clusterView) liveAddresses() map[string]bool {
	live := make(map[string]bool, len(v.members))
	for _, m := range v.members {
		if m.Address != "" {
			live[m.Address] = true
		}
	}
	return live
}

// foreignMember returns a member made by another process (not runner
// self: a predecessor of this runner is waited for at
// registration), or nil.
func (v *clusterView) foreignMember(self string) *storage.Runner {
	for _, m := range v.members {
		if m.ID == self {
			continue
		}
		if _, local := localIncarnations.Load(m.Incarnation); !local {
			return &m
		}
	}
	return nil
}

// runnersForAssign returns the members as the strategy's input
// runners: sorted by ID, a draining one with weight 0.
func (v *clusterView) runnersForAssign() []sharding.Runner {
	runners := make([]sharding.Runner, 0, len(v.members))
	for _, m := range v.members {
		w := m.Weight
		if m.Draining {
			w = 0
		}
		runners = append(runners, sharding.Runner{ID: m.ID, Weight: w})
	}
	slices.SortFunc(runners, func(a, b sharding.Runner) int { return strings.Compare(a.ID, b.ID) })
	return runners
}

// current returns the owner of every one of numShards shards in the lock
// view (the strategy's Input.Current).
func (v *clusterView) current(numShards int) sharding.Assignment {
	cur := make(sharding.Assignment, numShards)
	for id, l := range v.locks.All() {
		if l.Epoch != 0 {
			cur[id] = v.byLease[l.Lease].ID
		}
	}
	return cur
}

// gatewayView is a client-only runner's routing view: the hosting
// runners it sees, and the shards it has a route for (a lock of a live
// member, else an assignee that is a member) of numShards shards.
func (v *clusterView) gatewayView(numShards int) *debugpage.Gateway {
	g := &debugpage.Gateway{Members: len(v.members)}
	for id := range numShards {
		sid := sharding.ShardID(id)
		if l, held := v.locks.Get(sid); held {
			if _, live := v.byLease[l.Lease]; live {
				g.Routes++
				continue
			}
		}
		if id < v.assignment.Len() {
			if _, ok := v.members[v.assignment.Of(sid)]; ok {
				g.Routes++
			}
		}
	}
	return g
}

// assigneeToTell returns the member shard id is assigned to, when it is
// another live runner than self: a release tells it the lock is free
// (storage.Held.Tell), so it acquires at once ("": nobody).
func (v *clusterView) assigneeToTell(id sharding.ShardID, self string) string {
	to := v.assignment.Of(id)
	if _, live := v.members[to]; !live || to == self {
		return ""
	}
	return to
}
