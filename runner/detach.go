package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/lease"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// watchdogState is what decides a detach and what the watchdog reported
// of it (watchdog, storageResult); the policy that places the detach
// instant is the instant's own (Runner.trip).
type watchdogState struct {
	// Set by New, read-only afterwards.
	machine *detachment.Machine

	// Guarded by Runner.mu.
	storageErrs map[string]int    // consecutive failed calls, by operation
	lastStreak  int               // keep-alive streak last logged
	wouldDetach detachment.Reason // the detach the health last called for, logged once
}

// watchdog owns the attachment: it registers at start, trips detachment on
// the lease's health (deadline - margin, failure streak, lease lost), and
// while detached probes the store and re-attaches after RecoverWindow of
// continuous health. It never blocks on a store call while attached, so a
// hung call elsewhere cannot delay a detach.
func (r *Runner) watchdog(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	backoff := r.cfg.ProbeInterval
	var nextProbe time.Time
	for {
		h, changed := r.keeper.Health()
		r.mu.Lock()
		ph := r.lifecycle.phase
		r.mu.Unlock()
		var wait time.Duration
		switch ph {
		case phaseStarting:
			w, stop, again := r.tryAttach(ctx, h, &backoff)
			switch {
			case stop:
				return
			case again:
				continue
			}
			wait = w
		case phaseAttached, phaseStopping:
			r.trip.set(h)
			r.observeLease(h)
			reason := r.trip.policy.Evaluate(time.Now(), detachment.Lease{Deadline: h.Deadline, FailureStreak: h.FailureStreak, Lost: h.Lost})
			detail := leaseDetail(h)
			if reason == detachment.ReasonNone && r.trip.acted() {
				// A renewal landed after a handler saw the detach instant
				// pass and had its instance discarded: detach all the same.
				reason = detachment.ReasonLeaseDeadline
				detail += "; the instant before the last renewal passed and was acted on"
			}
			if reason != detachment.ReasonNone {
				r.mu.Lock()
				detached := r.tripLocked(reason, detail)
				r.mu.Unlock()
				if detached {
					continue
				}
			}
			wait = time.Until(r.trip.policy.TripAt(h.Deadline))
			if h.Lost || wait <= 0 { // tripped with detachment disabled: re-check later
				wait = r.cfg.ProbeInterval
			}
		case phaseDetached:
			// Probe on a schedule, not on every health change: a probe's
			// own renewal changes the health.
			r.observeLease(h)
			if h.Lease != storage.NoLease && !h.Lost && !h.Healthy {
				// Any failed renewal, probe or not, breaks continuity.
				r.wd.machine.SignalUnhealthy(time.Now())
			}
			if now := time.Now(); now.Before(nextProbe) {
				wait = nextProbe.Sub(now)
			} else {
				wait = r.probe(ctx, h)
				nextProbe = time.Now().Add(wait)
			}
		default:
			return
		}
		timer.Reset(max(wait, time.Millisecond))
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-timer.C:
		case <-r.trip.kick:
		case <-r.reg.Retry(): // the own record changed: a waiting registration retries
		}
	}
}

// tryAttach makes one registration attempt of a starting runner. It says
// how long to wait before the next one (it failed), to stop watching (ctx
// ended, a fatal error ends Run, or Shutdown began before the runner
// registered), or to go on at once (registered).
func (r *Runner) tryAttach(ctx context.Context, h lease.Health, backoff *time.Duration) (wait time.Duration, stop, again bool) {
	if err := r.attach(ctx, h); err != nil {
		if ctx.Err() != nil {
			return 0, true, false
		}
		idWait, fatal := r.registrationWait(err)
		switch {
		case fatal:
			return 0, true, false // Run ends with ErrDuplicateRunnerID
		case idWait > 0:
			return idWait, false, false
		}
		if r.startRefused("register", err) {
			return 0, true, false // Run ends with the permission error
		}
		r.st.failed("register", err, *backoff) // WARN now and every minute
		wait, *backoff = *backoff, min(2**backoff, 5*time.Second)
		return wait, false, false
	}
	r.mu.Lock()
	still := r.lifecycle.phase == phaseStarting
	r.mu.Unlock()
	if still {
		// Shutdown began before the runner registered: it never will;
		// nothing is left to watch.
		<-ctx.Done()
		return 0, true, false
	}
	*backoff = r.cfg.ProbeInterval
	return 0, false, true
}

