package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The control loop's operations on shard locks, carried out once r.mu is
// released (controlloop.go's execute): acquire, rewrite after a re-attach,
// verify, release (with the drain before it and the reminders' final
// progress), and the deletion of locks this runner should not hold.

// shardsPerCall bounds the shards of one acquire, verify, release or
// handoff-record call, each bounded by OpTimeout: 16 transactions of
// MaxShardsPerTxn, two rounds of the etcd store's 8 in flight. A runner with tens of thousands of shards
// makes several calls instead of one that cannot finish in time.
const shardsPerCall = 16 * storage.MaxShardsPerTxn

// acquire tries to lock shards for the attachment gen and installs what it
// got, unless the runner detached meanwhile.
func (r *Runner) acquire(actx context.Context, gen uint64, leaseID storage.LeaseID, shards []sharding.ShardID) {
	cctx, cancel := r.opCtx(actx)
	start := time.Now()
	res, err := r.store.Acquire(cctx, leaseID, r.owner(), shards)
	cancel()
	r.met.acquireLatency.Record(context.Background(), time.Since(start).Seconds(), r.met.attrs)
	if actx.Err() != nil {
		return // detached meanwhile: whatever was locked is rewritten on re-attach
	}
	r.storageResult("acquire", err)
	if err != nil {
		r.mu.Lock()
		for _, id := range shards { // retried after AcquireRetryInterval
			if p := r.shards.at(id).pending; p != nil && r.att.gen == gen {
				r.retryLocked(id, p.last.Add(r.cfg.AcquireRetryInterval))
			}
		}
		r.mu.Unlock()
		return
	}
	var rewrite []sharding.ShardID
	var exhausted []sharding.ShardID
	r.mu.Lock()
	if r.att.gen != gen || !r.mayOwnLocked() {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	for _, a := range res {
		p := r.shards.at(a.Shard).pending
		switch a.Status {
		case storage.Acquired:
			if a.Replaced != nil {
				r.log.Warn("took over a lock without a lease (never an owner)", "key", storage.LockKey(a.Shard), "revision", a.Replaced.Epoch)
			}
			r.installLocked(a.Shard, a.Epoch)
		case storage.AlreadyOwned:
			// Under our lease already. Written during this attachment and
			// naming this incarnation (a handoff's transfer to us that
			// landed before this call, its notice still on the way), it is
			// installed as the watch would install it: a rewrite would kill
			// the epoch the transfer's notice then installs, and drop the
			// shard (its handlers interrupted, its reminders fired again).
			// Locked before (a call cut short by a detach): never reuse an
			// epoch we did not install; bump it first.
			if a.Holder.Epoch == a.Epoch {
				r.applyLockPutLocked(a.Holder)
			}
			if r.shards.owner(a.Shard) == nil {
				rewrite = append(rewrite, a.Shard)
			}
		case storage.HeldElsewhere:
			if !r.view.full && a.Holder.Epoch > 0 {
				r.applyLockPutLocked(a.Holder) // what a lock watch would have shown
			}
			if p == nil {
				continue
			}
			p.attempts++
			if p.attempts > 1 {
				r.met.acquireRetries.Add(context.Background(), 1, r.met.attrs)
			}
			if r.cfg.AcquireRetryWindow < 0 || now.Sub(p.since) >= r.cfg.AcquireRetryWindow {
				p.exhausted = true
				exhausted = append(exhausted, a.Shard)
				r.shardChangedLocked(a.Shard, 0, false) // its parked requests give up
				if !r.view.full {
					r.view.stuck.watch(a.Shard, storage.Revision(a.Holder.Epoch)+1)
				}
				continue
			}
			r.retryLocked(a.Shard, p.last.Add(r.cfg.AcquireRetryInterval))
		}
	}
	r.mu.Unlock()
	if len(exhausted) > 0 {
		r.met.acquireExhausted.Add(context.Background(), int64(len(exhausted)), r.met.attrs)
		r.log.Warn("acquire retry window exhausted; waiting for the locks to be deleted",
			"shards", len(exhausted), "first", exhausted[0], "window", r.cfg.AcquireRetryWindow)
	}
	if len(rewrite) > 0 {
		r.rewrite(actx, gen, leaseID, rewrite)
	}
}

// rewrite bumps the epochs of locks held under our lease and installs them.
func (r *Runner) rewrite(actx context.Context, gen uint64, leaseID storage.LeaseID, shards []sharding.ShardID) {
	cctx, cancel := r.opCtx(actx)
	res, err := r.store.Rewrite(cctx, leaseID, r.owner(), shards)
	cancel()
	if actx.Err() != nil {
		return
	}
	r.storageResult("rewrite", err)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.att.gen != gen || !r.mayOwnLocked() {
		return
	}
	r.installRewrittenLocked(res)
}

// installRewrittenLocked installs the locks a Rewrite gave new epochs.
func (r *Runner) installRewrittenLocked(res []storage.AcquireResult) {
	for _, a := range res {
		if a.Status != storage.Acquired {
			continue
		}
		if s := r.shards.owner(a.Shard); s != nil && s.epoch < a.Epoch {
			// Installed meanwhile (a transfer's notice raced with this
			// call) at the epoch the rewrite just killed: it must not
			// serve on at a dead epoch (every fenced write would fail).
			r.lockLostLocked(a.Shard, fmt.Sprintf("rewritten at epoch %d by this runner, which had installed it at epoch %d meanwhile", a.Epoch, s.epoch))
			r.flushLostLocked()
		}
		r.installLocked(a.Shard, a.Epoch)
	}
}

// mayOwnLocked reports whether installing an ownership now is allowed: the
// runner is attached and the detach instant has not passed.
func (r *Runner) mayOwnLocked() bool {
	if r.lifecycle.phase != phaseAttached {
		return false
	}
	h, _ := r.keeper.Health()
	return h.Lease == r.att.lease && time.Now().Before(r.trip.policy.TripAt(h.Deadline))
}

// verify checks, read-only and in one store request, that every owned lock
// is still attached to this runner's lease (storage.Leases.LeaseKeys).
// Without a full lock view it also finds locks under the lease that this
// runner does not know of (an acquisition whose reply was lost, of a shard
// no longer wanted): unknown in two verifications far enough apart that
// no call of ours could still be writing them, they are taken back
// (orphans: rewriteUnknown).
func (r *Runner) verify() {
	r.mu.Lock()
	if r.lifecycle.phase != phaseAttached || r.shards.owned == 0 && r.view.full {
		r.mu.Unlock()
		return
	}
	gen, actx, leaseID := r.att.gen, r.att.ctx, r.att.lease
	held := make([]storage.Held, 0, r.shards.owned)
	for s := range r.shards.ownedShards() {
		if !r.shards.leaving(s.id) {
			held = append(held, storage.Held{Shard: s.id, Epoch: s.epoch})
		}
	}
	r.mu.Unlock()
	// One request whatever the runner owns: the keys attached to its lease.
	cctx, cancel := r.opCtx(actx)
	keys, err := r.store.LeaseKeys(cctx, leaseID)
	cancel()
	if actx.Err() != nil {
		return
	}
	if errors.Is(err, storage.ErrLeaseNotFound) {
		keys, err = nil, nil // every lock is lost; the keep-alive finds the lease gone
	}
	r.storageResult("verify", err)
	if err != nil {
		return
	}
	lost := storage.LostFromKeys(keys, held)
	r.mu.Lock()
	if r.att.gen != gen {
		r.mu.Unlock()
		return
	}
	for _, l := range lost {
		if s := r.shards.owner(l.Shard); s != nil && !r.shards.leaving(l.Shard) && s.epoch == control.EpochOf(held, l.Shard) {
			r.lockLostLocked(l.Shard, "verification found the lock gone or changed")
			if cur, _ := r.view.locks.Get(l.Shard); cur.Lease == leaseID {
				r.view.locks.Del(l.Shard) // not ours: unknown until the next decision reads it
			}
			r.shardChangedLocked(l.Shard, 0, true)
		}
	}
	r.flushLostLocked()
	var unknown []sharding.ShardID
	if !r.view.full {
		unknown = r.unknownLocksLocked(keys, time.Now())
	}
	r.mu.Unlock()
	if len(unknown) > 0 {
		r.rewriteUnknown(actx, gen, leaseID, unknown)
	}
}

// unknownLocksLocked returns the locks among keys (the lease's) that this
// runner has not known of for long enough (see verify): not owned, not
// being acquired, taken over or released, not in its view. It remembers
// when each was first found unknown.
func (r *Runner) unknownLocksLocked(keys []string, now time.Time) []sharding.ShardID {
	found := make(map[sharding.ShardID]time.Time, len(r.view.unknownLocks))
	var out []sharding.ShardID
	age := max(r.cfg.OpTimeout, r.cfg.VerifyInterval) + r.cfg.VerifyInterval
	for _, k := range keys {
		name, ok := strings.CutPrefix(k, string(storage.KeyspaceShards)+"/")
		if !ok {
			continue
		}
		id, err := sharding.ParseShardIDIn(name, r.cfg.NumShards)
		if err != nil || r.shards.busy(id) {
			continue
		}
		if l, held := r.view.locks.Get(id); held && l.Lease == r.att.lease {
			continue // known: an orphan being deleted, or about to be
		}
		first, seen := r.view.unknownLocks[id]
		if !seen {
			first = now
		}
		found[id] = first
		if now.Sub(first) >= age {
			out = append(out, id)
		}
	}
	r.view.unknownLocks = found
	return out
}

// rewriteUnknown takes back locks under our lease this runner did not know
// of: a rewrite gives each a new epoch (its old one is dead) and puts it in
// the view, and the round then decides it like any lock of ours that it
// does not own — installed when wanted, deleted otherwise.
func (r *Runner) rewriteUnknown(actx context.Context, gen uint64, leaseID storage.LeaseID, ids []sharding.ShardID) {
	r.log.Warn("found locks under this runner's lease that it did not know of; taking them back", "locks", len(ids), "first", ids[0])
	cctx, cancel := r.opCtx(actx)
	res, err := r.store.Rewrite(cctx, leaseID, r.owner(), ids)
	cancel()
	if actx.Err() != nil || err != nil {
		return // found again by the next verification
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.att.gen != gen {
		return
	}
	for _, a := range res {
		if a.Status == storage.Acquired && !r.shards.busy(a.Shard) {
			delete(r.view.unknownLocks, a.Shard)
			r.view.locks.Set(storage.Lock{Shard: a.Shard, Owner: r.owner(), Lease: leaseID, Epoch: a.Epoch})
			r.shardChangedLocked(a.Shard, 0, true)
		}
	}
}

// release drains shards (owned at gen), ends their ownership with cause
// and deletes their locks in batched transactions.
func (r *Runner) release(gen uint64, ids []sharding.ShardID, cause error) {
	r.mu.Lock()
	if r.att.gen != gen {
		r.mu.Unlock()
		return
	}
	actx, leaseID := r.att.ctx, r.att.lease
	shards := make([]*shard, 0, len(ids))
	for _, id := range ids {
		if s := r.shards.owner(id); s != nil {
			shards = append(shards, s)
		}
	}
	r.mu.Unlock()

	r.drain(actx, shards, cause)
	if r.cfg.ReleaseShard != nil {
		var wg sync.WaitGroup
		for _, s := range shards {
			to := ""
			r.mu.Lock()
			if a := r.view.assignment.Of(s.id); a != r.cfg.ID {
				to = a
			}
			r.mu.Unlock()
			wg.Go(func() { r.releaseShardHook(actx, s, to) })
		}
		wg.Wait()
	}

	r.mu.Lock()
	if r.att.gen != gen {
		r.mu.Unlock()
		return
	}
	for _, s := range shards {
		if r.shards.owner(s.id) == s {
			s.host.KeepLock()     // waitStragglers below
			s.plainRelease = true // its reminders stay for the progress below
			r.disownLocked(s, cause)
			r.shards.released(s.id, s.epoch)
			r.hub.Publish(ShardReleased{EventBase: r.base(), Shard: s.id, Epoch: s.epoch, Interrupted: s.host.Interrupted()})
		}
	}
	r.mu.Unlock()
	// Handlers that outlived the drain saw their context cancelled. The
	// lock stays until they return: another runner must never run the
	// same entities concurrently. Only a detach (or Close) ends the wait.
	for _, s := range shards {
		waitStragglers(actx, s, r.cfg.DrainTimeout, r.log)
	}
	// No handler of these shards can start any more: record which
	// reminder ticks fired (fenced, while the locks are still ours). A
	// failed write leaves the store's progress as it was: the next owner
	// then fires at least once instead of exactly once (published).
	failed := r.writeProgress(actx, shards)
	for _, s := range shards {
		r.reminders.Forget(s.id, s.epoch)
		if err, bad := failed[s.id]; bad {
			r.hub.Publish(RemindersUnrecorded{EventBase: r.base(), Shard: s.id, Epoch: s.epoch, Err: err})
		}
	}

	held := make([]storage.Held, len(shards))
	r.mu.Lock()
	for i, s := range shards {
		held[i] = storage.Held{Shard: s.id, Epoch: s.epoch, Tell: r.view.assigneeToTell(s.id, r.cfg.ID)}
	}
	r.mu.Unlock()
	r.deleteLocks(actx, leaseID, held)
}

// waitStragglers waits until no handler of s runs, logging an error every
// warnEvery (DrainTimeout) while handlers ignore their cancelled context. It returns
// early when actx ends (detach, Close).
func waitStragglers(actx context.Context, s *shard, warnEvery time.Duration, log *slog.Logger) {
	warned := time.Now()
	for n := s.host.Running(); n > 0 && actx.Err() == nil; n = s.host.Running() {
		if time.Since(warned) >= warnEvery {
			warned = time.Now()
			log.Error("handlers ignore their cancelled context; the shard's lock stays until they return", "shard", s.id, "running", n)
		}
		select {
		case <-actx.Done():
		case <-s.host.Idle(): // drained: signalled when running reaches 0
		case <-time.After(50 * time.Millisecond): // re-check, as shardHost.drain does
		}
	}
}

// deleteLocks deletes locks held under leaseID at the given epochs, then
// clears them from the releasing set. If the call fails, the locks may
// remain ours: the next round finds them in the lock view and retries.
func (r *Runner) deleteLocks(actx context.Context, leaseID storage.LeaseID, held []storage.Held) {
	for chunk := range slices.Chunk(held, shardsPerCall) {
		r.deleteLockChunk(actx, leaseID, chunk)
	}
}

// deleteLockChunk is deleteLocks for at most shardsPerCall locks.
func (r *Runner) deleteLockChunk(actx context.Context, leaseID storage.LeaseID, held []storage.Held) {
	cctx, cancel := r.opCtx(actx)
	released, err := r.store.Release(cctx, leaseID, held)
	cancel()
	if actx.Err() == nil {
		r.storageResult("release", err)
	}
	r.mu.Lock()
	epochs := make(map[sharding.ShardID]storage.Epoch, len(held))
	for _, h := range held {
		epochs[h.Shard] = h.Epoch
	}
	gone := make(map[sharding.ShardID]bool, len(released))
	for _, id := range released { // our view, ahead of the watch
		gone[id] = true
		if l, _ := r.view.locks.Get(id); l.Lease == leaseID && l.Epoch == epochs[id] {
			r.view.locks.Del(id)
		}
	}
	if err == nil {
		// A lock the call did not delete is not ours at that epoch any
		// more (moved, rewritten or deleted since): no view of ours may
		// keep it as ours (without a watch, nothing else would correct it).
		for _, h := range held {
			if l, _ := r.view.locks.Get(h.Shard); !gone[h.Shard] && l.Lease == leaseID && l.Epoch == h.Epoch {
				r.view.locks.Del(h.Shard)
			}
		}
	}
	retry := time.Now().Add(r.cfg.AcquireRetryInterval)
	for _, h := range held {
		r.shards.clearReleasing(h.Shard, h.Epoch)
		if err == nil {
			r.shardChangedLocked(h.Shard, 0, true) // a released shard may be wanted back
		} else {
			// The locks may remain ours: decided again (the orphan
			// safety net) after a pause.
			r.retryLocked(h.Shard, retry)
		}
	}
	r.mu.Unlock()
}

// drain stops admission to the shards, waits for their in-flight messages
// and runs their entities' Release hooks (reason cause), all bounded by
// DrainTimeout, the detach instant and, during Shutdown, its context.
func (r *Runner) drain(ctx context.Context, shards []*shard, cause error) {
	if len(shards) == 0 {
		return
	}
	dctx, cancel := r.drainContext(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for _, s := range shards {
		wg.Go(func() { s.host.Drain(dctx, cause) })
	}
	wg.Wait()
}

// drainContext bounds a drain: by DrainTimeout, the detach instant and,
// during Shutdown, its context.
func (r *Runner) drainContext(ctx context.Context) (context.Context, context.CancelFunc) {
	dctx, cancel := r.boundedCtx(ctx, r.cfg.DrainTimeout)
	if sctx := r.shutdownContext(); sctx != nil {
		stop := context.AfterFunc(sctx, cancel)
		return dctx, func() { stop(); cancel() }
	}
	return dctx, cancel
}

// writeProgress writes, fenced by their epochs, the final reminder
// progress of shards that stopped firing for good at those epochs, with
// the markers of entities remembered there whose put was still queued
// (reminders.Service.Progress): one store call for the first write of
// every shard, then one for the second of those that have one (markers
// past the bound of a write), and so on. It returns the shards whose
// progress is not recorded: not known exactly (their markers are written
// all the same), or a write failed (their later writes are not made).
// Shards with nothing to write are not written and do not fail.
func (r *Runner) writeProgress(actx context.Context, shards []*shard) map[sharding.ShardID]error {
	failed := map[sharding.ShardID]error{}
	var rounds [][]storage.ShardWrite // rounds[i]: the i-th write of each shard that has one
	for _, s := range shards {
		ws, err := r.reminders.Progress(s.id, s.epoch)
		if err != nil {
			failed[s.id] = err
		}
		for i, w := range ws {
			if i == len(rounds) {
				rounds = append(rounds, nil)
			}
			rounds[i] = append(rounds[i], w)
		}
	}
	refused := map[sharding.ShardID]bool{}
	for _, writes := range rounds {
		writes = slices.DeleteFunc(writes, func(w storage.ShardWrite) bool { return refused[w.Shard] })
		if len(writes) == 0 {
			break
		}
		cctx, cancel := r.opCtx(actx)
		res, err := r.store.WriteShardStates(cctx, writes)
		cancel()
		for i, w := range writes {
			e := err
			if res != nil {
				e = res[i].Err
			}
			if e != nil {
				failed[w.Shard], refused[w.Shard] = e, true
				continue
			}
			if w.Progress != nil {
				r.met.rem.Writes.Add(context.Background(), 1, r.met.attrs, metric.WithAttributes(attribute.String("op", "progress")))
			}
			if len(w.PutRemembered) > 0 {
				r.met.rem.Writes.Add(context.Background(), 1, r.met.attrs, metric.WithAttributes(attribute.String("op", "remember")))
			}
		}
	}
	if len(failed) > 0 {
		r.log.Warn("cannot record which reminder ticks fired", "shards", len(failed), "err", firstErr(failed))
	}
	return failed
}

func firstErr(m map[sharding.ShardID]error) error {
	for _, err := range m {
		return err
	}
	return nil
}
