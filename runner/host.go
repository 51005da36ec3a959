package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// UndeliveredError reports a message that never reached a handler: it was
// queued for a shard that left this runner before the message ran. Like
// NotOwnerError it is safe to retry.
type UndeliveredError struct {
	Shard sharding.ShardID
	// Cause is ErrDetached, ErrShardMoved or ErrShutdown, or the context's
	// error when it ended before the message was admitted or run.
	Cause error
}

func (e *UndeliveredError) Error() string {
	return fmt.Sprintf("runner: message for shard %d not delivered: %v", e.Shard, e.Cause)
}

// Unwrap returns the cause.
func (e *UndeliveredError) Unwrap() error { return e.Cause }

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

// kindRT is a kind registered on this runner.
type kindRT struct {
	desc  entity.Descriptor
	opts  entity.Options
	stats kindStats // read by the debug handler
	warms bool      // its instances implement entity.Warmer (assumed when the kind cannot say)
}

// kindWarms reports whether d's instances can warm (a Descriptor that does
// not say is assumed to).
func kindWarms(d entity.Descriptor) bool {
	w, ok := d.(interface{ Warms() bool })
	return !ok || w.Warms()
}

type entityKey struct{ kind, id string }

// Register makes kinds available on this runner. Every runner of a cluster
// should register the same kinds. Registering a different kind under a name
// already taken is an error; registering the same kind twice is a no-op.
func (r *Runner) Register(kinds ...entity.Descriptor) error {
	r.kindsMu.Lock()
	defer r.kindsMu.Unlock()
	cur := r.kinds.Load()
	next := make(map[string]*kindRT, len(*cur)+len(kinds))
	for name, k := range *cur {
		next[name] = k
	}
	for _, d := range kinds {
		if d == nil || d.Name() == "" {
			return fmt.Errorf("%w: nil or unnamed kind", entity.ErrInvalidKind)
		}
		if old, ok := next[d.Name()]; ok {
			if old.desc != d {
				return fmt.Errorf("%w: kind %q registered twice with different definitions", entity.ErrInvalidKind, d.Name())
			}
			continue
		}
		next[d.Name()] = &kindRT{desc: d, opts: d.Options(), warms: kindWarms(d)}
	}
	r.kinds.Store(&next)
	return nil
}

func (r *Runner) kind(name string) *kindRT { return (*r.kinds.Load())[name] }

// notHere is the error for a shard not hosted here.
func (r *Runner) notHere(id sharding.ShardID) error {
	r.mu.Lock()
	detached := r.phase == phaseDetached
	r.mu.Unlock()
	if detached {
		return &UndeliveredError{Shard: id, Cause: ErrDetached}
	}
	hint, _ := r.OwnerOf(id)
	if hint == r.cfg.ID {
		hint = "" // our own stale lock (releasing or detached): no useful hint
	}
	return &NotOwnerError{Shard: id, OwnerHint: hint}
}

// shardHost hosts the entities of one owned shard at one epoch.
type shardHost struct {
	r      *Runner
	id     sharding.ShardID
	epoch  storage.Epoch
	ctx    context.Context
	done   <-chan struct{}
	reason entity.ActivateReason

	mu        sync.RWMutex
	entities  map[entityKey]*resident
	retiring  map[entityKey]chan struct{} // closed when the retired instance's Release returned
	admitting bool

	// warmed holds instances warmed during the inbound handoff, used
	// instead of new ones at first activation (then forgotten).
	warmed map[entityKey]any
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
	prev     *shardHost
	prevDone atomic.Bool
	created  time.Time

	running  atomic.Int64 // entities with a goroutine
	replying atomic.Int64 // admitted remote asks whose answer is not written yet
	// interrupted: entities busy when the last drain ended (no Release).
	interrupted atomic.Int64
	draining    atomic.Bool
	// handingOff: a handoff to a ready new owner began (beginCutover) and
	// did not fail (reopen): asks not started yet go back to their senders.
	handingOff atomic.Bool
	// actx is the attachment the shard was installed in; lockWaits is set
	// when a plain release ends the hosting but keeps the lock until the
	// handlers still running return (while actx lives).
	actx      context.Context
	lockWaits atomic.Bool
	idle      chan struct{} // 1-buffered: running reached 0 while draining
}

