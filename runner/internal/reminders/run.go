package reminders

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Run does the service's background work until ctx ends, in two loops
// that never wait for each other: the set loop makes the store calls the
// sets' states ask for (the reads that load or reload a shard's state,
// the rewrites of final progress records as not final) and runs the
// watchdog; the side loop deletes one-shot reminders that fired and
// writes the markers of remembered entities.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.starts.Run(ctx) })
	wg.Go(func() { s.runSide(ctx) })
	s.runSets(ctx)
}

// runSets is the set loop. Each round makes at most one read (of up to
// loadBatch shards) and one write (the rewrites of up to rewriteBatch
// shards), taking the queued sets in order; a set whose call failed is
// queued again at the end. After a failed call, calls of that kind wait
// their back-off (retryFirst doubling to maxRetry; new work does not wake
// them early, so a failing store sees at most one call of each kind per
// back-off), which bounds how long a set waits once the store answers
// again: see the liveness rule in the package documentation.
func (s *Service) runSets(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var reads, writes retryClock
	var lastWarn time.Time
	nextWatch := time.Now().Add(s.cfg.WatchEvery)
	for {
		now := time.Now()
		if !now.Before(nextWatch) {
			s.watch(now)
			nextWatch = now.Add(s.cfg.WatchEvery)
		}
		next, failed := s.setRound(ctx, now, &reads, &writes)
		if failed != nil && time.Since(lastWarn) >= warnEvery {
			lastWarn = time.Now()
			s.log.Warn("reminders: store call failed; retrying", "err", failed, "retry_in", max(reads.wait, writes.wait))
		}
		wait := time.Until(nextWatch)
		if !next.IsZero() {
			if wait = min(wait, time.Until(next)); wait <= 0 {
				continue
			}
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.kick: // the next Reset drops a tick not received (Go 1.23 timers)
		case <-t.C:
		}
	}
}

// retryClock is the back-off of one kind of store call of the set loop.
type retryClock struct {
	at   time.Time     // no call before
	wait time.Duration // the last back-off
}

func (c *retryClock) failed(now time.Time) {
	c.wait = min(max(2*c.wait, retryFirst), maxRetry)
	c.at = now.Add(c.wait)
}

func (c *retryClock) ok() { *c = retryClock{} }

// setRound makes one read and one write, each for the sets at the front
// of its queue, unless that kind of call is backing off, and returns when
// the next round is due (zero: when new work wakes the loop) and the
// first store error. Its work is proportional to the sets it calls for.
func (s *Service) setRound(ctx context.Context, now time.Time, reads, writes *retryClock) (next time.Time, failed error) {
	var toRead, toWrite []*shardSet
	if !now.Before(reads.at) {
		toRead = s.take(&s.readQ, workRead, loadBatch)
	}
	if !now.Before(writes.at) {
		toWrite = s.take(&s.rewriteQ, workRewrite, rewriteBatch)
	}
	var errs []error
	if len(toRead) > 0 {
		if err := s.read(ctx, toRead); err != nil {
			reads.failed(time.Now())
			errs = append(errs, err)
		} else {
			reads.ok()
		}
	}
	if len(toWrite) > 0 {
		if err := s.rewrite(ctx, toWrite); err != nil {
			writes.failed(time.Now())
			errs = append(errs, err)
		} else {
			writes.ok()
		}
	}
	s.settle(toRead)
	s.settle(toWrite)
	// The next round: as soon as a kind of call that queued sets wait
	// for may be made again.
	after := time.Now()
	s.mu.Lock()
	readsWait, writesWait := len(s.readQ) > 0, len(s.rewriteQ) > 0
	s.mu.Unlock()
	if readsWait {
		next = laterOf(reads.at, after)
	}
	if at := laterOf(writes.at, after); writesWait && (next.IsZero() || at.Before(next)) {
		next = at
	}
	return next, errors.Join(errs...)
}

