package hosting

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/tracing"
)

// lingerSpins is how many times a hot entity's goroutine yields before
// exiting on an empty mailbox: a sender on another core usually refills it
// within that time, so a hot entity keeps its goroutine while an idle one
// has none. An entity is hot when its goroutine restarts within hotWindow
// of its last exit; new and occasional entities exit at once, so thousands
// of them never spin.
const (
	lingerSpins = 8
	hotWindow   = 100 * time.Microsecond
)

// clockBase makes monotonic nanosecond readings: time.Since(clockBase).
var clockBase = time.Now()

// resident is one resident entity instance. It has a goroutine only while its
// mailbox is non-empty (plus a short linger).
//
// Its fields are grouped by who writes them: a sender pushing on one core
// must not invalidate, per message, the cache lines the entity's goroutine
// reads on the other (its key, kind, shard, context and instance), nor the
// other way round. A resident is 256 bytes, so it is allocated 256-aligned
// (its size class): the first 128 bytes are the entity's, the last 128
// the mailbox's, each on cache lines of their own.
type resident struct {
	// Set at creation, read by both sides.
	key  EntityKey
	kind *Kind
	host *Shard
	ctx  context.Context // the shard's, carrying the entity's runtime (this)

	// Owned by the entity's goroutine (or by the retiring goroutine once
	// dead and idle).
	inst      any
	processed uint64
	activated bool
	restart   bool

	// LRU links and last use (since clockBase), under Host.residents.mu.
	listed bool
	// forgotten: a remembered entity that called Forget (passivated like
	// any entity until activated again).
	forgotten  atomic.Bool
	prev, next *resident
	lastUsed   time.Duration

	// Owned by the entity's goroutine, like inst (here to keep the
	// fields above packed): the instance's checkpoint writes, ordered
	// (checkpoints.go). The mailbox starts at byte 128.
	cps *checkpoints

	// The mailbox, written by senders, under mu. nonEmpty is also read
	// without mu (the goroutine's linger); a sender sets it only when the
	// mailbox goes from empty to non-empty.
	mu       sync.Mutex
	nonEmpty atomic.Bool
	limit    int32 // the kind's mailbox bound (read per push: a copy)
	box      mailbox
	spare    []message // a drained head, given back by the goroutine
	running  bool
	dead     bool          // retired: pushes fail with errRetired
	hot      bool          // restarted within hotWindow: linger before exiting
	n        int32         // messages in box
	lastExit time.Duration // since clockBase
	timers   map[string]*timer
	_        [24]byte // 256 bytes in all
}

// push appends msg and starts the goroutine if needed. Callers hold
// host.mu (read or write). errRetired is a safety net: an instance is
// marked dead only after it left host.entities or while host admission is
// off, and enqueue checks both under host.mu before pushing.
func (e *resident) push(msg *message) error {
	e.mu.Lock()
	start, err := e.pushLocked(msg)
	e.mu.Unlock()
	if start {
		e.start()
	}
	return err
}

// pushHere is push for a sender that runs the entity's loop itself
// (run(true)) when the push would start the goroutine: then it reports
// here, counted as running, instead of starting it.
func (e *resident) pushHere(msg *message) (here bool, err error) {
	e.mu.Lock()
	here, err = e.pushLocked(msg)
	e.mu.Unlock()
	if here {
		e.host.running.Add(1)
	}
	return here, err
}

// pushLocked appends msg under e.mu and reports whether the caller must
// start the goroutine (start, after unlocking).
func (e *resident) pushLocked(msg *message) (bool, error) {
	if e.dead {
		return false, errRetired
	}
	if e.n >= e.limit {
		e.kind.stats.rejected.add(e.host.id)
		met := e.host.h.met
		met.MailboxRejections.Add(context.Background(), 1, met.Attrs)
		return false, fmt.Errorf("%w: %s %q (%d queued)", entity.ErrMailboxFull, e.key.Kind, e.key.ID, e.kind.Opts.Mailbox)
	}
	e.box.push(msg)
	if e.n++; e.n == 1 {
		e.nonEmpty.Store(true)
	}
	start := !e.running
	if start {
		e.running = true
		e.hot = e.lastExit > 0 && time.Since(clockBase)-e.lastExit < hotWindow
	}
	return start, nil
}

// start runs the entity's goroutine (pushLocked said so).
func (e *resident) start() {
	e.host.running.Add(1)
	go e.run(false)
}

