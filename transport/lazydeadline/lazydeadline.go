// Package lazydeadline makes a context bounded by a deadline that costs
// no timer until something waits for it.
//
// context.WithDeadlineCause starts a timer and registers with its parent
// at once; on the hot paths of a remote ask (the transport's context for
// a request, a handler's context bounded by its asker's deadline) most of
// these contexts are only asked for their deadline and their Err, and
// never waited on. A Context here answers Deadline, Value and a nil Err
// from its parent and its deadline, and makes the WithDeadlineCause
// context only when something needs it: Done, a non-nil Err (the
// deadline passed, the parent ended, or Cancel was called), or a Value
// of a key of the context package's own. It is then observed exactly as
// that context is: the same Done, Err, cause (context.Cause) and
// derivations.
//
// The transport uses it for a request's context and the runner for a
// handler's context bounded by its asker's deadline.
package lazydeadline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Context is context.WithDeadlineCause(parent, deadline, cause), made
// when first needed. Cancel it (as the CancelFunc of WithDeadlineCause)
// when done with it.
type Context struct {
	parent   context.Context
	deadline time.Time
	cause    error

	real  atomic.Pointer[made] // set once, under mu
	mu    sync.Mutex
	ended atomic.Bool // Cancel was called: a context made from now on is cancelled
}

type made struct {
	ctx    context.Context
	cancel context.CancelFunc
}

var _ context.Context = (*Context)(nil)

// WithDeadlineCause returns a Context observed as
// context.WithDeadlineCause(parent, deadline, cause) is; nothing is
// started or registered yet.
func WithDeadlineCause(parent context.Context, deadline time.Time, cause error) *Context {
	return &Context{parent: parent, deadline: deadline, cause: cause}
}

// Deadline is the earlier of the parent's and deadline, as
// WithDeadlineCause makes it.
func (c *Context) Deadline() (time.Time, bool) {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Done makes the context.
func (c *Context) Done() <-chan struct{} { return c.made().Done() }

// Err is nil, with nothing made, while the deadline is ahead, the parent
// lives and Cancel was not called; otherwise it is the made context's.
func (c *Context) Err() error {
	if r := c.real.Load(); r != nil {
		return r.ctx.Err()
	}
	if !c.ended.Load() && c.parent.Err() == nil && time.Now().Before(c.deadline) {
		return nil
	}
	return c.made().Err()
}

// Value answers from the parent, except for keys of type *int (the
// context package's cancelCtx key, which a WithDeadlineCause context
// answers with itself: context.Cause and derived contexts look it up),
// which the made context answers.
func (c *Context) Value(key any) any {
	if _, ok := key.(*int); ok {
		return c.made().Value(key)
	}
	if r := c.real.Load(); r != nil {
		return r.ctx.Value(key)
	}
	return c.parent.Value(key)
}

func (c *Context) String() string { return "lazydeadline.Context" }

// made returns the WithDeadlineCause context, making it on first use
// (cancelled at once if Cancel was called).
func (c *Context) made() context.Context {
	if r := c.real.Load(); r != nil {
		return r.ctx
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.real.Load(); r != nil {
		return r.ctx
	}
	ctx, cancel := context.WithDeadlineCause(c.parent, c.deadline, c.cause)
	if c.ended.Load() {
		cancel()
	}
	c.real.Store(&made{ctx, cancel})
	return ctx
}

// Cancel cancels the context (as the CancelFunc of WithDeadlineCause
// would), if made; one made later is made cancelled.
func (c *Context) Cancel() {
	c.ended.Store(true)
	c.mu.Lock() // a made running now has stored its context, or sees ended
	r := c.real.Load()
	c.mu.Unlock()
	if r != nil {
		r.cancel()
	}
}
