package reminders

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Retry delays of a tick that could not be delivered.
const (
	deliverRetry  = 20 * time.Millisecond // the shard was not admitting (a cutover), or the mailbox was full
	activateRetry = 100 * time.Millisecond
	maxRetryDelay = time.Minute
	unknownRetry  = time.Minute // the reminder's kind or method is not registered here
	// Store calls that failed are made again after retryFirst, doubling:
	// to maxRetry for the calls a set waits for before it can fire (its
	// load, the rewrite of a final progress: this bounds how long it
	// waits once the store answers again), to maxSideRetry for the others
	// (one-shot deletions, remembered markers).
	retryFirst   = 250 * time.Millisecond
	maxRetry     = time.Second
	maxSideRetry = 5 * time.Second
	// rewriteBatch bounds the rewrites of one store call.
	rewriteBatch = 1024
	// loadBatch is how many shards one store read loads: small reads, one
	// after the other, so a runner loading many reminders (a cold start)
	// leaves the store room for the lock transactions of the runners
	// still acquiring their shards.
	loadBatch      = 8
	warnEvery      = time.Minute
	maxDeleteBatch = storage.MaxShardWriteOps
)

// MaxClockSkew is how far apart the runners' wall clocks are assumed to be
// at most: reminders' due times are wall times.
const MaxClockSkew = time.Second

// shardSet holds the reminders of one shard owned at one epoch. Its
// control state is st (setstate.go), changed by toLocked only; only a set
// that fires has entries in the scheduler.
type shardSet struct {
	s        *Service
	id       sharding.ShardID
	epoch    storage.Epoch
	ctx      context.Context // the shard's: ends with the ownership
	loadedCh chan struct{}   // closed when loaded

	// writeMu serializes this set's reminder writes with their
	// application (taken before mu, never while holding it).
	writeMu sync.Mutex

	mu sync.Mutex
	st setState
	// finalP is the content of the final progress the store may hold for
	// the shard (st.final: the predecessor's, loaded, or ours): rewritten
	// as not final before the set fires.
	finalP  *storage.ReminderProgress
	writers int // registrations and cancellations in flight
	// writeSeq counts the set's reminder writes that ended (a reload's
	// read older than one of them is not merged).
	writeSeq uint64
	byKey    map[storage.ReminderRef]*reminder

	// queued: the set is in Service.work (or its call runs); lastErr: the
	// outcome of its last store call (both under s.mu). since: when the
	// set last became unable to fire while owned and not in a cutover
	// (zero while it fires, is paused or is stopped: the watchdog's
	// clock).
	queued  bool
	lastErr error
	since   time.Time

	// remembered are the shard's remembered entities (remembered.go);
	// early, those activated before the load (added at the load).
	remembered map[storage.EntityRef]*rememberedEntity
	early      map[storage.EntityRef]struct{}
}

// reminder is one loaded reminder and its firing state.
type reminder struct {
	schedule.Entry
	set *shardSet
	ref storage.ReminderRef
	rec storage.Reminder

	// Under set.mu.
	kind      *hosting.Kind
	h         *entity.Handler
	lastFired uint64 // the last tick whose handler started (0: none)
	next      uint64 // the next tick to fire
	firing    uint64 // the tick in flight
	inFlight  bool
	catchUp   bool // the first fire after a load, overdue at the load
	redeliver bool // the first fire after an uncertain load
	removed   bool // replaced, cancelled, deleted, or its set stopped
	deleting  bool // a one-shot that fired, queued for deletion
	failures  int
}

func (set *shardSet) active() bool { return set.st.fires() }

// toLocked moves the set's state by ev (setState.next) and reports
// whether it applied; a refused event changes nothing. It then brings
// the rest in line with the new state: the reminders are in the
// scheduler exactly while the set fires, the remembered entities are
// activated while it activates, the watchdog's clock runs while the set
// cannot fire although owned and not in a cutover, and the set is queued
// whenever its state asks for a store call — so that no transition can
// leave a set waiting for a call nobody will make.
func (set *shardSet) toLocked(ev setEvent) bool {
	from := set.st
	to, ok := from.next(ev)
	if !ok {
		return false
	}
	if CheckInvariants {
		err := to.check()
		if err == nil && to.final != finalNone && set.finalP == nil {
			err = fmt.Errorf("a final progress to rewrite, of unknown content")
		}
		if err != nil {
			panic(fmt.Sprintf("reminders: shard %d: %+v on %s: %v", set.id, from, ev, err))
		}
	}
	set.st = to
	if loading := to.loadPending(); loading != from.loadPending() {
		if loading {
			set.s.loading.Add(1)
		} else {
			set.s.loading.Add(-1)
		}
	}
	if to.fires() != from.fires() {
		if to.fires() {
			set.scheduleAllLocked()
		} else {
			set.unscheduleAllLocked()
		}
	}
	if to.activating() != from.activating() {
		if to.activating() {
			set.activateAllLocked()
		} else {
			set.unscheduleRememberedLocked(false)
		}
	}
	switch {
	case to.cause() == "":
		set.since = time.Time{}
	case set.since.IsZero():
		set.since = time.Now()
	}
	if to.work() != workNone {
		set.s.needLocked(set)
	}
	return true
}

