package runner

import "context"

// handlerContext returns the context a handler runs m under: the shard's
// context (its causes — ErrDetached, ErrShardMoved, ErrShutdown — and its
// ShardInfo) bounded by the asker's deadline, if it has one, with cause
// ErrCallerDeadline. A remote asker's deadline arrives with its request
// (the frame's timeout); signals carry none. The returned cancel is nil
// when the shard's context is used as it is.
func (sh *shardHost) handlerContext(m *message) (context.Context, context.CancelFunc) {
	if m.ctx == nil {
		return sh.ctx, nil
	}
	dl, ok := m.ctx.Deadline()
	if !ok {
		return sh.ctx, nil
	}
	return context.WithDeadlineCause(sh.ctx, dl, ErrCallerDeadline)
}