func leaseDetail(h lease.Health) string {
	d := fmt.Sprintf("deadline in %v, failure streak %d", time.Until(h.Deadline).Round(time.Millisecond), h.FailureStreak)
	if h.Err != nil {
		d += ": " + h.Err.Error()
	}
	return d
}

// observeLease records lease metrics and logs keep-alive streak transitions.
func (r *Runner) observeLease(h lease.Health) {
	r.mu.Lock()
	prev := r.wd.lastStreak
	r.wd.lastStreak = h.FailureStreak
	r.mu.Unlock()
	ctx := context.Background()
	r.met.keepAliveStreak.Record(ctx, int64(h.FailureStreak), r.met.attrs)
	switch {
	case h.FailureStreak > prev:
		r.met.keepAliveFailures.Add(ctx, int64(h.FailureStreak-prev), r.met.attrs)
		if prev == 0 {
			r.log.Warn("lease keep-alive degraded", "err", h.Err, "deadline_in", time.Until(h.Deadline).Round(time.Millisecond))
		}
	case h.FailureStreak == 0 && prev > 0:
		r.log.Info("lease keep-alive recovered", "failed_attempts", prev, "deadline_in", time.Until(h.Deadline).Round(time.Millisecond))
	}
}

// tripLocked detaches for reason, or, with detachment disabled, logs that
// it would have. It reports whether the runner is detached afterwards. A
// lost lease drops every shard even when detachment is disabled: the store
// has already deleted the locks.
func (r *Runner) tripLocked(reason detachment.Reason, detail string) bool {
	if r.lifecycle.phase == phaseDetached {
		r.wd.machine.Detach(time.Now(), reason, detail) // update the reason
		return true
	}
	if _, ok := r.lifecycle.next(onDetach); !ok { // neither attached nor releasing for Shutdown
		return false
	}
	if !r.wd.machine.Enabled() && reason != detachment.ReasonLeaseLost {
		if r.wd.wouldDetach != reason {
			r.wd.wouldDetach = reason
			r.log.Warn("would detach, but detachment is disabled", "reason", reason.String(), "detail", detail)
		}
		return false
	}
	r.wd.machine.Detach(time.Now(), reason, detail)
	r.detachLocked(reason, detail)
	return true
}

// detachLocked performs the detach transition. Before any further cluster
// operation: the phase changes (loops pause, admission stops), in-flight
// store calls of the attachment are cancelled, and every shard is dropped
// with cause ErrDetached.
func (r *Runner) detachLocked(reason detachment.Reason, detail string) {
	h, _ := r.keeper.Health()
	r.toLocked(onDetach)
	r.att.gen++
	r.att.detachedLease = r.att.lease
	r.att.stop(ErrDetached)
	n := r.shards.owned
	var hosts []*hosting.Shard // the detach span's (traced only)
	if r.trace.On() {
		hosts = make([]*hosting.Shard, 0, n)
		for s := range r.shards.ownedShards() {
			hosts = append(hosts, s.host)
		}
	}
	r.forgetAttachmentLocked()
	r.work.Reset()
	clear(r.wd.storageErrs)
	r.wd.wouldDetach = detachment.ReasonNone
	r.hub.Publish(Detached{EventBase: r.base(), Reason: reason, Detail: detail, Deadline: h.Deadline})
	r.life.traceDetach(reason, detail, h.Deadline, hosts)
	ctx := context.Background()
	r.met.detached.Record(ctx, 1, r.met.attrs)
	r.met.detaches.Add(ctx, 1, r.met.attrs, withReason(reason.String()))
	r.log.Warn("detached: every shard stopped", "reason", reason.String(), "detail", detail,
		"shards_dropped", n, "deadline_in", time.Until(h.Deadline).Round(time.Millisecond))
}

// Detach detaches the runner by hand (reason manual), as losing its lease
// would: every entity is interrupted and every shard dropped. It
// re-attaches on its own after RecoverWindow of health. It does nothing
// when detachment is disabled or the runner is not attached. It is for
// failure drills: a test of your own entities (a checkpoint, an
// idempotent handler) can make the detach happen when it wants.
func (r *Runner) Detach() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tripLocked(detachment.ReasonManual, "requested")
}

