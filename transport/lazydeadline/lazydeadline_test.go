package lazydeadline

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

type ctxTestKey struct{}

var (
	errCallerDeadline = errors.New("the caller's deadline passed")
	errParentEnded    = errors.New("the parent ended")
)

// ctxView is what can be observed of a context.
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

// TestContextActsAsWithDeadlineCause: a Context is observed as
// context.WithDeadlineCause(parent, deadline, cause) is — before and after
// the deadline, when the parent ends first, after Cancel, with a parent
// deadline sooner, and whether the first observation is Err, Done or a
// derivation (or none until then).
func TestContextActsAsWithDeadlineCause(t *testing.T) {
	type step int
	const (
		atStart step = iota
		pastDeadline
		parentEnded
		cancelled
	)
	cases := []struct {
		name       string
		parentDL   time.Duration // 0: none
		deadline   time.Duration
		steps      []step
		touchFirst func(context.Context) // what its user does first
	}{
		{name: "deadline passes, Err polled", deadline: time.Second, steps: []step{atStart, pastDeadline}, touchFirst: func(c context.Context) { _ = c.Err() }},
		{name: "deadline passes, Done waited", deadline: time.Second, steps: []step{atStart, pastDeadline}, touchFirst: func(c context.Context) { _ = c.Done() }},
		{name: "deadline passes, untouched", deadline: time.Second, steps: []step{pastDeadline}},
		{name: "parent ends first", deadline: time.Hour, steps: []step{atStart, parentEnded, pastDeadline}, touchFirst: func(c context.Context) { _ = c.Done() }},
		{name: "parent ends first, untouched", deadline: time.Hour, steps: []step{parentEnded}},
		{name: "cancelled", deadline: time.Hour, steps: []step{atStart, cancelled}},
		{name: "cancelled, untouched", deadline: time.Hour, steps: []step{cancelled}},
		{name: "cancelled, made before", deadline: time.Hour, steps: []step{cancelled}, touchFirst: func(c context.Context) { _ = c.Done() }},
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
				refParent, refEnd, refStop := mk()
				defer refStop()
				ourParent, ourEnd, ourStop := mk()
				defer ourStop()
				start := time.Now()
				dl := start.Add(tc.deadline)
				ref, refCancel := context.WithDeadlineCause(refParent, dl, errCallerDeadline)
				defer refCancel()
				ours := WithDeadlineCause(ourParent, dl, errCallerDeadline)
				defer ours.Cancel()
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
					case parentEnded:
						refEnd(errParentEnded)
						ourEnd(errParentEnded)
					case cancelled:
						refCancel()
						ours.Cancel()
					}
					if got, want := viewOf(ours), viewOf(ref); got != want {
						t.Fatalf("after step %d: Context %+v, WithDeadlineCause %+v", s, got, want)
					}
				}
			})
		})
	}
}

// TestContextWakesWaiterAtDeadline: a waiter on Done is woken at the
// deadline, with the cause; a derived context's Err is DeadlineExceeded.
func TestContextWakesWaiterAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		c := WithDeadlineCause(context.Background(), start.Add(time.Second), errCallerDeadline)
		defer c.Cancel()
		child, cancel := context.WithCancel(c)
		defer cancel()
		<-child.Done()
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("woken after %v, want 1s", waited)
		}
		if !errors.Is(context.Cause(c), errCallerDeadline) || !errors.Is(child.Err(), context.DeadlineExceeded) || !errors.Is(context.Cause(child), errCallerDeadline) {
			t.Errorf("cause %v, child err %v cause %v; want errCallerDeadline, DeadlineExceeded, errCallerDeadline", context.Cause(c), child.Err(), context.Cause(child))
		}
	})
}

// TestContextMadeOnceUnderConcurrentUse: goroutines racing to make the
// context and to cancel it see one Done channel, closed once cancelled.
func TestContextMadeOnceUnderConcurrentUse(t *testing.T) {
	for range 100 {
		c := WithDeadlineCause(context.Background(), time.Now().Add(time.Hour), errCallerDeadline)
		dones := make(chan (<-chan struct{}), 4)
		start := make(chan struct{})
		for range 4 {
			go func() {
				<-start
				_ = c.Err()
				dones <- c.Done()
			}()
		}
		close(start)
		c.Cancel()
		first := <-dones
		for range 3 {
			if d := <-dones; d != first {
				t.Fatal("two Done channels: the context was made twice")
			}
		}
		select {
		case <-first:
		default:
			t.Fatal("Done not closed after Cancel")
		}
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err after Cancel = %v, want Canceled", c.Err())
		}
	}
}
