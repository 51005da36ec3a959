package entity

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"
)

// Errors of timers and reminders. Runtimes add their own (a shard that
// moved, a fenced write, an unavailable store); all are returned to the
// handler that called, never to a sender.
var (
	// ErrNoEntity: a timer, reminder or Forget call was made with a
	// context that does not belong to a handler or lifecycle hook of a
	// live entity of the kind (a context.Background(), one derived from
	// another entity's, or a handler's used after the handler returned).
	// The error returned is a *NoEntityError naming the call; it matches
	// ErrNoEntity.
	ErrNoEntity = errors.New("entity: called with a context that is not a handler's: pass the handler's ctx")
	// ErrInvalidTimer: a timer or reminder name, delay, period, schedule or
	// payload is out of bounds (see the limits below).
	ErrInvalidTimer = errors.New("entity: invalid timer or reminder")
	// ErrTooManyReminders: the entity's shard already stores the most
	// reminders its runtime allows.
	ErrTooManyReminders = errors.New("entity: too many reminders in the shard")
	// ErrNoReminder: no reminder of that name is registered for the entity.
	ErrNoReminder = errors.New("entity: no such reminder")
	// ErrNotRemembered: Forget was called for an entity whose kind has no
	// Remembered option.
	ErrNotRemembered = errors.New("entity: kind is not remembered")
)

// NoEntityError is the error of a call that needs the context of a live
// entity's handler or hook and was given another: it names the call and
// the fix, and matches ErrNoEntity (errors.Is).
type NoEntityError struct {
	// Call is the call that was made ("TimerRef.After", "Forget", ...).
	Call string
	// Detail says more when the context is a handler's but not a fitting
	// one (another kind's entity, an entity being passivated); empty for a
	// context of no entity at all.
	Detail string
}

func (e *NoEntityError) Error() string {
	msg := "entity: " + e.Call + " called with a context that is not a handler's: pass the handler's ctx"
	if e.Detail != "" {
		msg += " (" + e.Detail + ")"
	}
	return msg
}

// Is reports whether target is ErrNoEntity.
func (e *NoEntityError) Is(target error) bool { return target == ErrNoEntity }

// noEntity is the error of call made with a context of no entity.
func noEntity(call string) error { return &NoEntityError{Call: call} }

// byCall returns err, a runtime's answer to call, naming call when it is
// a *NoEntityError (the runtime names its own method, not the user's).
func byCall(call string, err error) error {
	if ne, ok := err.(*NoEntityError); ok {
		return &NoEntityError{Call: call, Detail: ne.Detail}
	}
	return err
}

// Limits of timers and reminders.
const (
	// MaxTimerName is the longest timer or reminder name, in bytes.
	MaxTimerName = 128
	// MinReminderPeriod is the shortest period of a periodic reminder
	// (Orleans: one minute). Timers have no minimum.
	MinReminderPeriod = time.Second
	// MaxReminderPayload bounds a reminder's payload once encoded by the
	// kind's codec.
	MaxReminderPayload = 4096
	// MaxReminderHorizon bounds how far in the future a reminder's first
	// fire may be, and how long its period.
	MaxReminderHorizon = 100 * 365 * 24 * time.Hour
)

// Missed says what a periodic reminder does with the ticks that were due
// while no runner could fire them (a crash, a detach, a cold start).
type Missed uint8

const (
	// FireOnce (the default) fires one tick for all the missed ones, as
	// soon as an owner can, with their count in ReminderTick.Missed.
	FireOnce Missed = iota
	// Skip drops the ticks that were due before the owner loaded the
	// reminder after an unplanned loss (crash, detach, cold start): the
	// next fire is the first tick due after that. Ticks due during a
	// planned move are never skipped.
	Skip
)

func (m Missed) String() string {
	switch m {
	case FireOnce:
		return "fire-once"
	case Skip:
		return "skip"
	}
	return fmt.Sprintf("Missed(%d)", m)
}

