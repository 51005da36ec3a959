package runner

import (
	"context"
	"errors"
	"time"

	"github.com/shardhost/shardhost/runner/internal/registration"
	"github.com/shardhost/shardhost/storage"
)

// The runner's own record, runners/{ID}, is kept by package registration
// (internal/registration: the claim and repair rules); the runner decides
// what it publishes (recordFor) and what a duplicate ID does to Run.

// recordFor returns the record this runner publishes under a lease of ttl.
func (r *Runner) recordFor(ttl time.Duration, draining bool) storage.RunnerRecord {
	rec := storage.RunnerRecord{
		ID: r.cfg.ID, Address: r.Address(), Weight: r.cfg.Weight,
		Incarnation: r.incarnation, Started: r.started, LeaseTTL: ttl, DebugURL: r.cfg.DebugURL,
		Draining: r.opDrain.requested.Load(), // an operator's request (drain.go)
	}
	if draining {
		rec.Weight, rec.Draining = 0, true
	}
	return rec
}

// registrationWait returns how long to wait before the next registration
// attempt after err, and whether err ends Run (then it is recorded).
func (r *Runner) registrationWait(err error) (wait time.Duration, fatal bool) {
	switch {
	case errors.Is(err, ErrDuplicateRunnerID):
		r.failRun(err)
		return 0, true
	case errors.Is(err, ErrClusterMismatch):
		r.log.Error("configuration differs from the cluster's; stopping", "err", err)
		r.failRun(err)
		return 0, true
	case errors.Is(err, registration.ErrWaitingForID):
		return r.cfg.ProbeInterval, false
	}
	return 0, false
}

// failRun ends Run with err: the runner stops like Close (every shard
// dropped with cause err), then revokes its lease.
func (r *Runner) failRun(err error) {
	r.mu.Lock()
	if r.fatal == nil {
		r.fatal = err
	}
	r.mu.Unlock()
	r.sig.closeOnce.Do(func() { close(r.sig.closeReq) })
}

func (r *Runner) fatalErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fatal
}

// guardRecord keeps runners/{ID} as this runner wrote it while attached
// (see the rules above). Store calls run here, never on a watch callback
// or the watchdog.
func (r *Runner) guardRecord(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.reg.Changed():
		case <-retry.C:
		}
		if r.checkRecord() {
			retry.Reset(r.cfg.ProbeInterval)
		}
	}
}

// checkRecord repairs the record if the watch showed it changed behind
// this runner's back (registration.Record.Repair). It reports whether to
// try again later (a failed write).
func (r *Runner) checkRecord() (again bool) {
	r.mu.Lock()
	leaseID, actx := r.att.lease, r.att.ctx
	attached := r.lifecycle.phase == phaseAttached && !r.lifecycle.stopping && leaseID != storage.NoLease
	r.mu.Unlock()
	if !attached {
		return false // not registered
	}
	cctx, cancel := r.opCtx(actx)
	defer cancel()
	again, err := r.reg.Repair(cctx, actx, leaseID)
	switch {
	case errors.Is(err, ErrDuplicateRunnerID):
		r.failRun(err)
	case again:
		r.storageResult("repair runner record", err)
	}
	return again
}
