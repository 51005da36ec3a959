package hosting

import (
	"context"
	"fmt"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"go.opentelemetry.io/otel/trace"
)

// Timers and the entities' runtime. Every resident entity is its own
// entity.Runtime, carried by the context of its handlers and hooks: its
// timers are entries of the runner's one Scheduler (no goroutine or
// runtime timer each), delivered through its mailbox and ended with the
// instance; its reminders are the runner's reminder service's.

// MaxTimersPerEntity bounds the timers one entity runs at once.
const MaxTimersPerEntity = 4096

// timerRetry is how soon a one-shot timer that found its entity's shard
// not admitting (a handoff's cutover) or its mailbox full tries again.
const timerRetry = 10 * time.Millisecond

// Reminders is the runner's reminder service as an entity's runtime
// reaches it (internal/reminders implements it).
type Reminders interface {
	Register(ctx context.Context, shard sharding.ShardID, epoch storage.Epoch, e EntityKey, spec entity.ReminderSpec) error
	Cancel(ctx context.Context, shard sharding.ShardID, epoch storage.Epoch, e EntityKey, name string) error
	List(ctx context.Context, shard sharding.ShardID, epoch storage.Epoch, e EntityKey) ([]entity.ReminderInfo, error)
}

// SetReminders makes rs the reminder service of the entities' runtime. It
// must be called before any entity runs.
func (h *Host) SetReminders(rs Reminders) { h.reminders = rs }

// Timers returns the number of running timers (scheduled or firing).
func (h *Host) Timers() int64 { return h.timerCount.Load() }

// timer is one running timer of a resident entity.
type timer struct {
	schedule.Entry
	e       *resident
	name    string
	h       *entity.Handler
	period  time.Duration
	payload any
	fires   uint64
	stopped bool               // under e.mu
	link    *trace.SpanContext // the span that started it (traced), linked to each tick's
}

var _ entity.Runtime = (*resident)(nil)

// Entity implements entity.Runtime.
func (e *resident) Entity() (kind, id string) { return e.key.Kind, e.key.ID }

// StartTimer implements entity.Runtime.
func (e *resident) StartTimer(name string, h *entity.Handler, delay, period time.Duration, payload any) error {
	return e.startTimer(name, h, delay, period, payload, nil)
}

