package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The runner's lifecycle: Run, Shutdown and its steps, Close, and how
// ownership ends. The state machine they drive is lifestate.go's.

// Run registers the runner and hosts shards until ctx ends, Shutdown
// completes or Close is called. It returns nil after Shutdown or Close and
// ctx's error when ctx ended; an ended ctx stops the runner like Close (no
// release, the lease expires on its own), so call Shutdown for a graceful
// stop.
//
// Starting: a store that cannot be reached at start delays the start; it
// does not end it at once. Run retries; the first failure is
// logged at WARN as soon as it is known (a refused connection at once),
// with the store's endpoints and the connection's own error, then one WARN
// a minute, and Status().NotStarted says why the runner is not up. Ready
// is closed once it is up. If it is not up within Config.StartTimeout
// (default DefaultStartTimeout, 1 min; WaitForever: no bound), Run returns
// an error matching ErrStartTimeout and the last failure, so that a
// misconfigured process exits and its supervisor says so. Run fails at
// once, without retrying, when the store refuses the runner's credentials
// (storage.ErrPermissionDenied), the configuration differs from the
// cluster's (*ClusterMismatchError) or the ID is live elsewhere
// (ErrDuplicateRunnerID).
func (r *Runner) Run(ctx context.Context) error {
	if err := r.begin(); err != nil {
		return err
	}
	defer close(r.sig.done)
	defer r.met.close()
	defer r.async.stop() // after the next: sends waiting for routes see ErrClosed
	defer func() {
		r.running.Store(false)
		r.router.RoutesChanged() // waiting sends see it and return ErrClosed
	}()
	r.installWorkers()
	if err := r.checkStreams(ctx); err != nil {
		return err
	}
	if err := r.serve(); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	loopDone := r.startLoops(ctx, &wg)
	r.log.Info("runner starting", "incarnation", r.incarnation, "weight", r.cfg.Weight, "shards", r.cfg.NumShards,
		"strategy", r.cfg.Strategy.Name(), "lease_ttl", r.cfg.LeaseTTL, "detach_margin", r.cfg.DetachMargin)
	grace, err := r.waitStop(ctx, loopDone)
	cancel(ErrShutdown)
	// Stop serving before wg.Wait: gracefully after Shutdown (drained),
	// abruptly after Close or an ended context (like a crash).
	r.net.Close(grace)
	r.mu.Lock()
	r.toLocked(onStop) // no detach, hence no detach span, from here on
	r.mu.Unlock()
	r.life.wait()
	return err
}

// begin marks the runner started, or says why Run may not run.
func (r *Runner) begin() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.toLocked(onRun) {
		if r.lifecycle.phase == phaseClosed { // Shutdown or Close came first
			return ErrClosed
		}
		return ErrAlreadyRunning
	}
	r.started = time.Now()
	r.reg.Start(r.started)
	r.running.Store(true)
	close(r.st.runCalled) // sends waiting for Run proceed
	return nil
}

// serve starts the transport's server (if the runner serves one) and
// learns the address it listens at.
func (r *Runner) serve() error {
	addr, err := r.net.Listen(r.router.Receiver())
	if err != nil {
		r.net.Close(0)
		r.mu.Lock()
		r.toLocked(onStop)
		r.mu.Unlock()
		return fmt.Errorf("runner: %w", err)
	}
	r.served = addr != ""
	r.mu.Lock()
	if r.address == "" {
		r.address = addr
	}
	r.mu.Unlock()
	return nil
}

// startLoops starts the runner's goroutines in wg; loopDone is closed
// when the control loop returns (Shutdown finished releasing).
func (r *Runner) startLoops(ctx context.Context, wg *sync.WaitGroup) (loopDone chan struct{}) {
	wg.Go(func() { r.followRunners(ctx) })
	if r.view.full {
		wg.Go(func() { r.followLocks(ctx) })
	}
	loopDone = make(chan struct{})
	if r.cfg.ClientOnly {
		// Routes only: no lease, no registration, no shards; the
		// assignment only names where a shard with no live owner goes.
		wg.Go(func() { r.storeProbe.run(ctx, r.sig.stopReq, r.store, r.cfg.OpTimeout, r.cfg.ProbeInterval) })
		wg.Go(func() {
			defer close(loopDone)
			for {
				select {
				case <-ctx.Done():
					return
				case <-r.sig.stopReq:
					return
				case <-r.sig.rebalance:
					r.recomputeForRouting()
				}
			}
		})
	} else {
		wg.Go(func() { _ = r.keeper.Run(ctx) })
		wg.Go(func() { r.followHandoffs(ctx) })
		wg.Go(func() { r.followNotices(ctx) })
		wg.Go(func() { r.followStuck(ctx) })
		wg.Go(func() { r.collectNotices(ctx) })
		wg.Go(func() { r.watchdog(ctx) })
		wg.Go(func() { r.hosting.Janitor(ctx) })
		wg.Go(func() { r.sched.Run(ctx) })
		wg.Go(func() { r.reminders.Run(ctx) })
		wg.Go(func() { r.guardRecord(ctx) })
		wg.Go(func() { r.followDrain(ctx) })
		wg.Go(func() { r.singletons.run(ctx) })
		wg.Go(func() { defer close(loopDone); r.controlLoop(ctx) })
	}
	wg.Go(func() { r.startup(ctx) })
	return loopDone
}

