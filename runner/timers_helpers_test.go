package runner_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// alarm is the test entity of timers and reminders: it arms them from its
// handlers and records every fire (where, under which epoch, which tick).
type alarm struct {
	id  string
	env *alarmEnv
}

// alarmFire is one recorded fire.
type alarmFire struct {
	Runner      string
	Shard       sharding.ShardID
	Epoch       storage.Epoch
	Entity      string
	Name        string
	Timer       bool
	Tick        uint64
	Missed      uint64
	Redelivered bool
	Due, At     time.Time
	Payload     string
}

type alarmEnv struct {
	mu          sync.Mutex
	fires       []alarmFire
	running     map[string]bool // entity -> a handler runs
	overlaps    int             // handlers of one entity running at once
	activations map[string]int
	releases    map[string][]error
	stubborn    chan struct{} // a "stall" handler waits for it, ignoring its context
	kind        *entity.Kind[alarm]
	arm         *entity.MethodRef[alarm, armReq, bool]
	disarm      *entity.MethodRef[alarm, string, bool]
	list        *entity.MethodRef[alarm, struct{}, []entity.ReminderInfo]
	stall       *entity.MethodRef[alarm, armReq, string]
	ring        *entity.TimerRef[alarm, string]
	remind      *entity.ReminderRef[alarm, string]
}

type armReq struct {
	Name    string
	Timer   bool
	Delay   time.Duration // timer: first fire after
	Period  time.Duration // timer or reminder
	First   time.Time     // reminder
	Skip    bool
	Payload string
}

func newAlarmEnv(opts ...entity.Option) *alarmEnv {
	env := &alarmEnv{running: map[string]bool{}, activations: map[string]int{}, releases: map[string][]error{}, stubborn: make(chan struct{})}
	k := entity.NewKind("alarm", func(id string) *alarm { return &alarm{id: id, env: env} }, opts...)
	env.kind = k
	env.arm = entity.Method(k, "arm", (*alarm).Arm)
	env.disarm = entity.Method(k, "disarm", (*alarm).Disarm)
	env.list = entity.Method(k, "list", (*alarm).List)
	env.stall = entity.Method(k, "stall", (*alarm).Stall)
	env.ring = entity.Timer(k, "ring", (*alarm).Ring)
	env.remind = entity.Reminder(k, "remind", (*alarm).Remind)
	return env
}

func (a *alarm) enter() func() {
	env := a.env
	env.mu.Lock()
	if env.running[a.id] {
		env.overlaps++
	}
	env.running[a.id] = true
	env.mu.Unlock()
	return func() {
		env.mu.Lock()
		env.running[a.id] = false
		env.mu.Unlock()
	}
}

func (a *alarm) Arm(ctx context.Context, r armReq) (bool, error) {
	defer a.enter()()
	return true, a.armWith(ctx, r)
}

func (a *alarm) armWith(ctx context.Context, r armReq) error {
	if r.Timer {
		if r.Period != 0 && r.Delay == 0 {
			return a.env.ring.Every(ctx, r.Name, r.Period, r.Payload)
		}
		if r.Period != 0 {
			return fmt.Errorf("test: a delayed periodic timer is not a case")
		}
		return a.env.ring.After(ctx, r.Name, r.Delay, r.Payload)
	}
	s := entity.Schedule{First: r.First, Period: r.Period}
	if r.Skip {
		s.Missed = entity.Skip
	}
	return a.env.remind.Register(ctx, r.Name, s, r.Payload)
}

// Stall waits for env.stubborn ignoring its context, then arms r (a
// handler that outlives its shard's move).
func (a *alarm) Stall(ctx context.Context, r armReq) (string, error) {
	<-a.env.stubborn
	if err := a.armWith(ctx, r); err != nil {
		return "", err
	}
	return "armed", nil
}

func (a *alarm) Disarm(ctx context.Context, name string) (bool, error) {
	defer a.enter()()
	if stopped, err := entity.StopTimer(ctx, name); err != nil || stopped {
		return stopped, err
	}
	return true, entity.CancelReminder(ctx, name)
}

func (a *alarm) List(ctx context.Context, _ struct{}) ([]entity.ReminderInfo, error) {
	return entity.Reminders(ctx)
}

