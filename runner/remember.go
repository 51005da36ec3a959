package runner

import (
	"context"

	"github.com/shardhost/shardhost/entity"
)

// Remember makes entity id of kind remembered without a message of its
// own, wherever its shard is owned: entity.Remember with this runner as
// the sender (a handler passes its ctx's SenderFrom, or the runner). It
// returns once the shard's owner has the entity running and its marker is
// in the store, fenced by the shard's epoch; remembering an entity
// already remembered writes nothing. ErrNotRemembered for a kind without
// the Remembered option, ErrUnknownKind for a kind not registered here.
func (r *Runner) Remember(ctx context.Context, kind entity.Descriptor, id string) error {
	return entity.Remember(ctx, r, kind, id)
}