func newShardHost(r *Runner, s *shard, prev *shardHost) *shardHost {
	sh := &shardHost{
		r: r, id: s.id, epoch: s.epoch, ctx: s.ctx, done: s.ctx.Done(), reason: entity.ActivateNew, actx: r.attachCtx,
		entities: make(map[entityKey]*resident), retiring: make(map[entityKey]chan struct{}),
		admitting: true, idle: make(chan struct{}, 1), created: time.Now(),
	}
	if prev != nil && prev.running.Load() > 0 {
		sh.prev = prev
	} else {
		sh.prevDone.Store(true)
	}
	return sh
}

// waitPrev waits, bounded by DrainTimeout from this host's creation, until
// the previous host has no running handler.
func (sh *shardHost) waitPrev(ctx context.Context) error {
	deadline := sh.created.Add(sh.r.cfg.DrainTimeout)
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
		sh.r.log.Warn("handlers of the shard's previous epoch still run; admitting anyway", "shard", sh.id)
	}
	sh.prevDone.Store(true)
	return nil
}

// result is the outcome of one delivery.
type result struct {
	v           any
	err         error
	undelivered bool          // the runtime failed it before any handler ran
	epoch       storage.Epoch // the epoch the handler ran under (0: none ran)
	admitted    bool          // it entered a mailbox (deliver sets it)
}

// waiter carries one ask's response. Waiters are pooled per runner (a
// channel must not outlive the synctest bubble of the runner that made it).
type waiter struct{ ch chan result }

func newWaiter() any { return &waiter{ch: make(chan result, 1)} }

type message struct {
	h     *entity.Handler
	req   any
	reply *waiter         // nil for a signal
	ctx   context.Context // the asker's; an ask whose ctx ended is not run
}

// deliver enqueues a message for entity id of kind k and waits for the
// response unless oneWay. res.undelivered is set when the message certainly
// did not reach a handler (safe to retry); res.epoch is the epoch a handler
// ran under. With remote set, an admitted ask counts in sh.replying until
// the transport reports its answer written (replyWritten): drains wait for
// it.
func (sh *shardHost) deliver(ctx context.Context, k *kindRT, h *entity.Handler, id string, req any, oneWay, remote bool) result {
	msg := message{h: h, req: req}
	if !oneWay {
		msg.reply, msg.ctx = sh.r.waiters.Get().(*waiter), ctx
	}
	if err := sh.enqueue(ctx, k, entityKey{kind: k.desc.Name(), id: id}, msg, remote && !oneWay); err != nil {
		if msg.reply != nil {
			sh.r.waiters.Put(msg.reply)
		}
		return result{err: err, undelivered: true}
	}
	if oneWay {
		return result{admitted: true}
	}
	select {
	case res := <-msg.reply.ch:
		sh.r.waiters.Put(msg.reply)
		res.admitted = true
		return res
	case <-ctx.Done():
		// The handler may still run: at most once. The waiter is
		// abandoned to the entity, which writes into its buffer.
		return result{admitted: true, err: fmt.Errorf("runner: ask %s %q (%w): %w", k.desc.Name(), id, ErrMaybeDelivered, context.Cause(ctx))}
	}
}

// replyWritten ends the count of a remote ask's answer (see deliver).
func (sh *shardHost) replyWritten() {
	if sh.replying.Add(-1) == 0 && sh.draining.Load() {
		signal(sh.idle)
	}
}

// enqueue adds msg to the entity's mailbox, creating the entity if needed.
// Admission is checked under sh.mu together with the enqueue, so once a
// drain has stopped admission no message can slip in; a counted message
// (a remote ask) enters sh.replying at admission, under sh.mu too.
func (sh *shardHost) enqueue(ctx context.Context, k *kindRT, key entityKey, msg message, counted bool) error {
	if ctx.Err() != nil { // admission checks the context first
		return &UndeliveredError{Shard: sh.id, Cause: ctxErr(ctx)}
	}
	if !sh.prevDone.Load() {
		if err := sh.waitPrev(ctx); err != nil {
			return err
		}
	}
	for {
		sh.mu.RLock()
		if !sh.admitting {
			sh.mu.RUnlock()
			if err := sh.waitCutover(ctx); err != nil {
				return err
			}
			continue
		}
		if e := sh.entities[key]; e != nil {
			err := sh.admit(e, msg, counted)
			sh.mu.RUnlock()
			return err
		}
		sh.mu.RUnlock()

		sh.mu.Lock()
		if !sh.admitting {
			sh.mu.Unlock()
			continue
		}
		if e := sh.entities[key]; e != nil {
			err := sh.admit(e, msg, counted)
			sh.mu.Unlock()
			return err
		}
		if ch := sh.retiring[key]; ch != nil {
			// The previous instance is running its Release hook: the new
			// one must not activate before that finished.
			sh.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return fmt.Errorf("runner: waiting for %s %q to passivate: %w", key.kind, key.id, context.Cause(ctx))
			}
		}
		e := &resident{key: key, kind: k, host: sh}
		if inst, ok := sh.warmed[key]; ok {
			e.inst = inst // warmed during the handoff; Activate still runs
			delete(sh.warmed, key)
		}
		sh.entities[key] = e
		// Listed under sh.mu, so a concurrent close() cannot miss it.
		sh.r.residents.add(e)
		err := sh.admit(e, msg, counted)
		sh.mu.Unlock()
		sh.r.met.activations.Add(context.Background(), 1, sh.r.met.attrs)
		return err
	}
}