// beginWrite admits a registration (put) or cancellation of ref, holding
// the set's write lock until endWrite: the set must be firing or blocked
// (not paused or stopped), hold fewer than MaxPerShard reminders for a new
// one, and hold ref for a cancellation. Lock order: writeMu, then mu.
func (set *shardSet) beginWrite(ref storage.ReminderRef, put bool) error {
	set.writeMu.Lock()
	set.mu.Lock()
	defer set.mu.Unlock()
	var err error
	switch {
	case set.st.stopped || set.st.paused:
		err = errMoving
	case put && set.byKey[ref] == nil && len(set.byKey) >= set.s.cfg.MaxPerShard:
		err = fmt.Errorf("%w: shard %d holds %d reminders, at most %d", entity.ErrTooManyReminders, set.id, len(set.byKey), set.s.cfg.MaxPerShard)
	case !put && (set.byKey[ref] == nil || set.byKey[ref].deleting):
		err = fmt.Errorf("%w: %s %q has no reminder %q", entity.ErrNoReminder, ref.Entity.Kind, ref.Entity.ID, ref.Name)
	}
	if err != nil {
		set.writeMu.Unlock()
		return err
	}
	set.writers++
	return nil
}

func (set *shardSet) endWrite() {
	set.mu.Lock()
	set.writers--
	set.writeSeq++
	set.mu.Unlock()
	set.writeMu.Unlock()
}

// put installs a registered (written) reminder, replacing one of the same
// key, and schedules it. A new registration starts from tick 1, certain.
func (set *shardSet) put(rec storage.Reminder) {
	ref := storage.ReminderRef{Entity: rec.Entity, Name: rec.Name}
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.st.stopped {
		return
	}
	if old := set.byKey[ref]; old != nil {
		set.dropLocked(old)
	}
	r := &reminder{set: set, ref: ref, rec: rec, next: 1}
	r.F = r
	set.resolveLocked(r)
	set.putLocked(r)
	set.s.loaded.Add(1)
	set.scheduleLocked(r, time.Now())
}

// remove drops a cancelled reminder.
func (set *shardSet) remove(ref storage.ReminderRef) {
	set.mu.Lock()
	defer set.mu.Unlock()
	if r := set.byKey[ref]; r != nil {
		set.dropLocked(r)
	}
}

func (set *shardSet) dropLocked(r *reminder) {
	r.removed = true
	set.s.sched.Stop(&r.Entry)
	if set.byKey[r.ref] == r {
		delete(set.byKey, r.ref)
		set.s.loaded.Add(-1)
	}
}

// resolveLocked finds the reminder's kind and handler among the kinds
// registered here (nil when unknown: the reminder waits).
func (set *shardSet) resolveLocked(r *reminder) {
	r.kind, r.h = nil, nil
	k := set.s.host.Kind(r.rec.Entity.Kind)
	if k == nil {
		return
	}
	h, ok := k.Desc.Handler(r.rec.Method)
	if !ok || h.TickKind() != entity.ReminderHandler {
		return
	}
	r.kind, r.h = k, h
}