// Schedule says when a reminder fires.
type Schedule struct {
	// First is the due time of tick 1. Zero: now + Period (a periodic
	// reminder) — a one-shot reminder needs First.
	First time.Time
	// Period between ticks; 0 for a one-shot reminder (at First, then
	// deleted). At least MinReminderPeriod.
	Period time.Duration
	// Missed is the missed-tick policy of a periodic reminder.
	Missed Missed
}

// TimerTick is what a timer's handler receives.
type TimerTick[P any] struct {
	Name string // the timer's name
	// Tick counts the timer's fires, from 1; a periodic timer whose
	// entity was busy past several periods fires once for them, with
	// their count in Missed.
	Tick    uint64
	Missed  uint64
	Payload P
}

// ReminderTick is what a reminder's handler receives.
type ReminderTick[P any] struct {
	Name string // the reminder's name
	// Tick is the number of the tick, from 1: tick n was due at
	// First + (n-1)*Period. Handlers that must act once per tick
	// deduplicate by it (see Redelivered).
	Tick uint64
	Due  time.Time // the due time of tick Tick
	// Missed is how many ticks before Tick were not fired and are
	// represented by this one (FireOnce); 0 when every earlier tick fired.
	Missed uint64
	// Redelivered: the owner could not learn which ticks the previous
	// owner fired (it crashed, detached or lost the shard without a
	// planned move), so this tick, and the Missed ones, may already have
	// fired there. Never set after a planned move or in steady state.
	Redelivered bool
	Payload     P
}

// ReminderInfo describes one registered reminder of an entity.
type ReminderInfo struct {
	Name     string
	Method   string // the reminder handler's name in the kind
	Schedule Schedule
	// Next is the due time of the next tick to fire; zero for a one-shot
	// reminder that fired and waits to be deleted.
	Next time.Time
}

// ReminderSpec is a reminder registration as a runtime receives it.
type ReminderSpec struct {
	Name     string
	Handler  *Handler // the kind's reminder handler
	Schedule Schedule // First set (defaults applied)
	Payload  []byte   // encoded by the kind's codec
}

// Runtime is what a runtime offers the handlers and lifecycle hooks of one
// live entity through their context: its identity, its timers and its
// reminders. Runtimes implement it; entity authors use the typed helpers
// (TimerRef, ReminderRef, StopTimer, Reminders), which find it with
// RuntimeFrom.
type Runtime interface {
	// Entity returns the entity's kind name and ID.
	Entity() (kind, id string)
	// StartTimer (re)starts the in-memory timer name of the entity: h
	// receives a TimerTick after delay, then every period if period > 0.
	StartTimer(name string, h *Handler, delay, period time.Duration, payload any) error
	// StopTimer stops the timer name and reports whether it was running.
	StopTimer(name string) bool
	// RegisterReminder stores the reminder (replacing one of the same
	// name) and schedules it.
	RegisterReminder(ctx context.Context, r ReminderSpec) error
	// CancelReminder deletes the reminder name (ErrNoReminder if none).
	CancelReminder(ctx context.Context, name string) error
	// Reminders lists the entity's reminders.
	Reminders(ctx context.Context) ([]ReminderInfo, error)
	// Forget deletes the entity's remembered marker (fenced by its
	// shard's epoch): it is no longer activated without a message and
	// may be passivated again. ErrNotRemembered for a kind without the
	// Remembered option.
	Forget(ctx context.Context) error
}

type runtimeKey struct{}

// WithRuntime returns ctx carrying rt (for runtimes).
func WithRuntime(ctx context.Context, rt Runtime) context.Context {
	return context.WithValue(ctx, runtimeKey{}, rt)
}

// RuntimeFrom returns the Runtime of the entity whose handler or hook ctx
// belongs to.
func RuntimeFrom(ctx context.Context) (Runtime, bool) {
	rt, ok := ctx.Value(runtimeKey{}).(Runtime)
	return rt, ok
}

// runtimeOf returns ctx's Runtime if it belongs to an entity of kind; call
// names the caller for the error.
func runtimeOf(ctx context.Context, kind, call string) (Runtime, error) {
	rt, ok := RuntimeFrom(ctx)
	if !ok {
		return nil, noEntity(call)
	}
	if k, id := rt.Entity(); k != kind {
		return nil, &NoEntityError{Call: call, Detail: fmt.Sprintf("a %s timer or reminder used from a handler of %s %q: use one of %s's own", kind, k, id, k)}
	}
	return rt, nil
}

