package reminders

import (
	"errors"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// install applies the loaded state st: each reminder starts after the last
// tick the store knows fired — exactly when the progress is final (the
// predecessor stopped firing at its cut), at least once otherwise. A
// final progress must be rewritten as not final before the set fires.
// It reports false when the set was loaded already (a reload: merge).
func (set *shardSet) install(st storage.ShardState) bool {
	s := set.s
	set.mu.Lock()
	defer set.mu.Unlock()
	switch {
	case set.st.stopped:
		return true
	case set.st.loaded:
		return false
	}
	for _, err := range st.Corrupt {
		s.corruptRecord(set.id, err)
	}
	p := st.Progress
	fired := firedByRef(p)
	now := time.Now()
	for _, rec := range st.Reminders {
		r := set.newReminderLocked(rec, p, fired, now)
		set.putLocked(r)
		s.loaded.Add(1)
		if rec.Period <= 0 && r.lastFired >= 1 {
			r.deleting = true // fired before the move: delete it, fire nothing
			s.queueDelete(r)
		}
	}
	set.installRemembered(st.Remembered)
	close(set.loadedCh)
	if p != nil && p.Final {
		set.finalP = p
		set.toLocked(onLoadFinal)
	} else {
		set.toLocked(onLoad)
	}
	return true
}

// merge applies a reload's read st, made when the set's writeSeq was seq,
// to the loaded set: a reminder the store holds and the set does not (a
// registration whose outcome the runner did not learn landed) is added,
// one the set holds and the store does not (a cancellation or deletion
// landed) dropped, one both hold at the same revision keeps what the set
// knows of its ticks (at least what the store's progress shows); a final
// progress the set did not know of is rewritten before it fires again.
// A write of the set that completed after the read makes it read again;
// a cutover that began after it makes the merge wait for its end.
func (set *shardSet) merge(st storage.ShardState, seq uint64) {
	s := set.s
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.writeSeq != seq {
		return // still asking for a read: settle queues it again
	}
	p := st.Progress
	ev := onReread
	if p != nil && p.Final && set.st.final == finalNone {
		ev = onRereadFinal
	}
	if _, ok := set.st.next(ev); !ok {
		return // paused (merged after the cutover) or stopped
	}
	if ev == onRereadFinal {
		set.finalP = p
	}
	set.toLocked(ev)
	fired := firedByRef(p)
	now := time.Now()
	stored := make(map[storage.ReminderRef]bool, len(st.Reminders))
	for _, rec := range st.Reminders {
		ref := storage.ReminderRef{Entity: rec.Entity, Name: rec.Name}
		stored[ref] = true
		old := set.byKey[ref]
		if old != nil && old.rec.Revision == rec.Revision {
			continue
		}
		if old != nil {
			set.dropLocked(old)
		}
		r := set.newReminderLocked(rec, p, fired, now)
		if rec.Epoch == set.epoch {
			// Written at this epoch, so by this set, and not known to it
			// at this revision: it never fired. It starts from tick 1,
			// as a registration does.
			r.lastFired, r.next, r.catchUp, r.redeliver = 0, 1, false, false
		}
		set.putLocked(r)
		s.loaded.Add(1)
		if rec.Period <= 0 && r.lastFired >= 1 {
			r.deleting = true
			s.queueDelete(r)
		}
		set.scheduleLocked(r, now)
	}
	for ref, r := range set.byKey {
		if !stored[ref] {
			set.dropLocked(r)
		}
	}
}

// firedByRef indexes the reminders progress p lists.
func firedByRef(p *storage.ReminderProgress) map[storage.ReminderRef]storage.FiredTick {
	if p == nil {
		return nil
	}
	fired := make(map[storage.ReminderRef]storage.FiredTick, len(p.Fired))
	for _, f := range p.Fired {
		fired[storage.ReminderRef{Entity: f.Entity, Name: f.Name}] = f
	}
	return fired
}

// newReminderLocked makes the loaded reminder of rec, starting after the
// last tick progress p shows fired (at least once when p is not exact);
// fired indexes p (firedByRef).
func (set *shardSet) newReminderLocked(rec storage.Reminder, p *storage.ReminderProgress, fired map[storage.ReminderRef]storage.FiredTick, now time.Time) *reminder {
	ref := storage.ReminderRef{Entity: rec.Entity, Name: rec.Name}
	r := &reminder{set: set, ref: ref, rec: rec}
	r.F = r
	known, exact := uint64(0), false
	if p != nil && rec.Revision < p.Revision {
		exact = p.Final
		if f, ok := fired[ref]; ok && f.Revision == rec.Revision {
			known, exact = f.Tick, p.Final && !f.Uncertain
		} else {
			known = rec.LastDue(p.Cut)
		}
	}
	r.lastFired, r.next = known, known+1
	r.catchUp = !rec.DueOf(r.next).After(now)
	// Without an exact progress, a tick due before the load (or within
	// the clock skew allowed after it) may have fired on the previous
	// owner, which stopped before this one acquired.
	r.redeliver = !exact && !rec.DueOf(r.next).After(now.Add(MaxClockSkew))
	set.resolveLocked(r)
	return r
}

// rewriteStart begins the rewrite of the set's final progress as not
// final, if its state asks for it: the write to make, or nil.
func (set *shardSet) rewriteStart() *storage.ShardWrite {
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.finalP == nil || !set.toLocked(onRewrite) {
		return nil
	}
	p := *set.finalP
	p.Final = false
	return &storage.ShardWrite{Shard: set.id, Epoch: set.epoch, Progress: &p}
}

// rewriteDone ends the rewrite with the store's answer err: taken, the
// set fires (unless a cutover began meanwhile); refused by the lock, it
// waits for the runner to stop it; else it is tried again.
func (set *shardSet) rewriteDone(err error) {
	set.mu.Lock()
	defer set.mu.Unlock()
	switch {
	case err == nil:
		set.toLocked(onRewritten)
		if set.st.final == finalNone {
			set.finalP = nil
		}
	case errors.Is(err, storage.ErrFenced):
		set.toLocked(onRewriteFenced)
	default:
		set.toLocked(onRewriteFailed)
	}
}