func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// take pops from the front of queue q up to n sets whose state asks for
// call w: they stay marked queued while their call runs (settle puts them
// back). A set it pops whose state asks for the other call moves to that
// queue; one that asks for none, or is no longer current (replaced,
// forgotten, its ownership ending: the runner stops it), leaves the
// queues (toLocked queues it again when it asks for a call).
func (s *Service) take(q *[]*shardSet, w work, n int) []*shardSet {
	var out []*shardSet
	taken := make(map[*shardSet]bool)
	for len(out) < n {
		s.mu.Lock()
		if len(*q) == 0 {
			s.mu.Unlock()
			break
		}
		set := (*q)[0]
		(*q)[0] = nil
		*q = (*q)[1:]
		s.mu.Unlock()
		if taken[set] {
			continue // a duplicate (watch): one entry is enough
		}
		set.mu.Lock() // lock order: the set's mutex, then the service's
		now := set.st.work()
		s.mu.Lock()
		switch {
		case now == w && s.sets[set.id] == set && set.ctx.Err() == nil:
			out = append(out, set)
			taken[set] = true
		default:
			s.requeueLocked(set, now)
		}
		s.mu.Unlock()
		set.mu.Unlock()
	}
	return out
}

// settle puts each set whose call ended back at the end of the queue of
// the call its state asks for now, or out of the queues.
func (s *Service) settle(sets []*shardSet) {
	for _, set := range sets {
		set.mu.Lock()
		w := set.st.work()
		s.mu.Lock()
		s.requeueLocked(set, w)
		s.mu.Unlock()
		set.mu.Unlock()
	}
}

// requeueLocked puts set, marked queued and in no queue, at the end of
// the queue of call w, or out of the queues (w none, or the set is no
// longer current). Under set.mu and s.mu.
func (s *Service) requeueLocked(set *shardSet, w work) {
	switch {
	case w == workNone || s.sets[set.id] != set || set.ctx.Err() != nil:
		set.queued = false
	case w == workRead:
		s.readQ = append(s.readQ, set)
	default:
		s.rewriteQ = append(s.rewriteQ, set)
	}
}

// live filters sets that are still current and not stopped, each once (a
// store call listing a shard twice is refused whole — which once kept a
// shard's reminders from firing for good).
func (s *Service) live(sets []*shardSet) []*shardSet {
	out := sets[:0:0]
	seen := make(map[*shardSet]bool, len(sets))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, set := range sets {
		if s.sets[set.id] == set && set.ctx.Err() == nil && !seen[set] {
			seen[set] = true
			out = append(out, set)
		}
	}
	return out
}