// waitStop waits for the end of the run: ctx, Close (or a fatal error,
// which gives the lease up), or the end of Shutdown's releases. grace is
// how long the transport may finish answering.
func (r *Runner) waitStop(ctx context.Context, loopDone <-chan struct{}) (grace time.Duration, err error) {
	select {
	case <-ctx.Done():
		r.dropAll(ErrShutdown, "context ended")
		return 0, ctx.Err()
	case <-r.sig.closeReq:
		if err = r.fatalErr(); err != nil {
			// This runner gave up its ID (registration.go): like Close,
			// then the lease goes, with the locks still under it.
			r.dropAll(err, err.Error())
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.OpTimeout)
			if rerr := r.keeper.Revoke(rctx); rerr != nil && !errors.Is(rerr, storage.ErrLeaseNotFound) {
				r.log.Warn("revoking the lease failed; it will expire on its own", "err", rerr)
			}
			rcancel()
			return 0, err
		}
		r.dropAll(ErrShutdown, "closed")
		return 0, nil
	case <-loopDone: // Shutdown finished releasing
		return r.cfg.DrainTimeout, nil
	}
}

// Shutdown stops the runner gracefully: it drains and releases every shard
// (batched), revokes its lease (deleting its registration) and waits for
// Run to return, all bounded by ctx. If ctx ends first, the runner is closed
// abruptly and ctx's error returned. Safe to call concurrently and more than
// once; before Run it makes Run return ErrClosed at once.
func (r *Runner) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	if r.toLocked(onClose) { // before Run
		r.mu.Unlock()
		r.sig.stopOnce.Do(func() { close(r.sig.stopReq) })
		r.async.stop() // sends made before Run: they fail with ErrClosed
		return nil
	}
	if r.stopCtx == nil {
		r.stopCtx = ctx
	}
	r.mu.Unlock()
	r.sig.stopOnce.Do(func() { close(r.sig.stopReq) })
	select {
	case <-r.sig.done:
		return nil
	case <-ctx.Done():
		r.Close()
		return ctx.Err()
	}
}

func (r *Runner) shutdownContext() context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopCtx
}

// Close stops the runner abruptly: every entity is interrupted with
// ErrShutdown, no lock is released and the lease is not revoked, so other
// runners take over the shards only after the lease expires (this is also
// how tests simulate a crash). Close waits for Run to return. Idempotent.
func (r *Runner) Close() {
	r.mu.Lock()
	started := !r.toLocked(onClose) // closed before Run, or Run was called
	r.mu.Unlock()
	r.sig.closeOnce.Do(func() { close(r.sig.closeReq) })
	if started {
		<-r.sig.done
	} else {
		r.async.stop() // sends made before Run: they fail with ErrClosed
	}
}

// dropAll ends every ownership with cause, without touching the store.
func (r *Runner) dropAll(cause error, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.toLocked(onStop)
	r.att.gen++
	if r.att.stop != nil {
		r.att.stop(cause)
	}
	r.dropOwnedLocked(cause)
	r.log.Info("runner stopped", "why", why)
}

// clockBase makes monotonic nanosecond readings: time.Since(clockBase).
var clockBase = time.Now()

// Shutdown's steps, run by the control loop once Shutdown is called:
// beginDrainMode (hand the shards off), then shutdown (release the rest,
// revoke the lease, linger).

// cancelAllInbound abandons every inbound handoff (Shutdown).
func (r *Runner) cancelAllInbound() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.shards.known() {
		if in := r.shards.endInbound(id); in != nil {
			r.shards.done(id)
			r.reportInbound(id, in, handoff.Aborted, "shutting down", abortShutdown)
		}
	}
}

func (r *Runner) ownedCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.shards.owned
}

