package hosting

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport/lazydeadline"
)

// cacheLinePad keeps the fields before it and after it on different cache
// lines.
type cacheLinePad [64]byte

// Shard hosts the entities of one owned shard at one epoch.
type Shard struct {
	h      *Host
	id     sharding.ShardID
	epoch  storage.Epoch
	ctx    context.Context
	done   <-chan struct{}
	reason entity.ActivateReason
	// replyWritten is ReplyWritten, made once (ReplyWrittenFunc).
	replyWritten func()

	// mu is written by every sender (RLock): on cache lines of its own,
	// away from the fields above, which every handler's checks read.
	_         cacheLinePad
	mu        sync.RWMutex
	entities  entityTable
	retiring  map[EntityKey]chan struct{} // closed when the retired instance's Release returned (nil: none yet)
	admitting bool
	// open is admitting, for senders through a Target, which read it
	// under their entity's lock (target.go); written with admitting.
	open atomic.Bool

	// warmed holds instances warmed during the inbound handoff, used
	// instead of new ones at first activation (then forgotten).
	warmed map[EntityKey]any
	// cutover is non-nil while the shard is being handed off: senders
	// wait on it (at most CutoverWaiters of them) instead of failing; it
	// is closed when the handoff ends either way. movedTo names the new
	// owner once known.
	cutover        chan struct{}
	cutoverWaiters int
	movedTo        string

	// prev is the shard's previous host on this runner (an earlier epoch):
	// its handlers that ignored cancellation must finish before this host
	// runs any, or one entity could run twice at once here.
	prev     *Shard
	prevDone atomic.Bool
	created  time.Time

	slots []*workerSlot // the shard's workers (workers.go), under mu
	_     cacheLinePad

	running  atomic.Int64 // entities and workers with a goroutine
	workers  atomic.Int64 // of which workers
	replying atomic.Int64 // admitted remote asks whose answer is not written yet
	// interrupted: entities busy when the last drain ended (no Release).
	interrupted atomic.Int64
	draining    atomic.Bool
	// handingOff: a handoff to a ready new owner began (BeginCutover) and
	// did not fail (Reopen): asks not started yet go back to their senders.
	handingOff atomic.Bool
	// actx is the attachment the shard was installed in; lockWaits is set
	// when a plain release ends the hosting but keeps the lock until the
	// handlers still running return (while actx lives).
	actx      context.Context
	lockWaits atomic.Bool
	idle      chan struct{} // 1-buffered: running reached 0 while draining
}

// ShardSpec describes a shard to host.
type ShardSpec struct {
	ID    sharding.ShardID
	Epoch storage.Epoch
	// Ctx is the shard's context: cancelled, with the cause, when its
	// ownership ends. Handlers run under it.
	Ctx context.Context
	// Attachment is the context of the runner's attachment the shard was
	// installed in.
	Attachment context.Context
	// Prev is the shard's previous host on this runner, or nil.
	Prev *Shard
	// Reason is the ActivateReason of the shard's first activations.
	Reason entity.ActivateReason
	// Warmed are instances warmed during an inbound handoff.
	Warmed map[EntityKey]any
}

// NewShard returns a host for s; Install makes it found by messages.
func (h *Host) NewShard(s ShardSpec) *Shard {
	sh := &Shard{
		h: h, id: s.ID, epoch: s.Epoch, ctx: s.Ctx, done: s.Ctx.Done(), reason: s.Reason, actx: s.Attachment,
		warmed: s.Warmed, admitting: true, idle: make(chan struct{}, 1), created: time.Now(),
	}
	sh.open.Store(true)
	sh.replyWritten = sh.ReplyWritten
	if s.Prev != nil && s.Prev.running.Load() > 0 {
		sh.prev = s.Prev
	} else {
		sh.prevDone.Store(true)
	}
	return sh
}