// read reads the state of the sets' shards and installs it (a set not
// loaded yet) or merges it (a set being reloaded); it returns the store's
// error, the failed sets' lastErr.
func (s *Service) read(ctx context.Context, sets []*shardSet) error {
	sets = s.live(sets)
	if len(sets) == 0 {
		return nil
	}
	ids := make([]sharding.ShardID, len(sets))
	seqs := make([]uint64, len(sets))
	for i, set := range sets {
		ids[i] = set.id
		set.mu.Lock()
		seqs[i] = set.writeSeq
		set.mu.Unlock()
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	sts, err := s.store.ReadShardStates(cctx, ids)
	cancel()
	if err != nil {
		err = fmt.Errorf("load the reminders of %d shards: %w", len(ids), err)
		s.setErr(sets, err)
		return err
	}
	s.setErr(sets, nil)
	for i, set := range sets {
		if !set.install(sts[i]) {
			set.merge(sts[i], seqs[i])
		}
	}
	return nil
}

// setErr records the outcome of the sets' last store call (the
// watchdog's log says it).
func (s *Service) setErr(sets []*shardSet, err error) {
	s.mu.Lock()
	for _, set := range sets {
		set.lastErr = err
	}
	s.mu.Unlock()
}

// rewrite rewrites the sets' final progress records as not final (fenced
// by the sets' epochs), with the same content — exact when it was
// written, a lower bound of what fired from then on, which is what a
// later owner after an unplanned loss needs — then lets them fire.
func (s *Service) rewrite(ctx context.Context, sets []*shardSet) error {
	sets = s.live(sets)
	var writes []storage.ShardWrite
	var wsets []*shardSet
	for _, set := range sets {
		if w := set.rewriteStart(); w != nil {
			writes = append(writes, *w)
			wsets = append(wsets, set)
		}
	}
	if len(writes) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	res, err := s.store.WriteShardStates(cctx, writes)
	cancel()
	var first error
	for i, set := range wsets {
		e := err
		if res != nil {
			e = res[i].Err
		}
		switch {
		case e == nil:
			s.met.Writes.Add(context.Background(), 1, s.met.Attrs, opAttr("progress"))
		case errors.Is(e, storage.ErrFenced):
			// The shard moved on: the runner stops the set.
		default:
			e = fmt.Errorf("rewrite the reminder progress of shard %d: %w", set.id, e)
			if first == nil {
				first = e
			}
		}
		s.setErr([]*shardSet{set}, e)
		set.rewriteDone(e)
	}
	return first
}

// watch is the watchdog, a safety net under the liveness rule: a set that
// could not fire for StuckAfter while its shard is owned here and not in
// a cutover is reloaded from the store (read again and merged: a set not
// loaded yet is queued for its load; a fenced rewrite is tried again
// after), logged at WARN with its shard and cause, and counted
// (Metrics.Reloads, by cause). Its clock restarts: a set that still
// cannot fire is reloaded again after StuckAfter.
func (s *Service) watch(now time.Time) {
	s.mu.Lock()
	sets := make([]*shardSet, 0, len(s.sets))
	for _, set := range s.sets {
		sets = append(sets, set)
	}
	s.mu.Unlock()
	type stuckSet struct {
		set    *shardSet
		cause  string
		waited time.Duration
	}
	var stuck []stuckSet
	for _, set := range sets {
		set.mu.Lock()
		cause := set.st.cause()
		if cause != "" && !set.since.IsZero() && now.Sub(set.since) >= s.cfg.StuckAfter && set.ctx.Err() == nil {
			stuck = append(stuck, stuckSet{set, cause, now.Sub(set.since)})
			set.since = now
			set.toLocked(onReload) // a loaded set reads again
			// Queued again even if it is marked queued: a set the queues
			// lost is the kind of bug this net is for (take drops the
			// duplicate this may make).
			s.mu.Lock()
			set.queued = false
			s.mu.Unlock()
			s.needLocked(set)
		}
		set.mu.Unlock()
	}
	for i, st := range stuck {
		s.met.Reloads.Add(context.Background(), 1, s.met.Attrs, metric.WithAttributes(attribute.String("cause", st.cause)))
		if i == maxStuckLogs {
			s.log.Warn("reminders: the reminders of more shards cannot fire; reloaded from the store", "shards", len(stuck)-i)
		}
		if i >= maxStuckLogs {
			continue
		}
		s.mu.Lock()
		err := st.set.lastErr
		s.mu.Unlock()
		s.log.Warn("reminders: a shard's reminders cannot fire; reloading them from the store",
			"shard", st.set.id, "epoch", st.set.epoch, "cause", st.cause, "for", st.waited.Round(time.Millisecond), "err", err)
	}
}

// maxStuckLogs bounds the sets the watchdog logs one by one in a pass.
const maxStuckLogs = 8

// runSide is the side loop: one-shot deletions and remembered markers,
// retried after a back-off (retryFirst doubling to maxSideRetry) when a
// call failed.
func (s *Service) runSide(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	backoff := retryFirst
	var lastWarn time.Time
	for {
		failed := s.sideOnce(ctx)
		wait := time.Hour
		if failed != nil {
			if time.Since(lastWarn) >= warnEvery {
				lastWarn = time.Now()
				s.log.Warn("reminders: store call failed; retrying", "err", failed, "retry_in", backoff)
			}
			wait = backoff
		} else {
			backoff = retryFirst
			if s.sidePending() {
				continue
			}
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.sideKick:
		case <-t.C:
			// The back-off grows only when a whole wait passed: retries
			// that new work wakes early do not grow it.
			if failed != nil {
				backoff = min(2*backoff, maxSideRetry)
			}
		}
	}
}

// sidePending reports whether side work is queued.
func (s *Service) sidePending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.deleteQ)+len(s.rememberQ) > 0
}