// beginDrainMode starts the first step of Shutdown: the runner registers
// itself as draining (weight 0), so its peers take its shards through the
// handoff protocol. It returns until when to wait for them, or zero when
// there is nothing to hand off (not attached, handoff disabled, no owned
// shard or no peer able to take shards).
func (r *Runner) beginDrainMode() time.Time {
	r.mu.Lock()
	peers := false
	for _, m := range r.view.members {
		if m.ID != r.cfg.ID && m.Weight > 0 && !m.Draining {
			peers = true
		}
	}
	ok := !r.cfg.DisableHandoff && r.shards.owned > 0 && peers && r.toLocked(onDrain) // attached
	leaseID, sctx := r.att.lease, r.stopCtx
	r.mu.Unlock()
	if !ok {
		return time.Time{}
	}
	deadline := time.Now().Add(r.cfg.ShutdownHandoffTimeout)
	if d, has := sctx.Deadline(); has {
		// Keep a quarter (at most OpTimeout) for the plain release of
		// whatever is left and the revocation.
		reserve := min(r.cfg.OpTimeout, time.Until(d)/4)
		deadline = d.Add(-reserve)
	}
	h, _ := r.keeper.Health()
	cctx, cancel := context.WithTimeout(sctx, r.cfg.OpTimeout)
	defer cancel()
	if _, err := r.reg.Write(cctx, leaseID, r.recordFor(h.TTL, true)); err != nil {
		r.log.Warn("cannot register as draining; releasing shards plainly", "err", err)
		return time.Time{}
	}
	r.log.Info("shutting down: handing shards off", "owned", r.ownedCount(), "until", time.Until(deadline).Round(time.Millisecond))
	return deadline
}

// shutdown releases every shard still owned, revokes the lease, and keeps
// answering (NotOwner) for a moment so peers route elsewhere before the
// transport stops (graceful stop).
func (r *Runner) shutdown(ctx context.Context) {
	defer r.linger()
	r.mu.Lock()
	attached := r.lifecycle.phase == phaseAttached
	r.toLocked(onRelease) // an attached runner's phase becomes stopping
	gen := r.att.gen
	var ids []sharding.ShardID
	for s := range r.shards.ownedShards() {
		ids = append(ids, s.id)
		r.shards.markReleasing(s.id, s.epoch)
	}
	r.mu.Unlock()
	r.log.Info("shutting down", "owned", len(ids))
	if attached && len(ids) > 0 {
		// release() checks the phase only through gen; keep it attached-like.
		r.release(gen, ids, ErrShutdown)
	}
	r.mu.Lock()
	r.dropOwnedLocked(ErrShutdown)
	r.toLocked(onStop) // the revocation below is ours: no lost lease, no detach
	lease := r.att.lease
	clean := attached && lease != 0 && r.att.detachedLease != lease && !r.cfg.ClientOnly
	r.mu.Unlock()
	rbase := ctx
	if sctx := r.shutdownContext(); sctx != nil {
		rbase = sctx // Shutdown's bound, not more
	}
	rctx, cancel := context.WithTimeout(rbase, r.cfg.OpTimeout)
	defer cancel()
	if clean {
		r.markStopped(rctx, lease)
	}
	if err := r.keeper.Revoke(rctx); err != nil && !errors.Is(err, storage.ErrLeaseNotFound) {
		r.log.Warn("revoking the lease failed; it will expire on its own", "err", err)
	}
}

// markStopped publishes the record of a clean stop (storage.RunnerRecord's
// Stopped) before the lease is revoked: the runner stayed attached under
// lease until now and released every shard it held under it itself, after
// the drain in which their handlers ended, so a sender may acknowledge a
// reply of this lease that reaches it after the lease ended
// (routing.Directory.LeaseEndsByDrain; a reply in flight when Shutdown
// handed its shard off is otherwise withheld as a result of an ended
// lease). A failed write only loses that: such replies are withheld, as
// after a crash.
func (r *Runner) markStopped(ctx context.Context, lease storage.LeaseID) {
	h, _ := r.keeper.Health()
	rec := r.recordFor(h.TTL, true)
	rec.Stopped = true
	if _, err := r.reg.Write(ctx, lease, rec); err != nil {
		r.log.Warn("cannot mark the record stopped before revoking the lease", "err", err)
	}
}

// shutdownLinger is how long a stopping runner keeps its transport up after
// revoking its lease: senders whose view still points here get a clean,
// retryable NotOwner instead of a connection error.
const shutdownLinger = 300 * time.Millisecond

func (r *Runner) linger() {
	if !r.served {
		return
	}
	t := time.NewTimer(shutdownLinger)
	defer t.Stop()
	var done <-chan struct{}
	if sctx := r.shutdownContext(); sctx != nil {
		done = sctx.Done()
	}
	select {
	case <-t.C:
	case <-done:
	}
}