// admit pushes msg to e (under sh.mu) and, when counted, counts its
// answer in sh.replying.
func (sh *shardHost) admit(e *resident, msg message, counted bool) error {
	if counted {
		sh.replying.Add(1) // before the push: a drain never sees it run uncounted
	}
	err := e.push(msg)
	if err != nil && counted {
		sh.replyWritten()
	}
	return err
}

// resident is one resident entity instance. It has a goroutine only while its
// mailbox is non-empty (plus a short linger).
type resident struct {
	key  entityKey
	kind *kindRT
	host *shardHost

	mu       sync.Mutex
	queue    []message
	spare    []message
	running  bool
	dead     bool          // retired: pushes fail with errRetired
	hot      bool          // restarted within hotWindow: linger before exiting
	lastExit time.Duration // since clockBase

	// Owned by the entity's goroutine (or by the retiring goroutine once
	// dead and idle).
	inst      any
	activated bool
	restart   bool
	processed uint64

	// LRU links and last use, under Runner.residents.mu.
	prev, next *resident
	lastUsed   time.Time
	listed     bool
}

var errRetired = errors.New("runner: entity retired")

// push appends msg and starts the goroutine if needed. Callers hold
// host.mu (read or write). errRetired is a safety net: an instance is
// marked dead only after it left host.entities or while host admission is
// off, and enqueue checks both under host.mu before pushing.
func (e *resident) push(msg message) error {
	e.mu.Lock()
	if e.dead {
		e.mu.Unlock()
		return errRetired
	}
	if len(e.queue) >= e.kind.opts.Mailbox {
		e.mu.Unlock()
		e.kind.stats.rejected.add(e.host.id)
		e.host.r.met.mailboxRejections.Add(context.Background(), 1, e.host.r.met.attrs)
		return fmt.Errorf("%w: %s %q (%d queued)", entity.ErrMailboxFull, e.key.kind, e.key.id, e.kind.opts.Mailbox)
	}
	e.queue = append(e.queue, msg)
	start := !e.running
	if start {
		e.running = true
		e.hot = e.lastExit > 0 && time.Since(clockBase)-e.lastExit < hotWindow
	}
	e.mu.Unlock()
	if start {
		e.host.running.Add(1)
		go e.run()
	}
	return nil
}

// run drains the mailbox in batches, then exits.
func (e *resident) run() {
	var batch []message // the last batch processed, handed back as spare
	for {
		e.mu.Lock()
		if batch != nil {
			e.spare, batch = batch[:0], nil
		}
		if len(e.queue) == 0 {
			hot := e.hot
			e.mu.Unlock()
			if hot && e.linger() {
				continue
			}
			e.mu.Lock()
			if len(e.queue) > 0 {
				e.mu.Unlock()
				continue
			}
			e.running = false
			e.lastExit = time.Since(clockBase)
			e.mu.Unlock()
			e.host.r.residents.touch(e)
			if e.host.running.Add(-1) == 0 && e.host.draining.Load() {
				signal(e.host.idle)
			}
			return
		}
		batch = e.queue
		e.queue = e.spare[:0]
		e.mu.Unlock()
		for i := range batch {
			e.process(&batch[i])
			batch[i] = message{}
		}
	}
}

