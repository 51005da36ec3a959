package reminders

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Run does the service's background work until ctx ends: it loads the
// reminders of acquired shards (batched), rewrites final progress records
// as not final before their sets fire, and deletes one-shot reminders that
// fired. Failed store calls are retried with a back-off while their shard
// is still owned at the set's epoch.
func (s *Service) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.starts.Run(ctx) })
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	backoff := loadRetry
	var lastWarn time.Time
	for {
		failed := s.runOnce(ctx)
		wait := time.Hour
		if failed != nil {
			if time.Since(lastWarn) >= warnEvery {
				lastWarn = time.Now()
				s.log.Warn("reminders: store call failed; retrying", "err", failed, "retry_in", backoff)
			}
			wait = backoff
		} else {
			backoff = loadRetry
			if s.pending() {
				continue
			}
		}
		t.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-s.kick: // the next Reset drops a tick not received (Go 1.23 timers)
		case <-t.C:
			// The back-off grows only when a whole wait passed: retries
			// that new work wakes early do not grow it (four of them in
			// one millisecond once took it to its 5 s bound, and the
			// shard's reminders stayed blocked 5 s after the store healed).
			if failed != nil {
				backoff = min(2*backoff, maxLoadRetry)
			}
		}
	}
}

// pending reports whether queued work is left.
func (s *Service) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.loadQ)+len(s.unfinalQ)+len(s.deleteQ)+len(s.rememberQ) > 0
}

// runOnce does one batch of each kind of queued work and returns the
// first store error (the failed work is queued again).
func (s *Service) runOnce(ctx context.Context) error {
	s.mu.Lock()
	n := min(len(s.loadQ), loadBatch)
	loads := slices.Clone(s.loadQ[:n])
	s.loadQ = s.loadQ[n:]
	unfinal := s.unfinalQ
	s.unfinalQ = nil
	n = min(len(s.deleteQ), 4096)
	deletes := slices.Clone(s.deleteQ[:n])
	s.deleteQ = s.deleteQ[n:]
	n = min(len(s.rememberQ), 4096)
	remembers := slices.Clone(s.rememberQ[:n])
	s.rememberQ = s.rememberQ[n:]
	s.mu.Unlock()
	return errors.Join(s.load(ctx, loads), s.unfinal(ctx, unfinal), s.deleteFired(ctx, deletes), s.writeRemembered(ctx, remembers))
}

// live filters sets that are still current and not stopped, each once: a
// queue may hold a set twice (a cutover that failed again queues its
// rewrite again while a failed one is queued for a retry), and a store
// call listing a shard twice is refused whole — which once kept a shard's
// reminders from firing for good.
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

// load reads the state of the sets' shards and installs it.
func (s *Service) load(ctx context.Context, sets []*shardSet) error {
	sets = s.live(sets)
	if len(sets) == 0 {
		return nil
	}
	ids := make([]sharding.ShardID, len(sets))
	for i, set := range sets {
		ids[i] = set.id
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	sts, err := s.store.ReadShardStates(cctx, ids)
	cancel()
	if err != nil {
		s.requeue(&s.loadQ, sets)
		return fmt.Errorf("load the reminders of %d shards: %w", len(ids), err)
	}
	var blocked []*shardSet
	for i, set := range sets {
		if set.install(sts[i]) {
			blocked = append(blocked, set)
		}
	}
	if len(blocked) > 0 {
		s.mu.Lock()
		s.unfinalQ = append(s.unfinalQ, blocked...)
		s.mu.Unlock()
		s.wake()
	}
	return nil
}

func (s *Service) requeue(q *[]*shardSet, sets []*shardSet) {
	s.mu.Lock()
	*q = append(*q, sets...)
	s.mu.Unlock()
}

// unfinal rewrites the sets' final progress records as not final (fenced
// by the sets' epochs), with the same content — exact when it was
// written, a lower bound of what fired from then on, which is what a
// later owner after an unplanned loss needs — then lets them fire.
func (s *Service) unfinal(ctx context.Context, sets []*shardSet) error {
	sets = s.live(sets)
	if len(sets) == 0 {
		return nil
	}
	writes := make([]storage.ShardWrite, 0, len(sets))
	written := make([]*storage.ReminderProgress, 0, len(sets))
	wsets := make([]*shardSet, 0, len(sets))
	for _, set := range sets {
		set.mu.Lock()
		fp := set.finalP
		// A paused set (a cutover) writes its own final progress next:
		// Resume queues the rewrite again if the cutover fails.
		skip := fp == nil || set.paused || set.stopped
		if !skip {
			set.unfinaling = true
		}
		set.mu.Unlock()
		if skip {
			continue
		}
		p := *fp
		p.Final = false
		writes = append(writes, storage.ShardWrite{Shard: set.id, Epoch: set.epoch, Progress: &p})
		written = append(written, fp)
		wsets = append(wsets, set)
	}
	if len(writes) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	res, err := s.store.WriteShardStates(cctx, writes)
	cancel()
	var retry []*shardSet
	var first error
	for i, set := range wsets {
		var e error
		switch {
		case res == nil:
			e = err
		default:
			e = res[i].Err
		}
		switch {
		case e == nil:
			s.met.Writes.Add(context.Background(), 1, s.met.Attrs, opAttr("progress"))
			set.unblock(written[i])
		case errors.Is(e, storage.ErrFenced):
			// The shard moved on: the runner drops the set.
			set.endUnfinal()
		default:
			set.endUnfinal()
			retry = append(retry, set)
			if first == nil {
				first = fmt.Errorf("rewrite the reminder progress of shard %d: %w", set.id, e)
			}
		}
	}
	s.requeue(&s.unfinalQ, retry)
	return first
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
		if set.byKey[r.ref] == r && !set.stopped {
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