// scheduleLocked puts r's next tick in the scheduler, if the set fires and
// r has a tick left: at its due time, or through the catch-up queue when
// it was overdue at the load (a Skip reminder after an uncertain load
// skips to its next tick due after now).
func (set *shardSet) scheduleLocked(r *reminder, now time.Time) {
	if !set.active() || r.removed || r.inFlight || r.deleting {
		return
	}
	if r.rec.Period <= 0 && r.next > 1 {
		return // a one-shot that fired
	}
	if r.h == nil {
		set.resolveLocked(r)
		if r.h == nil {
			set.s.corrupt(set.id, r.rec, "its kind or reminder method is not registered on this runner; retried every minute")
			set.s.sched.Schedule(&r.Entry, schedule.Now()+int64(unknownRetry))
			return
		}
	}
	due := r.rec.DueOf(r.next)
	switch {
	case due.After(now):
		set.s.sched.Schedule(&r.Entry, schedule.At(due))
	case r.catchUp && r.rec.Skip && r.redeliver && r.rec.Period > 0:
		r.next = r.rec.LastDue(now) + 1
		r.catchUp = false
		set.s.sched.Schedule(&r.Entry, schedule.At(r.rec.DueOf(r.next)))
	case r.catchUp:
		set.s.sched.CatchUp(&r.Entry)
	default:
		set.s.sched.Schedule(&r.Entry, schedule.Now())
	}
}

// scheduleAllLocked schedules every reminder (the set became active).
func (set *shardSet) scheduleAllLocked() {
	now := time.Now()
	for _, r := range set.byKey {
		set.scheduleLocked(r, now)
	}
}

// unscheduleAllLocked takes every reminder out of the scheduler.
func (set *shardSet) unscheduleAllLocked() {
	for _, r := range set.byKey {
		set.s.sched.Stop(&r.Entry)
	}
}

// Fire implements schedule.Firer: deliver r's due tick to its entity.
func (r *reminder) Fire(_ *schedule.Entry, _ int64) {
	set := r.set
	s := set.s
	set.mu.Lock()
	if !set.active() || r.removed || r.inFlight || r.deleting {
		set.mu.Unlock()
		return
	}
	if r.h == nil {
		set.scheduleLocked(r, time.Now()) // unknown: retried later
		set.mu.Unlock()
		return
	}
	now := time.Now()
	last := r.rec.LastDue(now)
	if last < r.next { // not due on the wall clock yet (the clocks drifted)
		s.sched.Schedule(&r.Entry, schedule.At(r.rec.DueOf(r.next)))
		set.mu.Unlock()
		return
	}
	tick := last
	if r.rec.Period <= 0 {
		tick = 1
	}
	t := entity.Tick{Name: r.rec.Name, Tick: tick, Due: r.rec.DueOf(tick), Missed: tick - r.next, Redelivered: r.redeliver, Payload: r.rec.Payload}
	catchUp := r.catchUp
	r.inFlight, r.firing = true, tick
	kind, h, id, epoch := r.kind, r.h, set.id, set.epoch
	set.mu.Unlock()

	req, err := h.TickRequest(kind.Opts.Codec, t)
	if err != nil {
		// A payload this handler cannot decode never will: the tick is
		// dropped (counted as fired), the reminder goes on.
		s.corrupt(id, r.rec, fmt.Sprintf("payload: %v", err))
		r.done(true)
		return
	}
	sh := s.host.Lookup(id)
	if sh == nil || sh.Epoch() != epoch || !sh.Fire(kind, h, r.rec.Entity.ID, req, r.done) {
		set.mu.Lock()
		r.inFlight = false
		if set.active() && !r.removed {
			s.sched.Schedule(&r.Entry, schedule.Now()+int64(deliverRetry))
		}
		set.mu.Unlock()
		return
	}
	if !catchUp {
		s.met.FireLag.Record(context.Background(), max(0, time.Since(t.Due).Seconds()), s.met.Attrs)
	}
}

// done is the delivered tick's outcome (hosting.Shard.Fire): started, it
// counts as fired and the next tick is scheduled; else it is tried again
// after a back-off while the set fires. Started while the set no longer
// fires — it stopped or paused while the tick waited in the mailbox — the
// tick is withdrawn: not counted, and done reports false so that no
// handler runs it here (the next owner, or this set once it resumes,
// fires it). It reports whether the handler may run.
func (r *reminder) done(started bool) bool {
	set := r.set
	s := set.s
	set.mu.Lock()
	defer set.mu.Unlock()
	r.inFlight = false
	if started && !set.active() {
		// The set stopped (its shard left) or paused (a cutover) while
		// the tick waited to run: it is not fired here. A paused set
		// that resumes schedules it again; a stopped one leaves it to the
		// next owner, whose progress does not count it.
		return false
	}
	if !started {
		r.failures++
		if set.active() && !r.removed {
			d := min(activateRetry<<min(r.failures-1, 10), maxRetryDelay)
			s.sched.Schedule(&r.Entry, schedule.Now()+int64(d))
		}
		return false
	}
	r.failures = 0
	r.lastFired, r.next = r.firing, r.firing+1
	r.catchUp, r.redeliver = false, false
	s.met.Fires.Add(context.Background(), 1, s.met.Attrs)
	if r.rec.Period <= 0 {
		if !r.removed {
			r.deleting = true
			s.queueDelete(r)
		}
		return true
	}
	set.scheduleLocked(r, time.Now())
	return true
}