// Tick is the type-erased content of a timer or reminder fire, as a
// runtime builds it; the handler's TickRequest turns it into the typed
// TimerTick or ReminderTick.
type Tick struct {
	Name        string
	Tick        uint64
	Due         time.Time
	Missed      uint64
	Redelivered bool
	Value       any    // a timer's payload
	Payload     []byte // a reminder's encoded payload
}

// TickKind says whether a handler is a timer's or a reminder's.
type TickKind uint8

// Tick kinds.
const (
	NotTick TickKind = iota
	TimerHandler
	ReminderHandler
)

// TickKind reports whether the handler receives timer or reminder ticks
// (NotTick for methods and signals). Tick handlers are delivered only by
// the runtime: a sender asking or telling one gets ErrUnknownMethod.
func (h *Handler) TickKind() TickKind { return h.tick }

// TickRequest builds the request a tick handler receives (c decodes a
// reminder's payload).
func (h *Handler) TickRequest(c Codec, t Tick) (any, error) {
	if h.mkTick == nil {
		return nil, fmt.Errorf("%w: %s.%s is not a timer or reminder", ErrUnknownMethod, h.kind, h.name)
	}
	return h.mkTick(c, t)
}

// ValidTimerName reports an ErrInvalidTimer unless name is 1-MaxTimerName
// bytes of valid UTF-8 without control characters.
func ValidTimerName(name string) error {
	if name == "" || len(name) > MaxTimerName || !utf8.ValidString(name) {
		return fmt.Errorf("%w: name %q: want 1-%d bytes of UTF-8", ErrInvalidTimer, name, MaxTimerName)
	}
	for _, c := range name {
		if unicode.IsControl(c) {
			return fmt.Errorf("%w: name %q: control character", ErrInvalidTimer, name)
		}
	}
	return nil
}

// TimerRef is a timer handler of kind E with payload P, created by Timer.
// Its timers live in memory on the entity's runner: they end when the
// entity passivates, its instance is discarded (a panic) or its shard
// leaves the runner.
type TimerRef[E, P any] struct {
	kind *Kind[E]
	h    *Handler
}

// Timer registers fn as the timer handler name of kind k. Timers are
// scheduled from the entity's own handlers (After, Every) and delivered
// through its mailbox, one at a time with its other messages. A timer's
// delivery does not count as activity for idle passivation unless the
// kind was defined with TicksAreActivity. An error of fn is logged like a
// signal's.
func Timer[E, P any](k *Kind[E], name string, fn func(*E, context.Context, TimerTick[P]) error) *TimerRef[E, P] {
	if fn == nil {
		panic(fmt.Errorf("%w: kind %q: nil timer %q", ErrInvalidKind, k.name, name))
	}
	h := &Handler{
		kind: k.name, name: name, oneWay: true, tick: TimerHandler,
		invoke: func(inst any, ctx context.Context, req any) (any, error) {
			return nil, fn(inst.(*E), ctx, req.(TimerTick[P]))
		},
		decReq: func(Codec, []byte) (any, error) {
			return nil, fmt.Errorf("%w: timer %s.%s cannot be sent", ErrUnknownMethod, k.name, name)
		},
		decRsp: func(Codec, []byte) (any, error) { return nil, nil },
		mkTick: func(_ Codec, t Tick) (any, error) {
			p, ok := t.Value.(P)
			if !ok && t.Value != nil {
				return nil, fmt.Errorf("%w: timer %s.%s: payload %T", ErrBadRequest, k.name, name, t.Value)
			}
			return TimerTick[P]{Name: t.Name, Tick: t.Tick, Missed: t.Missed, Payload: p}, nil
		},
	}
	k.add(h)
	return &TimerRef[E, P]{kind: k, h: h}
}

// Name returns the timer handler's name.
func (t *TimerRef[E, P]) Name() string { return t.h.name }

