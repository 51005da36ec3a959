package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// The runner's own record, runners/{ID}.
//
// The record is claimed, never stolen (storage.Registry): a runner writes it
// when it is absent or attached to its own lease, and replaces anything else
// only after deciding, at the revision it read, that it is damage. The rules:
//
//   - Registration (first start, or re-registration with a new lease after
//     the old one was lost) that finds a valid record of another process
//     (another incarnation, under another lease) waits for that lease to end:
//     a crashed predecessor's lease expires within its TTL and deletes the
//     record, a stopping one revokes it. The wait lasts at most the holder's
//     lease TTL (as published in its record; this runner's LeaseTTL if it
//     published none) plus duplicateIDSlack; after that the holder is
//     renewing its lease, so it is alive: Run fails with
//     ErrDuplicateRunnerID (logged at ERROR). A damaged record (corrupt,
//     without a lease, naming this incarnation under another lease) is
//     replaced at once.
//   - A registered runner watches its record. If it is deleted or changed
//     while the lease lives (garbage, a wrong address, a write under its
//     lease), the runner rewrites it, conditional on the revision it saw, and
//     logs a WARN naming the key. If it is replaced by a valid registration of
//     another live process (which a shardhost runner makes only when it found
//     the key absent), both log an ERROR and the process that started first
//     keeps the ID: it restores its record; the other gives up (drops its
//     shards, revokes its lease) and Run returns ErrDuplicateRunnerID.

// duplicateIDSlack is added to the holder's lease TTL when waiting for a
// crashed predecessor's record to expire: the store deletes expired leases
// on a timer (etcd checks every 500 ms) and the deletion must reach us.
const duplicateIDSlack = 2 * time.Second

// errWaitingForID: the registration found the ID registered by another
// process and waits for its lease to end (not a failure worth a retry
// backoff or a log per attempt).
var errWaitingForID = errors.New("runner: waiting for the previous registration of this ID to expire")

// registration is what the runner knows of its own record. Under Runner.mu.
type registration struct {
	want storage.RunnerRecord // the record the runner wrote last or is writing
	rev  storage.Revision     // revision of its last successful write
	seen ownKey               // the latest state of the key in the runners watch
	// holder is the lease of another process's registration this runner
	// waits for (since); 0 when not waiting.
	holder storage.LeaseID
	since  time.Time
	fatal  error // set once: Run ends with it
}

// ownKey is one observed state of runners/{ID}.
type ownKey struct {
	known  bool // observed at least once
	exists bool
	kv     storage.KeyValue // when exists
	rev    storage.Revision // revision of the observation (the write, the delete, or a listing)
}

func (r *Runner) recordKey() string { return storage.Key(storage.KeyspaceRunners, r.cfg.ID) }

// recordFor returns the record this runner publishes under a lease of ttl.
func (r *Runner) recordFor(ttl time.Duration, draining bool) storage.RunnerRecord {
	rec := storage.RunnerRecord{
		ID: r.cfg.ID, Address: r.Address(), Weight: r.cfg.Weight,
		Incarnation: r.incarnation, Started: r.started, LeaseTTL: ttl,
		Draining: r.opDrain.requested.Load(), // an operator's request (drain.go)
	}
	if draining {
		rec.Weight, rec.Draining = 0, true
	}
	return rec
}

// sameRecord compares records, start times by instant (the stored form
// keeps neither the monotonic reading nor the location).
func sameRecord(a, b storage.RunnerRecord) bool {
	if !a.Started.Equal(b.Started) {
		return false
	}
	a.Started, b.Started = time.Time{}, time.Time{}
	return a == b
}

// noteOwnKeyLocked records an observation of runners/{ID} from the watch
// and wakes whoever may act on it.
func (r *Runner) noteOwnKeyLocked(k ownKey) {
	k.known = true
	r.reg.seen = k
	signal(r.recordKick)
	signal(r.regKick)
}

// writeRecord writes rec under leaseID (PutRunner) as the record this
// runner wants, and notes the revision.
func (r *Runner) writeRecord(ctx context.Context, leaseID storage.LeaseID, rec storage.RunnerRecord) (storage.Revision, error) {
	r.mu.Lock()
	r.reg.want = rec
	r.mu.Unlock()
	rev, err := r.store.PutRunner(ctx, leaseID, rec)
	if err == nil {
		r.noteWritten(rev)
	}
	return rev, err
}