// pause stops firing (a cutover began).
func (set *shardSet) pause() {
	set.mu.Lock()
	defer set.mu.Unlock()
	set.toLocked(onPause)
}

// resume undoes pause: the set fires again, once the final progress the
// store may hold (ours, written by the cutover, or the predecessor's,
// loaded and not rewritten yet: a set paused at its load skips the
// rewrite) is rewritten as not final.
func (set *shardSet) resume() {
	set.mu.Lock()
	defer set.mu.Unlock()
	set.toLocked(onResume)
}

// stop ends the set: nothing fires any more. Its reminders are kept (for
// a last Progress) unless clear.
func (set *shardSet) stop(clear bool) {
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.toLocked(onStop) {
		set.unscheduleAllLocked()
	}
	if clear {
		// Kept otherwise: entities remembered before the set loaded are
		// written with the release's progress (unstoredRemembered).
		set.early = nil
	}
	set.unscheduleRememberedLocked(clear)
	if clear && len(set.byKey) > 0 {
		for _, r := range set.byKey {
			r.removed = true
		}
		set.s.loaded.Add(-int64(len(set.byKey)))
		set.byKey = nil
	}
}

// putLocked enters r in set.byKey (nil while the set has no reminder: a
// runner owns many shards without any).
func (set *shardSet) putLocked(r *reminder) {
	if set.byKey == nil {
		set.byKey = map[storage.ReminderRef]*reminder{}
	}
	set.byKey[r.ref] = r
}

// progress computes the set's final progress (see Service.Progress).
func (set *shardSet) progress() (storage.ReminderProgress, bool, error) {
	set.mu.Lock()
	defer set.mu.Unlock()
	p := storage.ReminderProgress{Shard: set.id, Epoch: set.epoch, Final: true, Cut: time.Now().UTC()}
	switch {
	case set.writers > 0:
		return p, false, fmt.Errorf("shard %d: %d reminder registrations or cancellations still being written", set.id, set.writers)
	case set.st.rewriting:
		return p, false, fmt.Errorf("shard %d: the previous reminder progress is still being rewritten", set.id)
	case !set.st.loaded || len(set.byKey) == 0:
		return p, false, nil
	case !set.st.paused && !set.st.stopped:
		return p, false, fmt.Errorf("shard %d: its reminders still fire (no cutover or release began)", set.id)
	}
	set.unscheduleAllLocked()
	for _, r := range set.byKey {
		// A reminder loaded without an exact progress and not fired since
		// is only known to have fired up to lastFired: the next owner
		// must treat its first fire as a redelivery too.
		if r.redeliver || r.lastFired != r.rec.LastDue(p.Cut) {
			p.Fired = append(p.Fired, storage.FiredTick{Entity: r.ref.Entity, Name: r.ref.Name, Revision: r.rec.Revision, Tick: r.lastFired, Uncertain: r.redeliver})
		}
	}
	slices.SortFunc(p.Fired, func(a, b storage.FiredTick) int {
		return strings.Compare(a.Entity.String()+"/"+a.Name, b.Entity.String()+"/"+b.Name)
	})
	set.finalP = &p
	set.toLocked(onProgress)
	return p, true, nil
}

// list returns the infos of e's reminders.
func (set *shardSet) list(e storage.EntityRef) []entity.ReminderInfo {
	set.mu.Lock()
	defer set.mu.Unlock()
	var out []entity.ReminderInfo
	for _, r := range set.byKey {
		if r.ref.Entity != e {
			continue
		}
		info := entity.ReminderInfo{Name: r.rec.Name, Method: r.rec.Method,
			Schedule: entity.Schedule{First: r.rec.First, Period: r.rec.Period}}
		if r.rec.Skip {
			info.Schedule.Missed = entity.Skip
		}
		if !(r.rec.Period <= 0 && r.next > 1) && !r.deleting {
			info.Next = r.rec.DueOf(r.next)
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b entity.ReminderInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}