// After (re)starts the entity's timer name to fire once after d (d <= 0:
// as soon as the mailbox allows). ctx must be a context of one of the
// entity's handlers or hooks (ErrNoEntity otherwise). A timer of the same
// name, of any handler, is replaced.
func (t *TimerRef[E, P]) After(ctx context.Context, name string, d time.Duration, payload P) error {
	return t.start(ctx, "TimerRef.After", name, d, 0, payload)
}

// Every (re)starts the entity's timer name to fire every period, the
// first time after period. A tick whose entity is still busy with the
// previous one past the next period fires once for both (TimerTick.Missed).
func (t *TimerRef[E, P]) Every(ctx context.Context, name string, period time.Duration, payload P) error {
	if period <= 0 {
		return fmt.Errorf("%w: timer %q: period %v, want > 0", ErrInvalidTimer, name, period)
	}
	return t.start(ctx, "TimerRef.Every", name, period, period, payload)
}

func (t *TimerRef[E, P]) start(ctx context.Context, call, name string, delay, period time.Duration, payload P) error {
	if err := ValidTimerName(name); err != nil {
		return err
	}
	rt, err := runtimeOf(ctx, t.kind.name, call)
	if err != nil {
		return err
	}
	return byCall(call, rt.StartTimer(name, t.h, max(delay, 0), period, payload))
}

// StopTimer stops the entity's timer name and reports whether it was
// running. ctx must be a context of one of the entity's handlers or hooks.
func StopTimer(ctx context.Context, name string) (bool, error) {
	rt, ok := RuntimeFrom(ctx)
	if !ok {
		return false, noEntity("StopTimer")
	}
	return rt.StopTimer(name), nil
}

// ReminderRef is a reminder handler of kind E with payload P, created by
// Reminder. Its reminders are durable: stored in the cluster's store under
// the entity's shard, fired only by the shard's owner, moved with the shard.
type ReminderRef[E, P any] struct {
	kind *Kind[E]
	h    *Handler
}

// Reminder registers fn as the reminder handler name of kind k. Reminders
// are registered from the entity's own handlers (Register) and delivered
// through its mailbox, activating the entity if it is not resident. P must
// survive the kind's codec. A reminder's delivery does not count as
// activity for idle passivation unless the kind was defined with
// TicksAreActivity. An error of fn is logged like a signal's; the tick
// counts as fired.
func Reminder[E, P any](k *Kind[E], name string, fn func(*E, context.Context, ReminderTick[P]) error) *ReminderRef[E, P] {
	if fn == nil {
		panic(fmt.Errorf("%w: kind %q: nil reminder %q", ErrInvalidKind, k.name, name))
	}
	checkTypes[P](k, name, "payload")
	dec := decoder[P]()
	h := &Handler{
		kind: k.name, name: name, oneWay: true, tick: ReminderHandler,
		invoke: func(inst any, ctx context.Context, req any) (any, error) {
			return nil, fn(inst.(*E), ctx, req.(ReminderTick[P]))
		},
		decReq: func(Codec, []byte) (any, error) {
			return nil, fmt.Errorf("%w: reminder %s.%s cannot be sent", ErrUnknownMethod, k.name, name)
		},
		decRsp: func(Codec, []byte) (any, error) { return nil, nil },
		mkTick: func(c Codec, t Tick) (any, error) {
			var p P
			if len(t.Payload) > 0 {
				v, err := dec(c, t.Payload)
				if err != nil {
					return nil, err
				}
				p = v.(P)
			}
			return ReminderTick[P]{Name: t.Name, Tick: t.Tick, Due: t.Due, Missed: t.Missed, Redelivered: t.Redelivered, Payload: p}, nil
		},
	}
	k.add(h)
	return &ReminderRef[E, P]{kind: k, h: h}
}

// Name returns the reminder handler's name.
func (r *ReminderRef[E, P]) Name() string { return r.h.name }