// run drains the mailbox in batches, then exits. The entity counts as used
// (idle passivation, the resident cap's LRU) when a message other than a
// timer or reminder tick ran, or any message of a kind whose ticks are
// activity. With here set, run is called by the sender whose push found
// the entity idle (pushHere), on its own goroutine: it runs one batch —
// its message first — and then exits at once, or hands what arrived
// meanwhile to the entity's goroutine, still counted as running.
func (e *resident) run(here bool) {
	var batch mailbox // the last batch processed, its head handed back as spare
	active, ran := false, false
	for {
		e.mu.Lock()
		if batch.head != nil {
			e.spare, batch.head = batch.head[:0], nil
		}
		if here && ran && e.n > 0 {
			e.mu.Unlock()
			if active {
				e.host.h.residents.touch(e)
			}
			go e.run(false)
			return
		}
		if e.n == 0 {
			hot := e.hot && !here
			e.mu.Unlock()
			if hot && e.linger() {
				continue
			}
			e.mu.Lock()
			if e.n > 0 {
				e.mu.Unlock()
				continue
			}
			e.running = false
			e.lastExit = time.Since(clockBase)
			e.mu.Unlock()
			if active {
				e.host.h.residents.touch(e)
			}
			e.host.stopped(false)
			return
		}
		batch, ran = e.box, true
		e.box = mailbox{head: e.spare[:0]}
		e.spare = nil
		e.n = 0
		e.nonEmpty.Store(false)
		e.mu.Unlock()
		batch.each(func(m *message) {
			if !active && m.h != nil && (m.h.TickKind() == entity.NotTick || e.kind.Opts.TicksAreActivity) {
				active = true
			}
			e.process(m)
		})
	}
}

// linger yields a few times and reports whether messages arrived. It
// polls nonEmpty, not the mailbox under mu: a sender then never waits for
// the lock held by an idle goroutine.
func (e *resident) linger() bool {
	for range lingerSpins {
		runtime.Gosched()
		if e.nonEmpty.Load() {
			return true
		}
	}
	return false
}

// startGate says why no handler of the shard may start now, or nil: the
// shard left (its host is done) or the detach instant passed (a long
// pause?) before the watchdog could act — never start a handler after it.
// It reads the clock for every message: a reading taken earlier (the end
// check of the handler before) would widen the window in which a pause of
// the process lets a handler start after the detach instant.
func (e *resident) startGate() error {
	sh := e.host
	select {
	case <-sh.done:
		return context.Cause(sh.ctx)
	default:
	}
	if sh.h.env.PastDetach() {
		return ErrDetached
	}
	return nil
}

// process runs one message, unless the shard is gone; a traced message
// runs in its handler's span (trace.go).
func (e *resident) process(m *message) {
	if m.tr != nil {
		e.startSpan(m)
		m.endSpan(e.processOne(m))
		return
	}
	e.processOne(m)
}

// processOne is process; it returns the message's outcome (nil when its
// handler succeeded, or its activation without a message did).
func (e *resident) processOne(m *message) error {
	sh := e.host
	if why := e.startGate(); why != nil {
		return e.fail(m, &UndeliveredError{Shard: sh.id, Cause: why}, true)
	}
	if m.reply != nil && sh.handingOff.Load() {
		// The shard is being handed to a ready owner: an ask not started
		// yet goes back to its sender, which retries there. (A signal's
		// sender has its answer already: it runs here.)
		return e.fail(m, &UndeliveredError{Shard: sh.id, Cause: ErrShardMoved}, true)
	}
	if m.ctx != nil && m.ctx.Err() != nil { // the asker gave up before it ran
		return e.fail(m, &UndeliveredError{Shard: sh.id, Cause: ContextError(m.ctx)}, true)
	}
	if !e.activated {
		reason := sh.reason
		if m.h == nil {
			reason = entity.ActivateRemembered
		}
		actx, span := e.activateSpan(m, reason)
		err := e.activate(actx, reason)
		if span != nil {
			tracing.End(span, err, ErrorType)
		}
		if err != nil {
			if why := e.startGate(); why != nil {
				// The shard left this runner while it activated (the
				// detach, the move or the shutdown ended the activation's
				// context): no handler ran, the sender asks again where
				// the shard is now.
				return e.fail(m, &UndeliveredError{Shard: sh.id, Cause: why}, true)
			}
			return e.fail(m, err, false)
		}
		// Activation may take a while (Restore reads the store; the
		// process may be paused): check again, right before the handler.
		if why := e.startGate(); why != nil {
			return e.fail(m, &UndeliveredError{Shard: sh.id, Cause: why}, true)
		}
	}
	if m.done != nil && !m.done(true) { // a reminder tick: fired from here on; an activation: done
		// The tick's reminder set stopped or paused while this message
		// waited for it (done takes the set's lock, which the shard's
		// loss or cutover holds while it stops the set): the set did not
		// count the tick as fired, so it fires where the shard goes next
		// and must not run here, after the shard left.
		met := sh.h.met
		met.Dropped.Add(context.Background(), 1, met.Attrs, WithReason(DropShardLeft))
		return nil
	}
	if m.h == nil { // an activation without a message (Activate)
		return nil
	}
	v, err := e.handle(m)
	if m.reply != nil {
		if m.tr != nil {
			m.endSpan(err) // before the answer: the asker's span ends after it
		}
		m.reply.ch <- Result{V: v, Err: err, Epoch: sh.epoch} // 1-buffered: never blocks
		return err
	}
	if err != nil {
		sh.h.signalFailed(m.logContext(), e.key.Kind, m.h.Name(), sh.id, err) // WARN, rate-limited
	}
	return err
}