// sideOnce does one batch of each kind of side work and returns the
// first store error (the failed work is queued again).
func (s *Service) sideOnce(ctx context.Context) error {
	s.mu.Lock()
	n := min(len(s.deleteQ), 4096)
	deletes := slices.Clone(s.deleteQ[:n])
	s.deleteQ = s.deleteQ[n:]
	n = min(len(s.rememberQ), 4096)
	remembers := slices.Clone(s.rememberQ[:n])
	s.rememberQ = s.rememberQ[n:]
	s.mu.Unlock()
	return errors.Join(s.deleteFired(ctx, deletes), s.writeRemembered(ctx, remembers))
}

// queueDelete queues the deletion of a one-shot reminder that fired.
func (s *Service) queueDelete(r *reminder) {
	s.mu.Lock()
	s.deleteQ = append(s.deleteQ, r)
	s.mu.Unlock()
	s.wake()
}

// deleteFired deletes one-shot reminders that fired, batched per shard,
// fenced by their sets' epochs; each is deleted only if it is still the
// reminder of its key (under the set's write lock, so no registration of
// the same name interleaves).
func (s *Service) deleteFired(ctx context.Context, rs []*reminder) error {
	bySet := map[*shardSet][]*reminder{}
	var order []*shardSet
	for _, r := range rs {
		if _, ok := bySet[r.set]; !ok {
			order = append(order, r.set)
		}
		bySet[r.set] = append(bySet[r.set], r)
	}
	var first error
	for _, set := range s.live(order) {
		for chunk := range slices.Chunk(bySet[set], maxDeleteBatch) {
			if err := s.deleteChunk(ctx, set, chunk); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

func (s *Service) deleteChunk(ctx context.Context, set *shardSet, rs []*reminder) error {
	set.writeMu.Lock()
	defer set.writeMu.Unlock()
	set.mu.Lock()
	var refs []storage.ReminderRef
	var live []*reminder
	for _, r := range rs {
		if set.byKey[r.ref] == r && !set.st.stopped {
			refs = append(refs, r.ref)
			live = append(live, r)
		}
	}
	set.mu.Unlock()
	if len(refs) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	_, err := s.write(cctx, storage.ShardWrite{Shard: set.id, Epoch: set.epoch, DeleteReminders: refs}, "delete")
	cancel()
	switch {
	case err == nil:
		set.mu.Lock()
		for _, r := range live {
			if set.byKey[r.ref] == r {
				set.dropLocked(r)
			}
		}
		set.writeSeq++
		set.mu.Unlock()
		return nil
	case errors.Is(err, storage.ErrFenced):
		return nil // the next owner deletes them (the progress says they fired)
	default:
		s.mu.Lock()
		s.deleteQ = append(s.deleteQ, live...)
		s.mu.Unlock()
		return fmt.Errorf("delete %d fired one-shot reminders of shard %d: %w", len(refs), set.id, err)
	}
}

// corrupt logs a stored reminder this runner skips (once per key) and
// counts it (every time).
func (s *Service) corrupt(id sharding.ShardID, rec storage.Reminder, why string) {
	s.met.Corrupt.Add(context.Background(), 1, s.met.Attrs)
	key := storage.ReminderKey(id, rec.Entity, rec.Name)
	if s.firstLog(key) {
		s.log.Warn("reminder skipped", "key", key, "method", rec.Method, "why", why)
	}
}

// corruptRecord logs a stored record that did not decode (once per key).
func (s *Service) corruptRecord(id sharding.ShardID, err error) {
	s.met.Corrupt.Add(context.Background(), 1, s.met.Attrs)
	var ce *storage.CorruptError
	key := err.Error()
	if errors.As(err, &ce) {
		key = string(ce.Keyspace) + "/" + ce.Key
	}
	if s.firstLog(key) {
		s.log.Warn("corrupt reminder record skipped", "shard", id, "key", key, "err", err)
	}
}

// maxLoggedKeys bounds the keys remembered as logged; past it, records are
// counted (sharding.reminders_corrupt) but no longer logged.
const maxLoggedKeys = 10000

// firstLog reports whether key was not logged yet, and remembers it.
func (s *Service) firstLog(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, done := s.logged[key]; done || len(s.logged) >= maxLoggedKeys {
		return false
	}
	s.logged[key] = struct{}{}
	return true
}