// Register stores the entity's reminder name with schedule s and payload p
// (replacing a reminder of the same name, of any handler) in one
// transaction fenced by the shard's epoch, and schedules it. ctx must be a
// context of one of the entity's handlers or hooks (ErrNoEntity
// otherwise); a shard that moved meanwhile is an error (the runtime's,
// matching its "shard moved" or the store's "fenced" error). Bad input is
// an ErrInvalidTimer.
func (r *ReminderRef[E, P]) Register(ctx context.Context, name string, s Schedule, p P) error {
	if err := ValidTimerName(name); err != nil {
		return err
	}
	if err := s.validate(name, time.Now()); err != nil {
		return err
	}
	if s.First.IsZero() {
		s.First = time.Now().Add(s.Period)
	}
	rt, err := runtimeOf(ctx, r.kind.name, "ReminderRef.Register")
	if err != nil {
		return err
	}
	payload, err := r.kind.opts.Codec.Marshal(p)
	if err != nil {
		return fmt.Errorf("%w: reminder %q: payload: %w", ErrInvalidTimer, name, err)
	}
	if len(payload) > MaxReminderPayload {
		return fmt.Errorf("%w: reminder %q: payload of %d bytes, at most %d", ErrInvalidTimer, name, len(payload), MaxReminderPayload)
	}
	return rt.RegisterReminder(ctx, ReminderSpec{Name: name, Handler: r.h, Schedule: s, Payload: payload})
}

// validate checks a schedule's bounds at now.
func (s Schedule) validate(name string, now time.Time) error {
	switch {
	case s.Period < 0 || (s.Period > 0 && s.Period < MinReminderPeriod):
		return fmt.Errorf("%w: reminder %q: period %v, want 0 (one-shot) or at least %v", ErrInvalidTimer, name, s.Period, MinReminderPeriod)
	case s.Period > MaxReminderHorizon:
		return fmt.Errorf("%w: reminder %q: period %v longer than %v", ErrInvalidTimer, name, s.Period, MaxReminderHorizon)
	case s.Period == 0 && s.First.IsZero():
		return fmt.Errorf("%w: reminder %q: a one-shot reminder needs Schedule.First", ErrInvalidTimer, name)
	case !s.First.IsZero() && (s.First.Sub(now) > MaxReminderHorizon || now.Sub(s.First) > MaxReminderHorizon):
		return fmt.Errorf("%w: reminder %q: first fire %v more than %v away", ErrInvalidTimer, name, s.First, MaxReminderHorizon)
	case s.Missed > Skip:
		return fmt.Errorf("%w: reminder %q: missed-tick policy %v", ErrInvalidTimer, name, s.Missed)
	}
	return nil
}

// Cancel deletes the entity's reminder name (fenced like Register); it
// returns an error matching ErrNoReminder when there is none.
func (r *ReminderRef[E, P]) Cancel(ctx context.Context, name string) error {
	return cancelReminder(ctx, "ReminderRef.Cancel", name)
}

// CancelReminder deletes the entity's reminder name, of any handler
// (fenced like Register); ErrNoReminder when there is none.
func CancelReminder(ctx context.Context, name string) error {
	return cancelReminder(ctx, "CancelReminder", name)
}

func cancelReminder(ctx context.Context, call, name string) error {
	rt, ok := RuntimeFrom(ctx)
	if !ok {
		return noEntity(call)
	}
	return rt.CancelReminder(ctx, name)
}

// Reminders lists the reminders of the entity whose handler or hook ctx
// belongs to, by name.
func Reminders(ctx context.Context) ([]ReminderInfo, error) {
	rt, ok := RuntimeFrom(ctx)
	if !ok {
		return nil, noEntity("Reminders")
	}
	return rt.Reminders(ctx)
}

// Forget ends the remembered life of the entity whose handler or hook ctx
// belongs to (a kind with the Remembered option): its marker is deleted
// from the store, fenced by the shard's epoch, so its shard's owners stop
// activating it without a message, and it may be passivated like any
// entity. A later activation of the entity remembers it again. It fails
// with ErrNotRemembered for a kind without the option, ErrNoEntity outside
// an entity, and the store's error (nothing changed) when the write fails.
func Forget(ctx context.Context) error {
	rt, ok := RuntimeFrom(ctx)
	if !ok {
		return noEntity("Forget")
	}
	return byCall("Forget", rt.Forget(ctx))
}