// handle runs m's handler and withholds its result if the shard left this
// runner while it ran (for an ask, also if the detach instant passed: a
// signal's end check reads no clock, see lostWhileRunning).
func (e *resident) handle(m *message) (v any, err error) {
	sh, met := e.host, e.host.h.met
	e.processed++
	e.kind.stats.handled.add(sh.id)
	var start time.Time
	sample := e.processed%64 == 1
	if sample {
		start = time.Now()
	}
	v, err = e.invoke(m)
	if sample {
		met.HandlerDuration.Record(context.Background(), time.Since(start).Seconds(), met.Attrs)
	}
	why, cause := sh.lostWhileRunning(m.reply != nil)
	if why == "" {
		return v, err
	}
	// The handler finished after its shard left this runner (a pause
	// outlived the detach instant, or the shard was dropped): another
	// runner may already serve the entity, so its result is never
	// acknowledged and the instance, which may hold that result, is
	// discarded.
	e.discard()
	met.Dropped.Add(context.Background(), 1, met.Attrs, WithReason(DropStaleResult))
	sh.h.log.WarnContext(m.logContext(), "handler finished after its shard left this runner; result withheld, instance discarded",
		"kind", e.key.Kind, "method", m.h.Name(), "shard", sh.id, "epoch", sh.epoch, "why", why)
	return nil, &StaleResultError{Shard: sh.id, Runner: sh.h.cfg.RunnerID, Epoch: sh.epoch, Reason: why, Cause: cause}
}

// fail answers m with err, and returns it; undelivered says no handler
// ran it.
func (e *resident) fail(m *message, err error, undelivered bool) error {
	if m.reply != nil {
		if m.tr != nil {
			m.endSpan(err) // before the answer, as for a handler's result
		}
		m.reply.ch <- Result{Err: err, Undelivered: undelivered}
		return err
	}
	if m.done != nil {
		m.done(false)
	}
	if m.h == nil { // an activation: the Remembrance retries it
		if !undelivered {
			e.host.h.log.WarnContext(m.logContext(), "remembered entity failed to activate; retrying", "kind", e.key.Kind, "shard", e.host.id, "err", err)
		}
		return err
	}
	met := e.host.h.met
	met.Dropped.Add(context.Background(), 1, met.Attrs, WithReason(DropShardLeft))
	return err
}

// invoke calls the handler, turning a panic into a *entity.PanicError and
// discarding the instance.
func (e *resident) invoke(m *message) (v any, err error) {
	defer func() {
		if p := recover(); p != nil {
			sh := e.host
			err = &entity.PanicError{Kind: e.key.Kind, Method: m.h.Name(), Entity: e.key.ID, Value: fmt.Sprint(p), Stack: string(debug.Stack())}
			e.discard()
			sh.h.met.Panics.Add(context.Background(), 1, sh.h.met.Attrs)
			sh.h.log.ErrorContext(m.logContext(), "entity handler panicked; instance discarded", "kind", e.key.Kind, "method", m.h.Name(), "shard", sh.id, "panic", p)
		}
	}()
	ctx, bound := e.handlerContext(m)
	if bound != nil {
		defer bound.Cancel()
	}
	return m.h.Invoke(e.inst, ctx, m.req)
}

// activate creates the instance and calls its Activate hook with ctx (the
// entity's, carrying the activation's span when traced).
func (e *resident) activate(ctx context.Context, reason entity.ActivateReason) error {
	sh := e.host
	if e.restart {
		reason = entity.ActivateRestart
	}
	inst := e.inst
	if inst == nil {
		inst = e.kind.Desc.New(e.key.ID)
	}
	if a, ok := inst.(entity.Activator); ok {
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = &entity.PanicError{Kind: e.key.Kind, Method: "Activate", Entity: e.key.ID, Value: fmt.Sprint(p), Stack: string(debug.Stack())}
				}
			}()
			return a.Activate(ctx, entity.ActivateInfo{
				Entity: e.key.ID, Shard: sh.id, Epoch: int64(sh.epoch), Reason: reason,
				Restore: sh.checkpointsOf(e).restore, Checkpoint: sh.checkpointsOf(e).write,
				DeleteCheckpoint: sh.checkpointsOf(e).delete,
			})
		}()
		if err != nil {
			e.inst = nil
			return fmt.Errorf("runner: activate %s %q: %w", e.key.Kind, e.key.ID, err)
		}
	}
	e.inst, e.activated, e.restart = inst, true, false
	e.remembered()
	return nil
}

// discard drops the instance (a panic, a withheld result): the next
// message activates a new one. Its timers end with it.
func (e *resident) discard() {
	e.inst, e.activated, e.restart = nil, false, true
	e.stopTimers()
	if sh := e.host; e.pinned() && sh.h.remembrance != nil {
		sh.h.remembrance.Failed(sh.id, sh.epoch, e.key)
	}
}

func (e *resident) idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.running && e.n == 0 && !e.dead
}