// startTimer is StartTimer; link, if not nil, is the span that starts the
// timer (a traced handler's: tracedRuntime).
func (e *resident) startTimer(name string, h *entity.Handler, delay, period time.Duration, payload any, link *trace.SpanContext) error {
	if h == nil || h.TickKind() != entity.TimerHandler || h.Kind() != e.key.Kind {
		return fmt.Errorf("%w: timer %q: not a timer handler of kind %s", entity.ErrInvalidTimer, name, e.key.Kind)
	}
	sched := e.host.h.sched
	if sched == nil {
		return &entity.NoEntityError{Call: "StartTimer", Detail: "the runtime has no timer scheduler"}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.dead {
		return &entity.NoEntityError{Call: "StartTimer", Detail: fmt.Sprintf("%s %q is being passivated or released: its handler returned", e.key.Kind, e.key.ID)}
	}
	if old := e.timers[name]; old != nil {
		old.stopped = true
		sched.Stop(&old.Entry)
		e.host.h.timerCount.Add(-1)
	} else if len(e.timers) >= MaxTimersPerEntity {
		return fmt.Errorf("%w: %s %q already runs %d timers", entity.ErrInvalidTimer, e.key.Kind, e.key.ID, MaxTimersPerEntity)
	}
	if e.timers == nil {
		e.timers = make(map[string]*timer)
	}
	t := &timer{e: e, name: name, h: h, period: period, payload: payload, link: link}
	t.F = t
	e.timers[name] = t
	e.host.h.timerCount.Add(1)
	sched.Schedule(&t.Entry, schedule.Now()+int64(delay))
	return nil
}

// StopTimer implements entity.Runtime.
func (e *resident) StopTimer(name string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	t := e.timers[name]
	if t == nil {
		return false
	}
	e.stopTimerLocked(t)
	return true
}

func (e *resident) stopTimerLocked(t *timer) {
	t.stopped = true
	e.host.h.sched.Stop(&t.Entry)
	delete(e.timers, t.name)
	e.host.h.timerCount.Add(-1)
}

// stopTimers ends every timer of the entity.
func (e *resident) stopTimers() {
	e.mu.Lock()
	e.stopTimersLocked()
	e.mu.Unlock()
}

func (e *resident) stopTimersLocked() {
	if len(e.timers) == 0 {
		return
	}
	for _, t := range e.timers {
		e.stopTimerLocked(t)
	}
}

// Fire implements schedule.Firer: the timer's tick enters the entity's
// mailbox, unless the timer was stopped, the entity retired or its shard
// is not admitting (a cutover: a one-shot timer retries shortly, a
// periodic one counts the tick as missed).
func (t *timer) Fire(_ *schedule.Entry, now int64) {
	e := t.e
	sh := e.host
	sched := sh.h.sched
	var missed uint64
	if t.period > 0 {
		missed = uint64((now - t.Due()) / int64(t.period))
	}
	sh.mu.RLock()
	admitting := sh.admitting
	e.mu.Lock()
	if t.stopped || e.dead {
		e.mu.Unlock()
		sh.mu.RUnlock()
		return
	}
	start, delivered := false, false
	if admitting {
		t.fires++
		req, err := t.h.TickRequest(nil, entity.Tick{Name: t.name, Tick: t.fires, Missed: missed, Value: t.payload})
		if err == nil {
			msg := message{h: t.h, req: req}
			if t.link != nil || sh.h.cfg.Tracer.On() { // a new trace, linked to the timer's start
				msg.tr = &msgTrace{}
				if t.link != nil {
					msg.tr.link = *t.link
				}
			}
			start, err = e.pushLocked(&msg)
		}
		delivered = err == nil
		if !delivered {
			t.fires--
		}
	}
	switch {
	case t.period > 0:
		sched.Schedule(&t.Entry, t.Due()+int64(missed+1)*int64(t.period))
	case !delivered:
		sched.Schedule(&t.Entry, now+int64(timerRetry))
	default: // a one-shot timer that fired
		delete(e.timers, t.name)
		t.stopped = true
		sh.h.timerCount.Add(-1)
	}
	e.mu.Unlock()
	sh.mu.RUnlock()
	if start {
		e.start()
	}
}

// RegisterReminder implements entity.Runtime.
func (e *resident) RegisterReminder(ctx context.Context, spec entity.ReminderSpec) error {
	if err := e.shardGone(); err != nil {
		return fmt.Errorf("register reminder %q: %w", spec.Name, err)
	}
	if spec.Handler == nil || spec.Handler.TickKind() != entity.ReminderHandler || spec.Handler.Kind() != e.key.Kind {
		return fmt.Errorf("%w: reminder %q: not a reminder handler of kind %s", entity.ErrInvalidTimer, spec.Name, e.key.Kind)
	}
	sh := e.host
	return sh.h.reminders.Register(ctx, sh.id, sh.epoch, e.key, spec)
}

// CancelReminder implements entity.Runtime.
func (e *resident) CancelReminder(ctx context.Context, name string) error {
	if err := e.shardGone(); err != nil {
		return fmt.Errorf("cancel reminder %q: %w", name, err)
	}
	sh := e.host
	return sh.h.reminders.Cancel(ctx, sh.id, sh.epoch, e.key, name)
}

// Reminders implements entity.Runtime.
func (e *resident) Reminders(ctx context.Context) ([]entity.ReminderInfo, error) {
	if err := e.shardGone(); err != nil {
		return nil, fmt.Errorf("list reminders: %w", err)
	}
	sh := e.host
	return sh.h.reminders.List(ctx, sh.id, sh.epoch, e.key)
}

// shardGone says why the entity's shard is no longer hosted here, or nil.
func (e *resident) shardGone() error {
	sh := e.host
	select {
	case <-sh.done:
		return fmt.Errorf("shard %d left this runner: %w", sh.id, context.Cause(sh.ctx))
	default:
	}
	if sh.h.env.PastDetach() {
		return fmt.Errorf("shard %d: %w", sh.id, ErrDetached)
	}
	if sh.h.reminders == nil {
		return &entity.NoEntityError{Call: "a reminder call", Detail: "the runtime has no reminder service"}
	}
	return nil
}

// Fire delivers a reminder's tick req (a one-way message of tick handler
// h) to entity id of kind k without ever blocking: it reports false when
// the message did not enter the mailbox — the shard is not admitting (a
// cutover or a drain), the entity's previous instance is still releasing,
// the previous epoch's handlers still run, or the mailbox is full — and
// the caller tries again later. done is called exactly once for an
// admitted message: with true right before its handler runs (past the
// start gate: the shard still here, the detach instant not passed), with
// false if it never will. Called with true, done reports whether the
// handler may still run; false withdraws the message (the caller's set
// stopped or paused meanwhile: it did not count the tick as fired), and
// no handler runs.
func (sh *Shard) Fire(k *Kind, h *entity.Handler, id string, req any, done func(started bool) bool) bool {
	if !sh.prevDone.Load() && sh.prev.running.Load() > 0 {
		return false
	}
	key := EntityKey{Kind: k.Desc.Name(), ID: id}
	msg := message{h: h, req: req, done: done}
	if sh.h.cfg.Tracer.On() { // a new trace: a reminder's registration keeps no span context
		msg.tr = &msgTrace{}
	}
	sh.mu.RLock()
	if !sh.admitting {
		sh.mu.RUnlock()
		return false
	}
	if e := sh.entities.get(k, id); e != nil {
		err := e.push(&msg)
		sh.mu.RUnlock()
		return err == nil
	}
	sh.mu.RUnlock()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.admitting || sh.retiring[key] != nil {
		return false
	}
	if e := sh.entities.get(k, id); e != nil {
		return e.push(&msg) == nil
	}
	e := sh.newResident(k, key)
	if inst, ok := sh.warmed[key]; ok {
		e.inst = inst
		delete(sh.warmed, key)
	}
	sh.entities.set(e)
	sh.h.residents.add(e)
	sh.h.met.Activations.Add(context.Background(), 1, sh.h.met.Attrs)
	return e.push(&msg) == nil
}
