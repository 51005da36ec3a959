package runner

import (
	"context"
	"fmt"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/hosting"
)

// admit is the first check of every Send, before any routing: a call whose
// context already ended is never delivered (no handler runs it, local or
// remote); a call made before Run is called waits for it (waitRun); and a
// runner that has stopped refuses at once instead of waiting for an owner
// it will never learn.
func (r *Runner) admit(ctx context.Context, c entity.Call) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("runner: %s not sent: the context ended before admission: %w", callName(c), hosting.ContextError(ctx))
	}
	if !r.running.Load() {
		if err := r.waitRun(ctx); err != nil { // start.go
			return fmt.Errorf("%w; %s not sent", err, callName(c))
		}
	}
	return nil
}

// callName names a call for errors: kind.method to "entity".
func callName(c entity.Call) string {
	kind, method := "?", "?"
	if c.Kind != nil {
		kind = c.Kind.Name()
	}
	if c.Handler != nil {
		method = c.Handler.Name()
	}
	return fmt.Sprintf("%s.%s to %q", kind, method, c.Entity)
}
