package runner

import "context"

// deleteCheckpointFunc is the DeleteCheckpoint of an entity's lifecycle
// hooks: the entity's checkpoint (kind/id) is deleted if the shard's lock
// is still at this host's epoch, in the same transaction.
func (sh *shardHost) deleteCheckpointFunc(key entityKey) func(context.Context) error {
	return func(ctx context.Context) error {
		return sh.r.store.DeleteCheckpoint(ctx, sh.id, checkpointName(key), sh.epoch)
	}
}