// linger yields a few times and reports whether messages arrived.
func (e *resident) linger() bool {
	for range lingerSpins {
		runtime.Gosched()
		e.mu.Lock()
		n := len(e.queue)
		e.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}

// startGate says why no handler of the shard may start now, or nil: the
// shard left (its host is done) or the detach instant passed (a long
// pause?) before the watchdog could act — never start a handler after it.
func (e *resident) startGate() error {
	sh := e.host
	select {
	case <-sh.done:
		return context.Cause(sh.ctx)
	default:
	}
	if sh.r.pastTrip() {
		return ErrDetached
	}
	return nil
}

// process runs one message, unless the shard is gone.
func (e *resident) process(m *message) {
	sh := e.host
	if why := e.startGate(); why != nil {
		e.fail(m, &UndeliveredError{Shard: sh.id, Cause: why}, true)
		return
	}
	if m.reply != nil && sh.handingOff.Load() {
		// The shard is being handed to a ready owner: an ask not started
		// yet goes back to its sender, which retries there. (A signal's
		// sender has its answer already: it runs here.)
		e.fail(m, &UndeliveredError{Shard: sh.id, Cause: ErrShardMoved}, true)
		return
	}
	if m.ctx != nil && m.ctx.Err() != nil { // the asker gave up before it ran
		e.fail(m, &UndeliveredError{Shard: sh.id, Cause: ctxErr(m.ctx)}, true)
		return
	}
	if !e.activated {
		if err := e.activate(); err != nil {
			e.fail(m, err, false)
			return
		}
		// Activation may take a while (Restore reads the store; the
		// process may be paused): check again, right before the handler.
		if why := e.startGate(); why != nil {
			e.fail(m, &UndeliveredError{Shard: sh.id, Cause: why}, true)
			return
		}
	}
	e.processed++
	e.kind.stats.handled.add(sh.id)
	var start time.Time
	sample := e.processed%64 == 1
	if sample {
		start = time.Now()
	}
	v, err := e.invoke(m)
	if sample {
		sh.r.met.handlerDuration.Record(context.Background(), time.Since(start).Seconds(), sh.r.met.attrs)
	}
	if why, cause := sh.lostWhileRunning(); why != "" {
		// The handler finished after its shard left this runner (a pause
		// outlived the detach instant, or the shard was dropped): another
		// runner may already serve the entity, so its result is never
		// acknowledged and the instance, which may hold that result, is
		// discarded.
		e.inst, e.activated, e.restart = nil, false, true
		sh.r.met.dropped.Add(context.Background(), 1, sh.r.met.attrs, withReason(dropStaleResult))
		sh.r.log.Warn("handler finished after its shard left this runner; result withheld, instance discarded",
			"kind", e.key.kind, "method", m.h.Name(), "shard", sh.id, "epoch", sh.epoch, "why", why)
		v, err = nil, &StaleResultError{Shard: sh.id, Runner: sh.r.cfg.ID, Epoch: sh.epoch, Reason: why, Cause: cause}
	}
	if m.reply != nil {
		m.reply.ch <- result{v: v, err: err, epoch: sh.epoch}
	} else if err != nil {
		sh.r.signalFailed(e.key.kind, m.h.Name(), sh.id, err) // WARN, rate-limited
	}
}

// Reasons of the sharding.messages_dropped counter.
const (
	dropShardLeft   = "shard_left"   // a signal whose shard left before it ran
	dropStaleResult = "stale_result" // a handler finished after its shard left: result withheld
)

// lostWhileRunning says why a handler that just returned must not have its
// result acknowledged, with the cause, or "" while no other runner can own
// the shard yet: the detach instant has not passed (the check that gates
// the start of a handler, made again at its end) and the shard is still
// hosted here at the handler's epoch — or it is being released plainly
// and its lock, still ours, waits for this handler (waitStragglers).
func (sh *shardHost) lostWhileRunning() (string, error) {
	if sh.r.pastTrip() {
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

// fail answers m with err; undelivered says no handler ran it.
func (e *resident) fail(m *message, err error, undelivered bool) {
	if m.reply != nil {
		m.reply.ch <- result{err: err, undelivered: undelivered}
		return
	}
	e.host.r.met.dropped.Add(context.Background(), 1, e.host.r.met.attrs, withReason(dropShardLeft))
}

// invoke calls the handler, turning a panic into a *entity.PanicError and
// discarding the instance.
func (e *resident) invoke(m *message) (v any, err error) {
	defer func() {
		if p := recover(); p != nil {
			sh := e.host
			err = &entity.PanicError{Kind: e.key.kind, Method: m.h.Name(), Entity: e.key.id, Value: fmt.Sprint(p), Stack: string(debug.Stack())}
			e.inst, e.activated, e.restart = nil, false, true
			sh.r.met.panics.Add(context.Background(), 1, sh.r.met.attrs)
			sh.r.log.Error("entity handler panicked; instance discarded", "kind", e.key.kind, "method", m.h.Name(), "shard", sh.id, "panic", p)
		}
	}()
	ctx, cancel := e.host.handlerContext(m)
	if cancel != nil {
		defer cancel()
	}
	return m.h.Invoke(e.inst, ctx, m.req)
}

// activate creates the instance and calls its Activate hook.
func (e *resident) activate() error {
	sh := e.host
	reason := sh.reason
	if e.restart {
		reason = entity.ActivateRestart
	}
	inst := e.inst
	if inst == nil {
		inst = e.kind.desc.New(e.key.id)
	}
	if a, ok := inst.(entity.Activator); ok {
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = &entity.PanicError{Kind: e.key.kind, Method: "Activate", Entity: e.key.id, Value: fmt.Sprint(p), Stack: string(debug.Stack())}
				}
			}()
			return a.Activate(sh.ctx, entity.ActivateInfo{
				Entity: e.key.id, Shard: sh.id, Epoch: int64(sh.epoch), Reason: reason,
				Restore: sh.r.restoreFunc(sh.id, e.key), Checkpoint: sh.checkpointFunc(e.key),
				DeleteCheckpoint: sh.deleteCheckpointFunc(e.key),
			})
		}()
		if err != nil {
			e.inst = nil
			return fmt.Errorf("runner: activate %s %q: %w", e.key.kind, e.key.id, err)
		}
	}
	e.inst, e.activated, e.restart = inst, true, false
	return nil
}

