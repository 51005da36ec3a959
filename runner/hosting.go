package runner

import (
	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
)

// Register makes kinds available on this runner. Every runner of a cluster
// should register the same kinds. Registering a different kind under a name
// already taken is an error; registering the same kind twice is a no-op.
func (r *Runner) Register(kinds ...entity.Descriptor) error {
	return r.hosting.Register(kinds...)
}

// hostingEnv is what the entity host (package hosting) asks of the runner.
type hostingEnv struct{ r *Runner }

var _ hosting.Env = hostingEnv{}

func (e hostingEnv) PastDetach() bool { return e.r.trip.past() }

func (e hostingEnv) NotHere(id sharding.ShardID) error { return e.r.notHere(id) }

// notHere is the error for a shard not hosted here.
func (r *Runner) notHere(id sharding.ShardID) error {
	r.mu.Lock()
	detached := r.lifecycle.phase == phaseDetached
	r.mu.Unlock()
	if detached {
		return &UndeliveredError{Shard: id, Cause: ErrDetached}
	}
	r.mu.Lock()
	hint := r.ownerHintLocked(id)
	r.mu.Unlock()
	if hint == r.cfg.ID {
		hint = "" // our own stale lock (releasing or detached): no useful hint
	}
	return &NotOwnerError{Shard: id, OwnerHint: hint}
}
