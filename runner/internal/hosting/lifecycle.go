package hosting

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
)

// waitCutover is called by a sender that found admission stopped: during a
// handoff it waits (bounded by CutoverWaiters and ctx) for the outcome,
// then the caller re-checks; otherwise it returns the not-here error,
// naming the new owner when known.
// With traced set, the wait is an event of the span ctx carries.
func (sh *Shard) waitCutover(ctx context.Context, traced bool) error {
	sh.mu.Lock()
	ch := sh.cutover
	if ch == nil || sh.cutoverWaiters >= sh.h.cfg.CutoverWaiters {
		movedTo := sh.movedTo
		sh.mu.Unlock()
		if ch != nil {
			sh.h.met.CutoverRejected.Add(context.Background(), 1, sh.h.met.Attrs)
		}
		if movedTo != "" {
			return &NotOwnerError{Shard: sh.id, OwnerHint: movedTo}
		}
		return sh.h.env.NotHere(sh.id)
	}
	sh.cutoverWaiters++
	to := sh.movedTo
	sh.mu.Unlock()
	if traced {
		sh.cutoverWait(ctx, to)
	}
	sh.h.met.CutoverBuffered.Add(context.Background(), 1, sh.h.met.Attrs)
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

// BeginCutover stops admission for a handoff to runner to: new senders
// wait for the outcome, and asks admitted but not started yet go back to
// their senders (the new owner is ready).
func (sh *Shard) BeginCutover(to string) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.stopAdmittingLocked()
	sh.movedTo = to
	sh.cutover = make(chan struct{})
	sh.handingOff.Store(true)
}

// stopAdmittingLocked turns admission off (under sh.mu, write-locked):
// senders by ID see it under sh.mu; senders through a Target, which check
// open under their entity's lock instead (target.go), are waited for by
// taking every listed entity's lock once — a push that saw admission on
// has completed when this returns, like one holding sh.mu (read).
func (sh *Shard) stopAdmittingLocked() {
	sh.admitting = false
	sh.open.Store(false)
	for e := range sh.entities.all() {
		e.mu.Lock()
		e.mu.Unlock() //nolint:staticcheck // an empty critical section: the barrier
	}
}

// Reopen resumes hosting after a failed handoff: released entities are
// forgotten (new instances activate on demand) and waiting senders retry.
func (sh *Shard) Reopen() {
	sh.mu.Lock()
	var dead []*resident
	for e := range sh.entities.all() {
		e.mu.Lock()
		if e.dead {
			dead = append(dead, e)
			sh.entities.remove(e)
		}
		e.mu.Unlock()
	}
	sh.admitting = true
	sh.open.Store(true)
	sh.draining.Store(false)
	sh.handingOff.Store(false)
	sh.movedTo = ""
	ch := sh.cutover
	sh.cutover = nil
	sh.startWorkersLocked() // the drain stopped them
	sh.mu.Unlock()
	for _, e := range dead {
		sh.h.residents.remove(e)
	}
	if ch != nil {
		close(ch)
	}
}

// release calls inst's Release hook, if it has one and was activated.
func (sh *Shard) release(ctx context.Context, e *resident, reason error) {
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
		return rel.Release(entity.WithRuntime(ctx, e), entity.ReleaseInfo{
			Entity: e.key.ID, Shard: sh.id, Epoch: int64(sh.epoch), Reason: reason, Checkpoint: sh.checkpointsOf(e).write,
			DeleteCheckpoint: sh.checkpointsOf(e).delete,
		})
	}()
	if err != nil {
		sh.h.log.Warn("entity Release hook failed", "kind", e.key.Kind, "shard", sh.id, "reason", reason, "err", err)
	}
}