// waitCutover is called by a sender that found admission stopped: during a
// handoff it waits (bounded by CutoverWaiters and ctx) for the outcome,
// then the caller re-checks; otherwise it returns the not-here error,
// naming the new owner when known.
func (sh *shardHost) waitCutover(ctx context.Context) error {
	sh.mu.Lock()
	ch := sh.cutover
	if ch == nil || sh.cutoverWaiters >= sh.r.cfg.CutoverWaiters {
		movedTo := sh.movedTo
		sh.mu.Unlock()
		if ch != nil {
			sh.r.met.cutoverRejected.Add(context.Background(), 1, sh.r.met.attrs)
		}
		if movedTo != "" {
			return &NotOwnerError{Shard: sh.id, OwnerHint: movedTo}
		}
		return sh.r.notHere(sh.id)
	}
	sh.cutoverWaiters++
	sh.mu.Unlock()
	sh.r.met.cutoverBuffered.Add(context.Background(), 1, sh.r.met.attrs)
	defer func() {
		sh.mu.Lock()
		sh.cutoverWaiters--
		sh.mu.Unlock()
	}()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("runner: waiting for the handoff of shard %d: %w", sh.id, context.Cause(ctx))
	}
}

// beginCutover stops admission for a handoff to runner to: new senders
// wait for the outcome.
func (sh *shardHost) beginCutover(to string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.admitting = false
	sh.movedTo = to
	sh.cutover = make(chan struct{})
	sh.handingOff.Store(true)
}

// reopen resumes hosting after a failed handoff: released entities are
// forgotten (new instances activate on demand) and waiting senders retry.
func (sh *shardHost) reopen() {
	sh.mu.Lock()
	var dead []*resident
	for k, e := range sh.entities {
		e.mu.Lock()
		if e.dead {
			dead = append(dead, e)
			delete(sh.entities, k)
		}
		e.mu.Unlock()
	}
	sh.admitting = true
	sh.draining.Store(false)
	sh.handingOff.Store(false)
	sh.movedTo = ""
	ch := sh.cutover
	sh.cutover = nil
	sh.mu.Unlock()
	for _, e := range dead {
		sh.r.residents.remove(e)
	}
	if ch != nil {
		close(ch)
	}
}

// checkpointName is the storage name of an entity's checkpoint.
func checkpointName(key entityKey) string { return key.kind + "/" + key.id }