func (a *alarm) record(ctx context.Context, f alarmFire) {
	info, _ := runner.ShardInfoFrom(ctx)
	f.Runner, f.Shard, f.Epoch, f.Entity, f.At = info.Runner, info.Shard, info.Epoch, a.id, time.Now()
	a.env.mu.Lock()
	a.env.fires = append(a.env.fires, f)
	a.env.mu.Unlock()
}

func (a *alarm) Ring(ctx context.Context, t entity.TimerTick[string]) error {
	defer a.enter()()
	a.record(ctx, alarmFire{Name: t.Name, Timer: true, Tick: t.Tick, Missed: t.Missed, Payload: t.Payload})
	return nil
}

func (a *alarm) Remind(ctx context.Context, t entity.ReminderTick[string]) error {
	defer a.enter()()
	a.record(ctx, alarmFire{Name: t.Name, Tick: t.Tick, Missed: t.Missed, Redelivered: t.Redelivered, Due: t.Due, Payload: t.Payload})
	return nil
}

func (a *alarm) Activate(ctx context.Context, info entity.ActivateInfo) error {
	a.env.mu.Lock()
	a.env.activations[a.id]++
	a.env.mu.Unlock()
	return nil
}

func (a *alarm) Release(ctx context.Context, info entity.ReleaseInfo) error {
	a.env.mu.Lock()
	a.env.releases[a.id] = append(a.env.releases[a.id], info.Reason)
	a.env.mu.Unlock()
	return nil
}

// firesOf returns the recorded fires of entity's timer or reminder name.
func (env *alarmEnv) firesOf(entityID, name string) []alarmFire {
	env.mu.Lock()
	defer env.mu.Unlock()
	var out []alarmFire
	for _, f := range env.fires {
		if f.Entity == entityID && f.Name == name {
			out = append(out, f)
		}
	}
	return out
}

// allFires returns every recorded fire, in the order recorded.
func (env *alarmEnv) allFires() []alarmFire {
	env.mu.Lock()
	defer env.mu.Unlock()
	return slices.Clone(env.fires)
}

func ticks(fs []alarmFire) []uint64 {
	out := make([]uint64, len(fs))
	for i, f := range fs {
		out[i] = f.Tick
	}
	return out
}

// checkOnceInOrder reports a problem with a fire sequence that must be
// exactly once in real time: ticks in order, none twice, none redelivered,
// every gap explained by the fire's missed count. Ticks due while nobody
// could fire them (a cutover longer than the period, on a slow machine)
// are collapsed into the next fire with their count
// (runner/internal/reminders); in virtual time, checkExact applies.
func checkOnceInOrder(fs []alarmFire) string {
	var prev uint64
	for i, f := range fs {
		if f.Redelivered || f.Tick != prev+f.Missed+1 {
			return fmt.Sprintf("fire %d is tick %d (missed %d, redelivered %v) on %s after tick %d; ticks %v", i, f.Tick, f.Missed, f.Redelivered, f.Runner, prev, ticks(fs))
		}
		prev = f.Tick
	}
	return ""
}

// checkExact reports a problem with a fire sequence that must be exact:
// ticks 1, 2, ... with no duplicate, gap, missed count or redelivery.
func checkExact(fs []alarmFire) string {
	for i, f := range fs {
		if f.Tick != uint64(i+1) || f.Missed != 0 || f.Redelivered {
			return fmt.Sprintf("fire %d is tick %d (missed %d, redelivered %v) on %s; ticks %v", i, f.Tick, f.Missed, f.Redelivered, f.Runner, ticks(fs))
		}
	}
	return ""
}

func runnersOf(fs []alarmFire) []string {
	var out []string
	for _, f := range fs {
		if len(out) == 0 || out[len(out)-1] != f.Runner {
			out = append(out, f.Runner)
		}
	}
	return out
}

func (env *alarmEnv) activationsOf(id string) int {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.activations[id]
}

func (env *alarmEnv) releasesOf(id string) []error {
	env.mu.Lock()
	defer env.mu.Unlock()
	return slices.Clone(env.releases[id])
}
