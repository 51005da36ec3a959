package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// fenceWatch is the checkpoint store entities write through: a write or
// delete refused because the shard's lock is at another epoch than the one
// it was made at, while this runner still hosts the shard at that epoch,
// means the lock changed behind the runner's back (a write of someone else
// under its lease, which the verification by lease keys cannot see). The
// shard is dropped at once, as when the lock watch saw such a change.
type fenceWatch struct {
	storage.Checkpoints
	r *Runner
}

var _ hosting.Checkpoints = fenceWatch{}

func (f fenceWatch) WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision, data []byte) (storage.Revision, error) {
	rev, err := f.Checkpoints.WriteCheckpoint(ctx, shard, name, epoch, prev, data)
	f.r.fenced(shard, epoch, err)
	return rev, err
}

func (f fenceWatch) DeleteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision) error {
	err := f.Checkpoints.DeleteCheckpoint(ctx, shard, name, epoch, prev)
	f.r.fenced(shard, epoch, err)
	return err
}

// fenced drops shard id when err is a write refused because its lock is no
// longer at epoch, the epoch it is hosted at here.
func (r *Runner) fenced(id sharding.ShardID, epoch storage.Epoch, err error) {
	var fe *storage.FencedError
	if !errors.As(err, &fe) || fe.Current == epoch {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.shards.owner(id); s != nil && s.epoch == epoch && !r.shards.leaving(id) {
		r.lockLostLocked(id, fmt.Sprintf("a write fenced by epoch %d was refused: the lock is at epoch %d", epoch, fe.Current))
		r.view.locks.Del(id) // unknown now: the next decision reads it
		r.shardChangedLocked(id, 0, true)
		r.flushLostLocked()
	}
}