func (sh *shardHost) checkpointFunc(key entityKey) func(context.Context, []byte) error {
	return func(ctx context.Context, data []byte) error {
		_, err := sh.r.store.WriteCheckpoint(ctx, sh.id, checkpointName(key), sh.epoch, data)
		return err
	}
}

// release calls inst's Release hook, if it has one and was activated.
func (sh *shardHost) release(ctx context.Context, e *resident, reason error) {
	rel, ok := e.inst.(entity.Releaser)
	if !ok || !e.activated {
		return
	}
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("release hook panicked: %v", p)
			}
		}()
		return rel.Release(ctx, entity.ReleaseInfo{
			Entity: e.key.id, Shard: sh.id, Epoch: int64(sh.epoch), Reason: reason, Checkpoint: sh.checkpointFunc(e.key),
			DeleteCheckpoint: sh.deleteCheckpointFunc(e.key),
		})
	}()
	if err != nil {
		sh.r.log.Warn("entity Release hook failed", "kind", e.key.kind, "shard", sh.id, "reason", reason, "err", err)
	}
}

// drain stops admission, waits (bounded by ctx) until no entity has a
// goroutine and no passivation is in flight — in a handoff, asks admitted
// but not started are not run but returned undelivered (their senders
// retry at the new owner, which is ready), so its drain waits for the
// handlers running, not for queues whose every message may stall (an etcd
// leader failover held each checkpoint write for its 5 s timeout) — then
// runs the Release hooks of
// the idle activated entities with reason. An entity still busy when ctx
// ends gets no Release hook (it would run concurrently with its handler);
// it is interrupted when the shard's context is cancelled. Messages
// arriving afterwards get NotOwner (retryable).
func (sh *shardHost) drain(ctx context.Context, reason error) {
	sh.mu.Lock()
	sh.admitting = false
	sh.draining.Store(true)
	retiring := make([]chan struct{}, 0, len(sh.retiring))
	for _, ch := range sh.retiring {
		retiring = append(retiring, ch)
	}
	sh.mu.Unlock()
	// Every admitted message has run and every remote answer is written
	// (the sender has it before the shard can move: see checkEpoch).
	timedOut := false
	for (sh.running.Load() > 0 || sh.replying.Load() > 0) && !timedOut {
		select {
		case <-sh.idle:
		case <-ctx.Done():
			timedOut = true
		case <-time.After(50 * time.Millisecond): // cheap re-check against lost wake-ups
		}
	}
	for _, ch := range retiring {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	sh.mu.Lock()
	es := make([]*resident, 0, len(sh.entities))
	busy := 0
	for _, e := range sh.entities {
		e.mu.Lock()
		if e.running {
			busy++
		} else {
			e.dead = true
			es = append(es, e)
		}
		e.mu.Unlock()
	}
	sh.mu.Unlock()
	if timedOut {
		sh.r.log.Warn("drain timed out; busy entities are interrupted without Release", "shard", sh.id, "busy", busy)
	}
	sh.interrupted.Store(int64(busy))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, e := range es {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			sh.release(ctx, e, reason)
		})
	}
	wg.Wait()
}

// close ends hosting: no more admission, entities forgotten. Goroutines
// still running fail their queued messages with the shard context's cause.
func (sh *shardHost) close() {
	sh.mu.Lock()
	sh.admitting = false
	es := make([]*resident, 0, len(sh.entities))
	for _, e := range sh.entities {
		es = append(es, e)
	}
	clear(sh.entities)
	clear(sh.warmed)
	ch := sh.cutover
	sh.cutover = nil
	sh.mu.Unlock()
	if ch != nil {
		close(ch) // waiting senders now get NotOwner naming movedTo
	}
	for _, e := range es {
		e.mu.Lock()
		e.dead = true
		e.mu.Unlock()
		sh.r.residents.remove(e)
	}
}

// retire passivates an idle entity: it leaves the shard's map at once (a
// new message creates a new instance, which waits for this one's Release
// hook) and runs the Release hook with reason. It reports false if the
// entity is busy or already gone.
func (sh *shardHost) retire(e *resident, reason error) bool {
	sh.mu.Lock()
	if !sh.admitting || sh.entities[e.key] != e {
		sh.mu.Unlock()
		return false
	}
	e.mu.Lock()
	if e.running || len(e.queue) > 0 {
		e.mu.Unlock()
		sh.mu.Unlock()
		return false
	}
	e.dead = true
	e.mu.Unlock()
	delete(sh.entities, e.key)
	done := make(chan struct{})
	sh.retiring[e.key] = done
	sh.mu.Unlock()
	sh.r.residents.remove(e)
	sh.r.met.passivations.Add(context.Background(), 1, sh.r.met.attrs)

	ctx, cancel := context.WithTimeout(sh.ctx, sh.r.cfg.DrainTimeout)
	sh.release(ctx, e, reason)
	cancel()
	sh.mu.Lock()
	delete(sh.retiring, e.key)
	sh.mu.Unlock()
	close(done)
	return true
}

