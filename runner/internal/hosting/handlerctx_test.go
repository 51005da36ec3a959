package hosting

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxTestKey struct{}

// ctxView is what a handler can observe of its context.
type ctxView struct {
	err, cause  error
	deadline    time.Time
	hasDeadline bool
	done        bool
	value       any
	childErr    error // of a context derived from it
	childCause  error
}

func viewOf(ctx context.Context) ctxView {
	v := ctxView{err: ctx.Err(), cause: context.Cause(ctx), value: ctx.Value(ctxTestKey{})}
	v.deadline, v.hasDeadline = ctx.Deadline()
	select {
	case <-ctx.Done():
		v.done = true
	default:
	}
	child, cancel := context.WithCancel(ctx)
	v.childErr, v.childCause = child.Err(), context.Cause(child)
	cancel()
	return v
}

// TestBoundedContextActsAsWithDeadlineCause: the lazily made handler
// context is observed as context.WithDeadlineCause(parent, deadline,
// ErrCallerDeadline) is — before and after the deadline, when the shard's
// context ends first, after the handler returned, with a parent deadline
// sooner, and whether the first observation is Err, Done or a derivation.
func TestBoundedContextActsAsWithDeadlineCause(t *testing.T) {
	type step int
	const (
		atStart step = iota
		pastDeadline
		shardEnded
		handlerReturned
	)
	cases := []struct {
		name       string
		parentDL   time.Duration // 0: none
		deadline   time.Duration
		steps      []step
		touchFirst func(context.Context) // what the handler does first
	}{
		{name: "deadline passes, Err polled", deadline: time.Second, steps: []step{atStart, pastDeadline}, touchFirst: func(c context.Context) { _ = c.Err() }},
		{name: "deadline passes, Done waited", deadline: time.Second, steps: []step{atStart, pastDeadline}, touchFirst: func(c context.Context) { _ = c.Done() }},
		{name: "deadline passes, untouched", deadline: time.Second, steps: []step{pastDeadline}},
		{name: "shard ends first", deadline: time.Hour, steps: []step{atStart, shardEnded, pastDeadline}, touchFirst: func(c context.Context) { _ = c.Done() }},
		{name: "shard ends first, untouched", deadline: time.Hour, steps: []step{shardEnded}},
		{name: "handler returns", deadline: time.Hour, steps: []step{atStart, handlerReturned}},
		{name: "handler returns, untouched", deadline: time.Hour, steps: []step{handlerReturned}},
		{name: "handler returns, made before", deadline: time.Hour, steps: []step{handlerReturned}, touchFirst: func(c context.Context) { _ = c.Done() }},
		{name: "parent deadline sooner", parentDL: time.Second, deadline: time.Hour, steps: []step{atStart, pastDeadline}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// Two identical parents: one for the reference, one for ours.
				mk := func() (context.Context, context.CancelCauseFunc, context.CancelFunc) {
					p, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxTestKey{}, "v"))
					stop := context.CancelFunc(func() {})
					if tc.parentDL > 0 {
						p, stop = context.WithTimeout(p, tc.parentDL)
					}
					return p, cancel, stop
				}
				refParent, refShard, refStop := mk()
				defer refStop()
				ourParent, ourShard, ourStop := mk()
				defer ourStop()
				start := time.Now()
				dl := start.Add(tc.deadline)
				ref, refCancel := context.WithDeadlineCause(refParent, dl, ErrCallerDeadline)
				defer refCancel()
				ours := &boundedCtx{parent: ourParent, deadline: dl}
				defer ours.end()
				if tc.touchFirst != nil {
					tc.touchFirst(ours)
				}
				for _, s := range tc.steps {
					switch s {
					case pastDeadline:
						first := tc.deadline
						if tc.parentDL > 0 {
							first = min(first, tc.parentDL)
						}
						time.Sleep(time.Until(start.Add(first)) + time.Millisecond)
						synctest.Wait()
					case shardEnded:
						refShard(ErrShardMoved)
						ourShard(ErrShardMoved)
					case handlerReturned:
						refCancel()
						ours.end()
					}
					if got, want := viewOf(ours), viewOf(ref); got != want {
						t.Fatalf("after step %d: bounded context %+v, WithDeadlineCause %+v", s, got, want)
					}
				}
			})
		})
	}
}

// TestBoundedContextWakesWaiterAtDeadline: a handler waiting on Done is
// woken at the asker's deadline with cause ErrCallerDeadline, and one
// derived context's Err is DeadlineExceeded.
func TestBoundedContextWakesWaiterAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := &boundedCtx{parent: context.Background(), deadline: start.Add(time.Second)}
		defer c.end()
		child, cancel := context.WithCancel(c)
		defer cancel()
		<-child.Done()
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("woken after %v, want 1s", waited)
		}
		if !errors.Is(context.Cause(c), ErrCallerDeadline) || !errors.Is(child.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(child), ErrCallerDeadline) {
			t.Errorf("cause %v, child err %v cause %v; want ErrCallerDeadline, DeadlineExceeded, ErrCallerDeadline", context.Cause(c), child.Err(), context.Cause(child))
		}
	})
}