// stopped ends the count of an entity's (or a worker's) goroutine, and
// wakes a drain waiting for the handlers (running down to the workers) or
// for everything (running down to 0).
func (sh *Shard) stopped(worker bool) {
	w := sh.workers.Load()
	if worker {
		w = sh.workers.Add(-1)
	}
	if n := sh.running.Add(-1); (n == 0 || n == w) && sh.draining.Load() {
		signal(sh.idle)
	}
}

// Running returns the number of the shard's entities with a goroutine.
func (sh *Shard) Running() int64 { return sh.running.Load() }

// Interrupted returns how many entities were busy when the last drain
// ended (they got no Release hook).
func (sh *Shard) Interrupted() int { return int(sh.interrupted.Load()) }

// Idle receives when the running count reaches 0 during a drain.
func (sh *Shard) Idle() <-chan struct{} { return sh.idle }

// KeepLock says the shard's hosting ends but its lock is kept until the
// handlers still running return (while the attachment lives): their
// results stay acknowledged.
func (sh *Shard) KeepLock() { sh.lockWaits.Store(true) }

// waitPrev waits, bounded by DrainTimeout from this host's creation, until
// the previous host has no running handler.
func (sh *Shard) waitPrev(ctx context.Context) error {
	deadline := sh.created.Add(sh.h.cfg.DrainTimeout)
	for sh.prev.running.Load() > 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("runner: shard %d: waiting for the previous epoch's handlers: %w", sh.id, context.Cause(ctx))
		case <-sh.done:
			return &UndeliveredError{Shard: sh.id, Cause: context.Cause(sh.ctx)}
		case <-time.After(time.Millisecond):
		}
	}
	if sh.prev.running.Load() > 0 {
		sh.h.log.Warn("handlers of the shard's previous epoch still run; admitting anyway", "shard", sh.id)
	}
	sh.prevDone.Store(true)
	return nil
}

// Result is the outcome of one delivery.
type Result struct {
	V           any
	Err         error
	Undelivered bool          // the runtime failed it before any handler ran
	Epoch       storage.Epoch // the epoch the handler ran under (0: none ran)
	Admitted    bool          // it entered a mailbox
}

// waiter carries one ask's response. Waiters are pooled per Host (a
// channel must not outlive the synctest bubble of the runner that made it).
type waiter struct{ ch chan Result }

type message struct {
	h     *entity.Handler
	req   any
	reply *waiter         // nil for a signal
	ctx   context.Context // the asker's; an ask whose ctx ended is not run
	// done, for a reminder tick or an activation, is called once: with
	// true right before its handler runs, with false if it never will.
	// Called with true, it reports whether the handler may still run: a
	// tick whose reminder set stopped or paused while the message waited
	// (its shard is leaving) is withdrawn, and runs nowhere here.
	done func(started bool) bool
	tr   *msgTrace // nil when tracing is off (trace.go)
}

// Deliver enqueues a message for entity id of kind k and waits for the
// response unless oneWay. Result.Undelivered is set when the message
// certainly did not reach a handler (safe to retry); Result.Epoch is the
// epoch a handler ran under. With remote set, an admitted ask counts in
// the shard's replies until the transport reports its answer written
// (ReplyWritten): drains wait for it. With traced set (tracing is on:
// the caller tested Config.Tracer.On) the handler runs in a span
// (trace.go).
func (sh *Shard) Deliver(ctx context.Context, k *Kind, h *entity.Handler, id string, req any, oneWay, remote, traced bool) Result {
	if h.TickKind() != entity.NotTick {
		// Timer and reminder handlers are the runtime's to call.
		return Result{Err: fmt.Errorf("%w: %s.%s is a timer or reminder handler", entity.ErrUnknownMethod, k.Desc.Name(), h.Name()), Undelivered: true}
	}
	msg := message{h: h, req: req}
	if traced {
		msg.tr = traceOf(ctx, oneWay)
	}
	if !oneWay {
		msg.reply, msg.ctx = sh.h.waiters.Get().(*waiter), ctx
	}
	here, err := sh.enqueue(ctx, k, EntityKey{Kind: k.name, ID: id}, &msg, remote && !oneWay, remote)
	if err != nil {
		if msg.reply != nil {
			sh.h.waiters.Put(msg.reply)
		}
		return Result{Err: err, Undelivered: true}
	}
	if oneWay {
		return Result{Admitted: true}
	}
	if here != nil {
		// The entity was idle: this goroutine (the transport's) runs the
		// batch its ask heads, rather than wake a goroutine for it and
		// wait for the answer. The answer is in when run returns.
		here.run(true)
		res := <-msg.reply.ch
		sh.h.waiters.Put(msg.reply)
		res.Admitted = true
		return res
	}
	return sh.await(ctx, k, id, &msg)
}