// residents is the runner-wide LRU of resident entities (most recent at
// head) and the resident cap.
type residents struct {
	r          *Runner
	mu         sync.Mutex
	head, tail *resident
	n          int
}

func (rs *residents) unlinkLocked(e *resident) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		rs.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		rs.tail = e.prev
	}
	e.prev, e.next = nil, nil
}

func (rs *residents) pushFrontLocked(e *resident) {
	e.next = rs.head
	if rs.head != nil {
		rs.head.prev = e
	}
	rs.head = e
	if rs.tail == nil {
		rs.tail = e
	}
}

// add lists a new entity (most recent) and wakes the janitor when the
// resident cap is exceeded. Called under the entity's host mutex.
func (rs *residents) add(e *resident) {
	rs.mu.Lock()
	e.lastUsed = time.Now()
	e.listed = true
	rs.pushFrontLocked(e)
	rs.n++
	over := rs.r.cfg.MaxResidentEntities > 0 && rs.n > rs.r.cfg.MaxResidentEntities
	rs.mu.Unlock()
	if over {
		signal(rs.r.evictKick)
	}
}

// evict passivates least recently used idle entities until the resident
// cap holds (busy entities are skipped).
func (rs *residents) evict() {
	limit := rs.r.cfg.MaxResidentEntities
	if limit <= 0 {
		return
	}
	rs.mu.Lock()
	var victims []*resident
	for v := rs.tail; v != nil && rs.n-len(victims) > limit; v = v.prev {
		if v.idle() {
			victims = append(victims, v)
		}
	}
	rs.mu.Unlock()
	for _, v := range victims {
		if v.host.retire(v, ErrPassivated) {
			rs.r.met.evictions.Add(context.Background(), 1, rs.r.met.attrs)
		}
	}
}

func (e *resident) idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.running && len(e.queue) == 0 && !e.dead
}

// touch marks e most recently used.
func (rs *residents) touch(e *resident) {
	rs.mu.Lock()
	if e.listed {
		e.lastUsed = time.Now()
		if rs.head != e {
			rs.unlinkLocked(e)
			rs.pushFrontLocked(e)
		}
	}
	rs.mu.Unlock()
}

func (rs *residents) remove(e *resident) {
	rs.mu.Lock()
	if e.listed {
		rs.unlinkLocked(e)
		e.listed = false
		rs.n--
	}
	rs.mu.Unlock()
}

// hot returns up to limit resident entities of shard, most recently used
// first.
func (rs *residents) hot(shard sharding.ShardID, limit int) []entityKey {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []entityKey
	for e := rs.head; e != nil && len(out) < limit; e = e.next {
		if e.host.id == shard {
			out = append(out, e.key)
		}
	}
	return out
}

func (rs *residents) count() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.n
}

// passivateIdle retires every idle entity unused for its kind's IdleAfter.
func (rs *residents) passivateIdle(now time.Time) {
	rs.mu.Lock()
	var victims []*resident
	for v := rs.tail; v != nil; v = v.prev {
		if now.Sub(v.lastUsed) >= v.kind.opts.IdleAfter {
			victims = append(victims, v)
		}
	}
	rs.mu.Unlock()
	for _, v := range victims {
		v.host.retire(v, ErrPassivated)
	}
}

// janitor passivates idle entities periodically and evicts over the
// resident cap, until ctx ends. Release hooks of passivated entities run
// here, never on a sender's goroutine.
func (r *Runner) janitor(ctx context.Context) {
	t := time.NewTicker(r.cfg.PassivationInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			r.residents.passivateIdle(now)
			r.residents.evict()
		case <-r.evictKick:
			r.residents.evict()
		}
	}
}

// EntityCount returns the number of resident entities.
func (r *Runner) EntityCount() int { return r.residents.count() }