// probe runs one probe while detached and re-attaches when the recover
// window has passed. It returns the wait until the next probe.
func (r *Runner) probe(ctx context.Context, h lease.Health) time.Duration {
	now := time.Now()
	healthy := false
	var failed error // why the probe found the store unhealthy, when it knows
	if h.Lease != storage.NoLease && !h.Lost {
		// The keep-alive is the probe: ask for one now, judge the last.
		r.keeper.RenewNow()
		healthy = h.Healthy && now.Before(r.trip.policy.TripAt(h.Deadline))
		failed = h.Err
	} else {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
		failed = r.store.Ping(pctx)
		healthy = failed == nil
		cancel()
	}
	if !healthy {
		if errors.Is(failed, storage.ErrPermissionDenied) && ctx.Err() == nil {
			r.st.refusedWhileDetached("probe", failed) // the role may have lost read too
		}
		r.wd.machine.SignalUnhealthy(now)
		return r.cfg.ProbeInterval
	}
	r.wd.machine.SignalHealthy(now)
	at, ok := r.wd.machine.ReattachAt()
	if !r.wd.machine.Enabled() {
		at, ok = now, true // a lost lease with detachment disabled: re-register at once
	}
	if !ok || now.Before(at) {
		return min(r.cfg.ProbeInterval, max(time.Until(at), time.Millisecond))
	}
	if err := r.attach(ctx, h); err != nil {
		if idWait, fatal := r.registrationWait(err); fatal || idWait > 0 {
			return max(idWait, r.cfg.ProbeInterval) // still healthy: only the ID is taken
		}
		if ctx.Err() == nil {
			r.st.reattachFailed(err)
		}
		r.wd.machine.SignalUnhealthy(time.Now())
		return r.cfg.ProbeInterval
	}
	r.st.mu.Lock()
	r.st.denied, r.st.deniedLog = 0, time.Time{} // a later refusal is news again
	r.st.mu.Unlock()
	return 0
}

var errLeaseChanged = errors.New("lease changed during attach")

// heldUnder lists the locks and handoff records attached to lease, in one
// store request (storage.Leases.LeaseKeys).
func heldUnder(ctx context.Context, store storage.Store, lease storage.LeaseID) (locks []sharding.ShardID, records []storage.HandoffRef, err error) {
	keys, err := store.LeaseKeys(ctx, lease)
	if err != nil {
		return nil, nil, err
	}
	for _, k := range keys {
		ks, name, _ := strings.Cut(k, "/")
		switch storage.Keyspace(ks) {
		case storage.KeyspaceShards:
			if id, err := sharding.ParseShardID(name); err == nil {
				locks = append(locks, id)
			}
		case storage.KeyspaceHandoffs:
			from, shard, _ := strings.Cut(name, "/")
			if id, err := sharding.ParseShardID(shard); err == nil && storage.ValidateRunnerID(from) == nil {
				records = append(records, storage.HandoffRef{Shard: id, From: from})
			}
		}
	}
	slices.Sort(locks)
	slices.SortFunc(records, func(a, b storage.HandoffRef) int { return int(a.Shard) - int(b.Shard) })
	// One record per shard in a call: a second (a stale one under another
	// old owner) goes in the next.
	return locks, records, nil
}