// Drain stops admission, waits (bounded by ctx) until no entity has a
// goroutine, every remote answer is written and no passivation is in
// flight, then cancels the shard's workers (cause reason) and waits for
// them to return — in a handoff, asks admitted but not started are not run but
// returned undelivered (their senders retry at the new owner, which is
// ready), so its drain waits for the handlers running, not for queues
// whose every message may stall (an etcd leader failover held each
// checkpoint write for its 5 s timeout) — then runs the Release hooks of
// the idle activated entities with reason. An entity still busy when ctx
// ends gets no Release hook (it would run concurrently with its handler);
// it is interrupted when the shard's context is cancelled. Messages
// arriving afterwards get NotOwner (retryable).
func (sh *Shard) Drain(ctx context.Context, reason error) {
	sh.mu.Lock()
	sh.stopAdmittingLocked()
	sh.draining.Store(true)
	retiring := make([]chan struct{}, 0, len(sh.retiring))
	for _, ch := range sh.retiring {
		retiring = append(retiring, ch)
	}
	sh.mu.Unlock()
	// Every admitted message has run and every remote answer is written
	// (the sender has it before the shard can move) — the workers still
	// run meanwhile: handlers may wait for them (a consumer feeding the
	// view they answer from) — then the workers are cancelled and have
	// returned.
	timedOut := sh.waitIdle(ctx, func() bool { return sh.running.Load() > sh.workers.Load() || sh.replying.Load() > 0 })
	sh.mu.Lock()
	sh.stopWorkersLocked(reason)
	sh.mu.Unlock()
	if !timedOut {
		timedOut = sh.waitIdle(ctx, func() bool { return sh.running.Load() > 0 || sh.replying.Load() > 0 })
	}
	for _, ch := range retiring {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	sh.mu.Lock()
	es := make([]*resident, 0, sh.entities.len())
	busy := 0
	for e := range sh.entities.all() {
		e.mu.Lock()
		if e.running {
			busy++
		} else {
			e.dead = true
			e.stopTimersLocked()
			es = append(es, e)
		}
		e.mu.Unlock()
	}
	sh.mu.Unlock()
	if timedOut {
		sh.h.log.Warn("drain timed out; busy entities are interrupted without Release", "shard", sh.id, "busy", busy)
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

// waitIdle waits, bounded by ctx, while busy holds; it reports whether
// ctx ended first.
func (sh *Shard) waitIdle(ctx context.Context, busy func() bool) (timedOut bool) {
	for busy() {
		select {
		case <-sh.idle:
		case <-ctx.Done():
			return true
		case <-time.After(50 * time.Millisecond): // cheap re-check against lost wake-ups
		}
	}
	return false
}

// Close ends hosting: no more admission, entities forgotten. Goroutines
// still running fail their queued messages with the shard context's cause
// (the caller cancels it).
func (sh *Shard) Close() {
	sh.mu.Lock()
	sh.stopAdmittingLocked()
	for _, s := range sh.slots { // the runner cancels the shard's context, with its cause, next
		s.want = false
	}
	es := make([]*resident, 0, sh.entities.len())
	for e := range sh.entities.all() {
		es = append(es, e)
	}
	sh.entities.clear()
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
		e.stopTimersLocked()
		e.mu.Unlock()
		sh.h.residents.remove(e)
	}
}

// retire passivates an idle entity: it leaves the shard's map at once (a
// new message creates a new instance, which waits for this one's Release
// hook) and runs the Release hook with reason. It reports false if the
// entity is busy or already gone.
func (sh *Shard) retire(e *resident, reason error) bool {
	sh.mu.Lock()
	if !sh.admitting || sh.entities.get(e.kind, e.key.ID) != e {
		sh.mu.Unlock()
		return false
	}
	e.mu.Lock()
	if e.running || e.n > 0 {
		e.mu.Unlock()
		sh.mu.Unlock()
		return false
	}
	e.dead = true
	e.stopTimersLocked()
	e.mu.Unlock()
	sh.entities.remove(e)
	done := make(chan struct{})
	if sh.retiring == nil {
		sh.retiring = map[EntityKey]chan struct{}{}
	}
	sh.retiring[e.key] = done
	sh.mu.Unlock()
	sh.h.residents.remove(e)
	sh.h.met.Passivations.Add(context.Background(), 1, sh.h.met.Attrs)

	ctx, cancel := context.WithTimeout(sh.ctx, sh.h.cfg.DrainTimeout)
	sh.release(ctx, e, reason)
	cancel()
	sh.mu.Lock()
	delete(sh.retiring, e.key)
	sh.mu.Unlock()
	close(done)
	return true
}
