package hosting

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// boundedCtx is the context of a handler whose asker has a deadline: the
// entity's context bounded by that deadline, with cause ErrCallerDeadline
// — what context.WithDeadlineCause(parent, deadline, ErrCallerDeadline)
// returns, and it behaves as that context in every observable way. But
// that context costs its own timer and a registration with the shard's
// context for every ask, while the asker's context (for a remote ask, the
// transport's, which carries the frame's deadline) already has a timer
// for the same instant, and most handlers never wait on their context.
// So it is made only when something needs it (lazy): Done, a Value of a
// key the context package itself uses, or an Err that is not nil — when
// the deadline has passed, the shard's context ended or the handler
// returned (end). Deadline, the other Values and a nil Err are answered
// from the parent and the deadline, with no timer and no registration.
type boundedCtx struct {
	parent   context.Context // the entity's context (with the span, if traced)
	deadline time.Time       // the asker's

	real  atomic.Pointer[realCtx] // set once, under mu
	mu    sync.Mutex
	ended atomic.Bool // end was called: a context made from now on is cancelled
}

type realCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

var _ context.Context = (*boundedCtx)(nil)

// Deadline is the earlier of the parent's and the asker's, as
// WithDeadlineCause makes it.
func (c *boundedCtx) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Done makes the context.
func (c *boundedCtx) Done() <-chan struct{} { return c.made().Done() }

// Err is nil, with no context made, while the deadline is ahead, the
// parent lives and the handler runs; otherwise it is the made context's.
func (c *boundedCtx) Err() error {
	if r := c.real.Load(); r != nil {
		return r.ctx.Err()
	}
	if !c.ended.Load() && c.parent.Err() == nil && time.Now().Before(c.deadline) {
		return nil
	}
	return c.made().Err()
}

// Value answers from the parent, except for the keys the context package
// looks up itself (of type *int: its cancelCtx key, which a
// WithDeadlineCause context answers with itself — found by
// context.Cause, and by the contexts derived from this one): those are
// answered by the made context.
func (c *boundedCtx) Value(key any) any {
	if _, ok := key.(*int); ok {
		return c.made().Value(key)
	}
	if r := c.real.Load(); r != nil {
		return r.ctx.Value(key)
	}
	return c.parent.Value(key)
}

func (c *boundedCtx) String() string { return "hosting.boundedCtx" }

// made returns the WithDeadlineCause context, making it on first use
// (cancelled at once if the handler already returned).
func (c *boundedCtx) made() context.Context {
	if r := c.real.Load(); r != nil {
		return r.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.real.Load(); r != nil {
		return r.ctx
	}
	ctx, cancel := context.WithDeadlineCause(c.parent, c.deadline, ErrCallerDeadline)
	if c.ended.Load() {
		cancel()
	}
	c.real.Store(&realCtx{ctx, cancel})
	return ctx
}

// end is the handler's return: the context is cancelled (as the cancel of
// WithDeadlineCause would), if made; one made later is made cancelled.
func (c *boundedCtx) end() {
	c.ended.Store(true)
	c.mu.Lock() // a made running now has stored its context, or sees ended
	r := c.real.Load()
	c.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}