// attach registers (granting a new lease if there is none or it was lost)
// and, when the lease survived a detach, bumps the epochs of the locks
// still under it so no pre-detach epoch stays valid. Then it marks the
// runner attached.
func (r *Runner) attach(ctx context.Context, h lease.Health) (err error) {
	r.mu.Lock()
	stopping, drainMode, prev := r.lifecycle.stopping, r.lifecycle.draining, r.att.lease
	reattaching := r.lifecycle.phase == phaseDetached
	r.mu.Unlock()
	if stopping {
		return nil // Shutdown revoked the lease: never register again
	}
	if err := r.verifyCluster(ctx); err != nil { // start.go: once per Run
		return err
	}
	if h.Lease == storage.NoLease || h.Lost {
		if _, err := r.keeper.Grant(ctx); err != nil {
			return err
		}
		h, _ = r.keeper.Health()
	}
	// A lease no attach completed with (r.att.lease is set below only) holds
	// no locks of ours, also when an earlier attempt granted it and then
	// failed to register.
	newLease := h.Lease != prev
	var (
		kept []storage.AcquireResult
		span trace.Span // the re-attachment's (trace_lifecycle.go)
	)
	stopped := false // Shutdown or Run's end came first: not re-attached
	if reattaching {
		span = r.life.startReattach(h.Lease, newLease)
		defer func() {
			if stopped {
				endLife(span, "", "shutdown", "the runner stopped during the re-attachment")
				return
			}
			endReattach(span, kept, err)
		}()
	}
	// Re-attaching during Shutdown: stay drained.
	rec := r.recordFor(h.TTL, drainMode)
	cctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	regRev, err := r.reg.Register(cctx, h.Lease, rec)
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	lifeEvent(span, tracing.EventRegistered)
	if !newLease {
		if kept, err = r.rewriteKept(cctx, h.Lease); err != nil {
			return err
		}
		lifeEvent(span, tracing.EventEpochsBumped, tracing.KeyShardCount.Int(len(kept)))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, _ := r.keeper.Health(); cur.Lease != h.Lease || cur.Lost {
		return errLeaseChanged
	}
	from := r.lifecycle.phase
	if _, ok := r.lifecycle.next(onAttach); !ok {
		stopped = true
		return nil // stopping or stopped meanwhile
	}
	if from == phaseDetached && !r.wd.machine.MaybeReattach(time.Now()) && r.wd.machine.IsDetached() {
		// Detached again (by hand, or health broke) while we registered.
		return errors.New("detached again during re-attach")
	}
	r.toLocked(onAttach)
	r.st.setReady() // start.go: the first registration
	r.att.rev = regRev
	r.reg.NoteWritten(regRev)
	r.trip.reset(h)
	r.att.gen++
	r.att.ctx, r.att.stop = context.WithCancelCause(ctx)
	r.att.lease = h.Lease
	if !r.view.full && from == phaseDetached {
		// Without a lock watch nothing told this runner, while detached,
		// of the locks released meanwhile (a release tells the assignee
		// only while it is a member): the holders it knew are history.
		// Its acquisitions read them again (HeldElsewhere names a holder).
		for id, l := range r.view.locks.All() {
			if l.Lease != h.Lease {
				r.view.locks.Del(id)
			}
		}
	}
	clear(r.wd.storageErrs)
	r.met.detached.Record(context.Background(), 0, r.met.attrs)
	if newLease {
		r.hub.Publish(Registered{EventBase: r.base(), Lease: h.Lease})
	}
	if from == phaseDetached {
		r.hub.Publish(Reattached{EventBase: r.base(), Lease: h.Lease, NewLease: newLease})
		r.log.Info("re-attached", "lease", fmt.Sprintf("%x", h.Lease), "new_lease", newLease, "kept_shards", len(kept))
	} else {
		r.log.Info("registered", "lease", fmt.Sprintf("%x", h.Lease))
	}
	for _, a := range kept {
		if a.Status == storage.Acquired && r.mayOwnLocked() {
			r.installLocked(a.Shard, a.Epoch)
		}
	}
	// The assignment is recomputed by the control loop once the view is
	// quiet (its own registration is a membership change too): a runner
	// that starts with others acts on the membership they end up with, not
	// on whichever part of it registered first.
	r.view.viewChanging = true
	r.attachedSince = true
	signal(r.sig.rebalance)
	return nil
}

// rewriteKept gives new epochs to the locks still held under lease after a
// detach. The lease survived the detach: its locks and handoff records are
// from before it. The store lists what is attached to the lease (one
// request, whatever the cluster's size); a lock of ours wanted later and
// missed here would be rewritten when acquired (AlreadyOwned).
func (r *Runner) rewriteKept(ctx context.Context, leaseID storage.LeaseID) ([]storage.AcquireResult, error) {
	mine, records, err := heldUnder(ctx, r.store, leaseID)
	if err != nil {
		return nil, fmt.Errorf("list what lease %x holds: %w", leaseID, err)
	}
	for len(records) > 0 {
		// An old owner must not transfer to an attachment that did not
		// warm. Distinct shards per call.
		n := 1
		for n < len(records) && records[n].Shard != records[n-1].Shard {
			n++
		}
		_, _ = r.store.DeleteHandoffs(ctx, leaseID, records[:n])
		records = records[n:]
	}
	if len(mine) == 0 {
		return nil, nil
	}
	kept, err := r.store.Rewrite(ctx, leaseID, r.owner(), mine)
	if err != nil {
		return nil, fmt.Errorf("bump epochs of %d kept locks: %w", len(mine), err)
	}
	return kept, nil
}