// await returns the answer to msg, an ask admitted to entity id of kind
// k: the handler's result or, if ctx ends first, ErrMaybeDelivered.
func (sh *Shard) await(ctx context.Context, k *Kind, id string, msg *message) Result {
	done := ctx.Done()
	if done == nil { // a context that never ends: no select
		res := <-msg.reply.ch
		sh.h.waiters.Put(msg.reply)
		res.Admitted = true
		return res
	}
	select {
	case res := <-msg.reply.ch:
		sh.h.waiters.Put(msg.reply)
		res.Admitted = true
		return res
	case <-done:
		// The handler may still run: at most once. The waiter is
		// abandoned to the entity, which writes into its buffer.
		return Result{Admitted: true, Err: fmt.Errorf("runner: ask %s %q (%w): %w", k.Desc.Name(), id, ErrMaybeDelivered, context.Cause(ctx))}
	}
}

// ReplyWrittenFunc returns ReplyWritten as a func value made once per
// shard: handed to the transport with every answer, it costs no
// allocation per answer.
func (sh *Shard) ReplyWrittenFunc() func() { return sh.replyWritten }

// ReplyWritten ends the count of a remote ask's answer (see Deliver).
func (sh *Shard) ReplyWritten() {
	if sh.replying.Add(-1) == 0 && sh.draining.Load() {
		signal(sh.idle)
	}
}

// enqueue adds msg to the entity's mailbox, creating the entity if needed.
// Admission is checked under sh.mu together with the enqueue, so once a
// drain has stopped admission no message can slip in; a counted message
// (a remote ask) enters sh.replying at admission, under sh.mu too, and
// when it found its entity idle enqueue returns the entity (here) for
// the caller to run (run(true)) instead of starting its goroutine. With
// clone set (a remote message: its ID shares the memory of the transport
// message it came in), an entity created keeps a copy of key.ID.
func (sh *Shard) enqueue(ctx context.Context, k *Kind, key EntityKey, msg *message, counted, clone bool) (here *resident, err error) {
	if ctx.Err() != nil { // admission checks the context first
		return nil, &UndeliveredError{Shard: sh.id, Cause: ContextError(ctx)}
	}
	if !sh.prevDone.Load() {
		if err := sh.waitPrev(ctx); err != nil {
			return nil, err
		}
	}
	for {
		sh.mu.RLock()
		if !sh.admitting {
			sh.mu.RUnlock()
			if err := sh.waitCutover(ctx, msg.tr != nil); err != nil {
				return nil, err
			}
			continue
		}
		if e := sh.entities.get(k, key.ID); e != nil {
			here, err := sh.admit(e, msg, counted)
			sh.mu.RUnlock()
			return here, err
		}
		sh.mu.RUnlock()

		sh.mu.Lock()
		if !sh.admitting {
			sh.mu.Unlock()
			continue
		}
		if e := sh.entities.get(k, key.ID); e != nil {
			here, err := sh.admit(e, msg, counted)
			sh.mu.Unlock()
			return here, err
		}
		if ch := sh.retiring[key]; ch != nil {
			// The previous instance is running its Release hook: the new
			// one must not activate before that finished.
			sh.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, fmt.Errorf("runner: waiting for %s %q to passivate: %w", key.Kind, key.ID, context.Cause(ctx))
			}
		}
		if clone {
			key.ID = strings.Clone(key.ID)
		}
		e := sh.newResident(k, key)
		if inst, ok := sh.warmed[key]; ok {
			e.inst = inst // warmed during the handoff; Activate still runs
			delete(sh.warmed, key)
		}
		sh.entities.set(e)
		// Listed under sh.mu, so a concurrent Close cannot miss it.
		sh.h.residents.add(e)
		here, err := sh.admit(e, msg, counted)
		sh.mu.Unlock()
		sh.h.met.Activations.Add(context.Background(), 1, sh.h.met.Attrs)
		return here, err
	}
}

