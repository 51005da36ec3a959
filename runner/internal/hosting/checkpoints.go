package hosting

import (
	"context"
	"errors"
	"sync"

	"github.com/shardhost/shardhost/storage"
)

// maxCheckpointRetries bounds how many times one checkpoint write or
// delete is made again after the checkpoint was found at another revision
// than expected (each time an earlier write of this owner landed late).
const maxCheckpointRetries = 8

// checkpoints are one entity instance's Restore, Checkpoint and
// DeleteCheckpoint (its Activate and Release hooks'), fenced by the shard's
// epoch and ordered: each write or delete names the revision the
// checkpoint is known at (storage.Checkpoints), so that a write whose
// outcome was unknown (a timeout: etcd may still apply it later, even
// after a newer write of the same owner) can never overwrite a later one —
// whichever of the two reaches the store second is refused. The later
// write, if refused, learns the checkpoint's current revision from the
// refusal and is made again: it is the newer state. An unknown revision
// (nothing restored or written yet by this instance) is first taken as
// "no checkpoint", corrected the same way.
type checkpoints struct {
	sh   *Shard
	name string

	mu  sync.Mutex // held across a write or delete: the instance's are made one at a time
	rev storage.Revision
}

// checkpointsOf returns e's checkpoints (on its goroutine: activation or
// release).
func (sh *Shard) checkpointsOf(e *resident) *checkpoints {
	if e.cps == nil {
		e.cps = &checkpoints{sh: sh, name: checkpointName(e.key)}
	}
	return e.cps
}

// restore reads the checkpoint (ActivateInfo.Restore) and remembers its
// revision.
func (c *checkpoints) restore(ctx context.Context) ([]byte, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp, ok, err := c.sh.h.readCheckpoint(ctx, c.sh.id, c.name)
	switch {
	case ok:
		c.rev = cp.Revision
	case err == nil:
		c.rev = 0
	}
	return cp.Data, ok, err
}

// write stores data as the checkpoint (Checkpoint of ActivateInfo and
// ReleaseInfo).
func (c *checkpoints) write(ctx context.Context, data []byte) error {
	return c.do(func(prev storage.Revision) (storage.Revision, error) {
		return c.sh.h.store.WriteCheckpoint(ctx, c.sh.id, c.name, c.sh.epoch, prev, data)
	})
}

// delete deletes the checkpoint (DeleteCheckpoint of ActivateInfo and
// ReleaseInfo); none is no error.
func (c *checkpoints) delete(ctx context.Context) error {
	return c.do(func(prev storage.Revision) (storage.Revision, error) {
		return 0, c.sh.h.store.DeleteCheckpoint(ctx, c.sh.id, c.name, c.sh.epoch, prev)
	})
}

// do makes op at the checkpoint's known revision, again at the current one
// each time the store says it is at another, and remembers the revision op
// leaves. A failure whose outcome is unknown leaves the known revision as
// it was: if the write lands later, the next one is refused and corrected.
func (c *checkpoints) do(op func(prev storage.Revision) (storage.Revision, error)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for try := 0; ; try++ {
		rev, err := op(c.rev)
		var changed *storage.CheckpointChangedError
		if !errors.As(err, &changed) {
			if err == nil {
				c.rev = rev
			}
			return err
		}
		c.rev = changed.Current
		if try == maxCheckpointRetries {
			return err
		}
	}
}
