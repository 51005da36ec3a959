package entity_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
)

// otherRuntime is the runtime of an entity of kind "other" (every call
// succeeds): a context carrying it is a handler's, of another kind.
type otherRuntime struct{}

func (otherRuntime) Entity() (string, string) { return "other", "o1" }
func (otherRuntime) StartTimer(string, *entity.Handler, time.Duration, time.Duration, any) error {
	return nil
}
func (otherRuntime) StopTimer(string) bool                                       { return false }
func (otherRuntime) RegisterReminder(context.Context, entity.ReminderSpec) error { return nil }
func (otherRuntime) CancelReminder(context.Context, string) error                { return nil }
func (otherRuntime) Reminders(context.Context) ([]entity.ReminderInfo, error)    { return nil, nil }
func (otherRuntime) Forget(context.Context) error                                { return nil }

// TestNoEntityErrorsNameTheCallAndTheFix: every call that needs a
// handler's context, given another, fails with an error that matches
// ErrNoEntity, is a *NoEntityError naming the call, and says to pass the
// handler's ctx; a timer or reminder of one kind used from another kind's
// handler says which entity it was used from.
func TestNoEntityErrorsNameTheCallAndTheFix(t *testing.T) {
	k := entity.NewKind("clock", func(string) *acc { return &acc{} })
	timer := entity.Timer(k, "tick", func(*acc, context.Context, entity.TimerTick[string]) error { return nil })
	remind := entity.Reminder(k, "due", func(*acc, context.Context, entity.ReminderTick[string]) error { return nil })
	bg := context.Background()
	other := entity.WithRuntime(bg, otherRuntime{})
	sched := entity.Schedule{Period: time.Minute}
	cases := []struct {
		call, detail string
		err          error
	}{
		{"TimerRef.After", "", timer.After(bg, "t", time.Second, "")},
		{"TimerRef.Every", "", timer.Every(bg, "t", time.Second, "")},
		{"StopTimer", "", func() error { _, err := entity.StopTimer(bg, "t"); return err }()},
		{"ReminderRef.Register", "", remind.Register(bg, "r", sched, "")},
		{"ReminderRef.Cancel", "", remind.Cancel(bg, "r")},
		{"CancelReminder", "", entity.CancelReminder(bg, "r")},
		{"Reminders", "", func() error { _, err := entity.Reminders(bg); return err }()},
		{"Forget", "", entity.Forget(bg)},
		{"TimerRef.After", `from a handler of other "o1"`, timer.After(other, "t", time.Second, "")},
		{"ReminderRef.Register", `from a handler of other "o1"`, remind.Register(other, "r", sched, "")},
	}
	for _, c := range cases {
		var ne *entity.NoEntityError
		switch {
		case !errors.Is(c.err, entity.ErrNoEntity):
			t.Errorf("%s = %v, want an error matching ErrNoEntity", c.call, c.err)
		case !errors.As(c.err, &ne) || ne.Call != c.call:
			t.Errorf("%s = %#v, want a *NoEntityError with Call %q", c.call, c.err, c.call)
		case !strings.Contains(c.err.Error(), c.call+" called with a context that is not a handler's: pass the handler's ctx"):
			t.Errorf("%s: message %q does not name the call and the fix", c.call, c.err)
		case !strings.Contains(c.err.Error(), c.detail):
			t.Errorf("%s: message %q does not say %q", c.call, c.err, c.detail)
		}
	}
}