func (r *Runner) noteWritten(rev storage.Revision) {
	r.mu.Lock()
	r.reg.rev = max(r.reg.rev, rev)
	r.mu.Unlock()
}

// register claims runners/{ID} for leaseID (see the rules above). It
// returns the revision of the write, errWaitingForID while another
// process's registration may still expire, or ErrDuplicateRunnerID.
func (r *Runner) register(ctx context.Context, leaseID storage.LeaseID, rec storage.RunnerRecord) (storage.Revision, error) {
	for range 3 { // the key may change under us; three tries, then a retry later
		rev, err := r.writeRecord(ctx, leaseID, rec)
		var ce *storage.RunnerConflictError
		if !errors.As(err, &ce) {
			if err == nil {
				r.mu.Lock()
				r.reg.holder = storage.NoLease
				r.mu.Unlock()
			}
			return rev, err
		}
		if !ce.Exists {
			continue // deleted meanwhile: claim it
		}
		other, derr := storage.DecodeRunner(ce.Existing)
		if derr == nil && ce.Existing.Lease != storage.NoLease && other.Incarnation != r.incarnation {
			return 0, r.waitForID(other)
		}
		// Damage: corrupt, without a lease, or this incarnation's record
		// under a lease it no longer uses. Replace it where we saw it.
		why := "it has no lease"
		switch {
		case derr != nil:
			why = derr.Error()
		case ce.Existing.Lease != storage.NoLease:
			why = fmt.Sprintf("this incarnation's record under an old lease %x", ce.Existing.Lease)
		}
		r.log.Warn("replacing a damaged runner record", "key", r.recordKey(), "detail", why)
		rev, err = r.store.ReplaceRunner(ctx, leaseID, rec, ce.Existing.ModRevision)
		if errors.As(err, &ce) {
			continue
		}
		if err == nil {
			r.noteWritten(rev)
		}
		return rev, err
	}
	return 0, fmt.Errorf("register: %s keeps changing", r.recordKey())
}

// waitForID handles a valid registration of another process found at
// registration: wait (errWaitingForID) until its lease could have expired,
// then fail with ErrDuplicateRunnerID.
func (r *Runner) waitForID(other storage.Runner) error {
	bound := other.LeaseTTL
	if bound <= 0 {
		bound = r.cfg.LeaseTTL
	}
	bound += duplicateIDSlack
	now := time.Now()
	r.mu.Lock()
	if r.reg.holder != other.Lease {
		r.reg.holder, r.reg.since = other.Lease, now
		r.mu.Unlock()
		r.log.Warn("runner ID registered by another process; waiting for its lease to end (a crashed predecessor's expires within its TTL)",
			"key", r.recordKey(), "other_incarnation", other.Incarnation, "other_address", other.Address,
			"other_lease", fmt.Sprintf("%x", other.Lease), "at_most", bound)
		return errWaitingForID
	}
	waited := now.Sub(r.reg.since)
	r.mu.Unlock()
	if waited < bound {
		return errWaitingForID
	}
	err := fmt.Errorf("%w: %s is registered by incarnation %s (address %q, lease %x), which kept its lease alive for %v",
		ErrDuplicateRunnerID, r.recordKey(), other.Incarnation, other.Address, other.Lease, waited.Round(time.Millisecond))
	r.log.Error("another live process uses this runner's ID; giving up", "key", r.recordKey(),
		"other_incarnation", other.Incarnation, "other_address", other.Address, "waited", waited.Round(time.Millisecond))
	return err
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
	case errors.Is(err, errWaitingForID):
		return r.cfg.ProbeInterval, false
	}
	return 0, false
}

// failRun ends Run with err: the runner stops like Close (every shard
// dropped with cause err), then revokes its lease.
func (r *Runner) failRun(err error) {
	r.mu.Lock()
	if r.reg.fatal == nil {
		r.reg.fatal = err
	}
	r.mu.Unlock()
	r.closeOnce.Do(func() { close(r.closeReq) })
}

func (r *Runner) fatalErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reg.fatal
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
		case <-r.recordKick:
		case <-retry.C:
		}
		if r.checkRecord() {
			retry.Reset(r.cfg.ProbeInterval)
		}
	}
}