// admit pushes msg to e (under sh.mu) and, when counted, counts its
// answer in sh.replying; a counted message that found e idle returns e
// for its sender to run (here).
func (sh *Shard) admit(e *resident, msg *message, counted bool) (here *resident, err error) {
	if !counted {
		return nil, e.push(msg)
	}
	sh.replying.Add(1) // before the push: a drain never sees it run uncounted
	run, err := e.pushHere(msg)
	if err != nil {
		sh.ReplyWritten()
		return nil, err
	}
	if run {
		return e, nil
	}
	return nil, nil
}

// lostWhileRunning says why a handler that just returned must not have its
// result acknowledged, with the cause, or "" while no other runner can own
// the shard yet: the detach instant has not passed (the check that gates
// the start of a handler, made again at the end of an ask's: clock says
// so) and the shard is still hosted here at the handler's epoch — or it is
// being released plainly and its lock, still ours, waits for this handler
// (KeepLock). A signal's end check (clock false) reads no clock: its
// result goes to no one, and the next handler's start gate reads it.
func (sh *Shard) lostWhileRunning(clock bool) (string, error) {
	if clock && sh.h.env.PastDetach() {
		return "the detach instant passed while the handler ran", ErrDetached
	}
	select {
	case <-sh.done:
		if sh.lockWaits.Load() && sh.actx.Err() == nil {
			return "", nil
		}
		cause := context.Cause(sh.ctx)
		return fmt.Sprintf("the shard left this runner while the handler ran (%v)", cause), cause
	default:
		return "", nil
	}
}

// newResident returns a resident entity of the shard (not listed yet).
func (sh *Shard) newResident(k *Kind, key EntityKey) *resident {
	e := &resident{key: key, kind: k, host: sh, limit: int32(min(k.Opts.Mailbox, math.MaxInt32))}
	e.ctx = entity.WithRuntime(sh.ctx, e) // once per resident, not per message
	return e
}

// handlerContext returns the context a handler runs m under: the entity's
// (the shard's context — its causes, ErrDetached, ErrShardMoved,
// ErrShutdown, and its ShardInfo — carrying the entity's runtime: its
// timers and reminders) bounded by the asker's deadline, if it has one,
// with cause ErrCallerDeadline. A remote asker's deadline arrives with its
// request (the frame's timeout); signals carry none. A traced message's
// context carries its handler's span (trace.go). The bound costs no timer
// unless the handler waits on it (lazydeadline): the asker's context
// already times the deadline. The returned bound, cancelled when the
// handler returns, is nil when the entity's context is used as it is.
func (e *resident) handlerContext(m *message) (context.Context, *lazydeadline.Context) {
	ctx := e.ctx
	if m.tr != nil && m.tr.span != nil {
		ctx = e.traceContext(ctx, m, m.tr.span)
	}
	if m.ctx == nil {
		return ctx, nil
	}
	dl, ok := m.ctx.Deadline()
	if !ok {
		return ctx, nil
	}
	c := lazydeadline.WithDeadlineCause(ctx, dl, ErrCallerDeadline)
	return c, c
}

// ID returns the shard's ID.
func (sh *Shard) ID() sharding.ShardID { return sh.id }

// Epoch returns the epoch the shard is hosted at.
func (sh *Shard) Epoch() storage.Epoch { return sh.epoch }