// checkRecord compares the observed record with the wanted one and repairs
// it. It reports whether to try again later (a failed write).
func (r *Runner) checkRecord() (again bool) {
	r.mu.Lock()
	seen, want, leaseID, actx := r.reg.seen, r.reg.want, r.lease, r.attachCtx
	if r.phase != phaseAttached || r.stopping || !seen.known || seen.rev <= r.reg.rev || leaseID == storage.NoLease {
		r.mu.Unlock()
		return false // not registered, or an observation of our own write (or older)
	}
	key := r.recordKey()
	replaceAt := storage.Revision(0) // 0: PutRunner (absent or ours)
	switch {
	case !seen.exists:
		r.log.Warn("own runner record deleted while its lease lives; rewriting it", "key", key, "revision", seen.rev)
	case seen.kv.Lease == leaseID:
		got, err := storage.DecodeRunner(seen.kv)
		if err == nil && sameRecord(got.RunnerRecord, want) {
			r.reg.rev = max(r.reg.rev, seen.rev) // rewritten as it was
			r.mu.Unlock()
			return false
		}
		r.log.Warn("own runner record changed under this runner's lease; rewriting it", "key", key, "revision", seen.rev,
			"detail", recordDiff(got.RunnerRecord, want, err))
	default:
		other, err := storage.DecodeRunner(seen.kv)
		if err != nil || seen.kv.Lease == storage.NoLease || other.Incarnation == r.incarnation {
			r.log.Warn("own runner record replaced while its lease lives; restoring it", "key", key, "revision", seen.rev,
				"other_lease", fmt.Sprintf("%x", seen.kv.Lease), "detail", recordDiff(other.RunnerRecord, want, err))
			replaceAt = seen.rev
			break
		}
		// The process that started first keeps the ID.
		first := other.Started.Before(r.started) || (other.Started.Equal(r.started) && other.Incarnation < r.incarnation)
		keeper := "this runner (started first)"
		if first {
			keeper = "the other process (started first)"
		}
		r.log.Error("another process registered with this runner's ID", "key", key, "other_incarnation", other.Incarnation,
			"other_address", other.Address, "other_lease", fmt.Sprintf("%x", other.Lease), "other_started", other.Started,
			"keeps_id", keeper)
		if first {
			r.mu.Unlock()
			r.failRun(fmt.Errorf("%w: %s was registered by incarnation %s (address %q), which started first",
				ErrDuplicateRunnerID, key, other.Incarnation, other.Address))
			return false
		}
		replaceAt = seen.rev
	}
	r.mu.Unlock()

	cctx, cancel := r.opCtx(actx)
	defer cancel()
	var rev storage.Revision
	var err error
	if replaceAt == 0 {
		rev, err = r.store.PutRunner(cctx, leaseID, want)
	} else {
		rev, err = r.store.ReplaceRunner(cctx, leaseID, want, replaceAt)
	}
	switch {
	case err == nil:
		r.noteWritten(rev)
		r.log.Info("own runner record restored", "key", key, "revision", rev)
		return false
	case errors.Is(err, storage.ErrRunnerConflict):
		return false // it changed again: the watch shows how
	case actx.Err() != nil:
		return false // detached meanwhile: re-attaching registers again
	default:
		r.storageResult("repair runner record", err)
		return true
	}
}

// recordDiff describes how a stored record differs from the wanted one.
func recordDiff(got, want storage.RunnerRecord, decodeErr error) string {
	if decodeErr != nil {
		return decodeErr.Error()
	}
	var d []string
	add := func(name string, g, w any) { d = append(d, fmt.Sprintf("%s %v, want %v", name, g, w)) }
	if got.Address != want.Address {
		add("address", fmt.Sprintf("%q", got.Address), fmt.Sprintf("%q", want.Address))
	}
	if got.Weight != want.Weight {
		add("weight", got.Weight, want.Weight)
	}
	if got.Draining != want.Draining {
		add("draining", got.Draining, want.Draining)
	}
	if got.Incarnation != want.Incarnation {
		add("incarnation", got.Incarnation, want.Incarnation)
	}
	if !got.Started.Equal(want.Started) {
		add("started", got.Started.UTC().Format(time.RFC3339Nano), want.Started.UTC().Format(time.RFC3339Nano))
	}
	if got.LeaseTTL != want.LeaseTTL {
		add("leaseTTL", got.LeaseTTL, want.LeaseTTL)
	}
	return strings.Join(d, "; ")
}
