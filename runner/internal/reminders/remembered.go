package reminders

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Remembered entities. Each shard's set holds, beside its reminders, the
// entities remembered for the shard (remembered/{shard}/{kind/id}), loaded
// by the same read. The service:
//   - records an entity the first time it activates on a shard where it is
//     not remembered yet (Remember: one fenced put, queued and batched per
//     shard; nothing for an entity already remembered);
//   - activates every remembered entity without a message once the set is
//     loaded (and again when a given-up cutover resumes the set), through
//     its own scheduler's catch-up queue, at most StartRate a second;
//   - activates it again after a growing back-off when its activation
//     failed or its instance panicked (Failed);
//   - deletes the marker when the entity asks to be forgotten (Forget,
//     fenced, serialized with the puts by the set's write lock).

// Back-off of a remembered entity whose activation failed or whose
// instance panicked: from activateRetry, doubling, to maxRememberedRetry.
const maxRememberedRetry = 30 * time.Second

// rememberedEntity is one remembered entity of a set.
type rememberedEntity struct {
	schedule.Entry
	set *shardSet
	ref storage.EntityRef

	// Under set.mu.
	queued  bool // its put is queued (not in the store yet)
	removed bool // forgotten, or its set stopped
	// forgetting: its marker's delete is being written (ForgetEntity):
	// a release's write must not put the marker back.
	forgetting bool
	inFlight   bool // an activation is queued in its mailbox
	failures   int
	// stored is closed when the queued put ended: written, or fenced
	// (fenced says which); nil when no put was queued.
	stored chan struct{}
	fenced bool
}

// activating reports whether the set's remembered entities may be
// activated: loaded, not paused (a cutover) nor stopped.
func (set *shardSet) activating() bool {
	return set.st.activating()
}

// installRemembered adds the loaded markers and the entities remembered
// before the load (the load's state event then activates them). Under
// set.mu.
func (set *shardSet) installRemembered(loaded []storage.RememberedEntity) {
	s := set.s
	for _, rec := range loaded {
		set.addRememberedLocked(rec.Entity, false)
	}
	for ref := range set.early {
		if set.remembered[ref] == nil {
			set.addRememberedLocked(ref, true)
		}
	}
	set.early = nil
	s.wake()
}

// addRememberedLocked adds ref, queueing its put unless stored.
func (set *shardSet) addRememberedLocked(ref storage.EntityRef, put bool) *rememberedEntity {
	m := &rememberedEntity{set: set, ref: ref, queued: put}
	if put {
		m.stored = make(chan struct{})
	}
	m.F = m
	if set.remembered == nil {
		set.remembered = map[storage.EntityRef]*rememberedEntity{}
	}
	set.remembered[ref] = m
	set.s.remembered.Add(1)
	set.s.countKind(ref.Kind, 1)
	if put {
		set.s.mu.Lock()
		set.s.rememberQ = append(set.s.rememberQ, m)
		set.s.mu.Unlock()
	}
	return m
}

// unstoredRemembered returns, sorted, the entities remembered here whose
// marker is not in the store yet: a put still queued, or an entity
// remembered before the set loaded (not one being forgotten).
func (set *shardSet) unstoredRemembered() []storage.EntityRef {
	set.mu.Lock()
	defer set.mu.Unlock()
	var refs []storage.EntityRef
	for ref, m := range set.remembered {
		if m.queued && !m.removed && !m.forgetting {
			refs = append(refs, ref)
		}
	}
	for ref := range set.early {
		refs = append(refs, ref)
	}
	slices.SortFunc(refs, func(a, b storage.EntityRef) int { return strings.Compare(a.String(), b.String()) })
	return refs
}

func (set *shardSet) dropRememberedLocked(m *rememberedEntity) {
	m.removed = true
	set.s.starts.Stop(&m.Entry)
	if set.remembered[m.ref] == m {
		delete(set.remembered, m.ref)
		set.s.remembered.Add(-1)
		set.s.countKind(m.ref.Kind, -1)
	}
}

// activateAllLocked queues the activation of every remembered entity.
func (set *shardSet) activateAllLocked() {
	if !set.activating() {
		return
	}
	for _, m := range set.remembered {
		if !m.inFlight {
			set.s.starts.CatchUp(&m.Entry)
		}
	}
}

// unscheduleRememberedLocked takes the activations out of the scheduler;
// with clear, the set forgets its remembered entities (in memory).
func (set *shardSet) unscheduleRememberedLocked(clear bool) {
	for _, m := range set.remembered {
		set.s.starts.Stop(&m.Entry)
		if clear {
			m.removed = true
			set.s.countKind(m.ref.Kind, -1)
		}
	}
	if clear && len(set.remembered) > 0 {
		set.s.remembered.Add(-int64(len(set.remembered)))
		set.remembered = nil
	}
}

// Fire implements schedule.Firer: activate the entity without a message.
func (m *rememberedEntity) Fire(_ *schedule.Entry, _ int64) {
	set := m.set
	s := set.s
	set.mu.Lock()
	if !set.activating() || m.removed || m.inFlight {
		set.mu.Unlock()
		return
	}
	k := s.host.Kind(m.ref.Kind)
	switch {
	case k == nil:
		s.starts.Schedule(&m.Entry, schedule.Now()+int64(unknownRetry))
		set.mu.Unlock()
		s.badMarker(set.id, m.ref, "its kind is not registered on this runner; retried every minute")
		return
	case !k.Opts.Remembered:
		set.mu.Unlock()
		s.badMarker(set.id, m.ref, "its kind has no Remembered option on this runner: not activated (the marker is kept)")
		return
	}
	m.inFlight = true
	id, epoch := set.id, set.epoch
	set.mu.Unlock()
	sh := s.host.Lookup(id)
	if sh != nil && sh.Epoch() == epoch && sh.Activate(k, m.ref.ID, m.activated) {
		return
	}
	set.mu.Lock()
	m.inFlight = false
	if set.activating() && !m.removed {
		s.starts.Schedule(&m.Entry, schedule.Now()+int64(deliverRetry))
	}
	set.mu.Unlock()
}

// activated is the outcome of an activation (hosting.Shard.Activate).
func (m *rememberedEntity) activated(ok bool) {
	set := m.set
	set.mu.Lock()
	defer set.mu.Unlock()
	m.inFlight = false
	if ok {
		m.failures = 0
		return
	}
	m.retryLocked()
}

// retryLocked activates m again after its back-off.
func (m *rememberedEntity) retryLocked() {
	set := m.set
	m.failures++
	set.s.met.RememberedRestarts.Add(context.Background(), 1, set.s.met.Attrs)
	if set.activating() && !m.removed {
		d := min(activateRetry<<min(m.failures-1, 10), maxRememberedRetry)
		set.s.starts.Schedule(&m.Entry, schedule.Now()+int64(d))
	}
}

var (
	_ hosting.Remembrance     = (*Service)(nil)
	_ hosting.RememberAwaiter = (*Service)(nil)
)

// Remember implements hosting.Remembrance: e is recorded for its shard
// unless it is already.
func (s *Service) Remember(id sharding.ShardID, epoch storage.Epoch, e hosting.EntityKey) {
	set := s.current(id, epoch)
	if set == nil {
		return
	}
	ref := storage.EntityRef{Kind: e.Kind, ID: e.ID}
	set.mu.Lock()
	defer set.mu.Unlock()
	switch {
	case set.st.stopped || set.remembered[ref] != nil:
		return
	case !set.st.loaded:
		if set.early == nil {
			set.early = map[storage.EntityRef]struct{}{}
		}
		set.early[ref] = struct{}{}
		return
	}
	set.addRememberedLocked(ref, true)
	s.wake()
}

// Failed implements hosting.Remembrance: e's instance panicked; it is
// activated again after its back-off.
func (s *Service) Failed(id sharding.ShardID, epoch storage.Epoch, e hosting.EntityKey) {
	set := s.current(id, epoch)
	if set == nil {
		return
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	m := set.remembered[storage.EntityRef{Kind: e.Kind, ID: e.ID}]
	if m == nil || m.inFlight || s.starts.Scheduled(&m.Entry) {
		return
	}
	m.retryLocked()
}

// ForgetEntity implements hosting.Remembrance: e's marker is deleted, fenced by
// epoch; from then on e is not activated without a message.
func (s *Service) ForgetEntity(ctx context.Context, id sharding.ShardID, epoch storage.Epoch, e hosting.EntityKey) error {
	set, err := s.setFor(ctx, id, epoch)
	if err != nil {
		return err
	}
	ref := storage.EntityRef{Kind: e.Kind, ID: e.ID}
	set.writeMu.Lock()
	defer set.writeMu.Unlock()
	set.mu.Lock()
	moving := set.st.stopped || set.st.paused
	m := set.remembered[ref]
	if m != nil && !moving {
		m.forgetting = true
	}
	set.mu.Unlock()
	if moving {
		return errMoving
	}
	_, err = s.write(ctx, storage.ShardWrite{Shard: id, Epoch: epoch, DeleteRemembered: []storage.EntityRef{ref}}, "forget")
	set.mu.Lock()
	defer set.mu.Unlock()
	if m != nil {
		m.forgetting = false
	}
	if err != nil {
		return err
	}
	if m := set.remembered[ref]; m != nil {
		set.dropRememberedLocked(m)
	}
	return nil
}

// putEnded wakes those waiting for m's put (AwaitRemembered). Under
// set.mu.
func (m *rememberedEntity) putEnded() {
	if m.stored != nil {
		close(m.stored)
		m.stored = nil
	}
}

// AwaitRemembered implements hosting.RememberAwaiter: it returns once e's
// marker is in the store (at once if it already was), fenced by epoch —
// or fails when the shard left this runner at epoch (hosting.ErrShardMoved)
// or ctx ended first. e was activated before (its activation queued the
// put, batched with the others).
func (s *Service) AwaitRemembered(ctx context.Context, id sharding.ShardID, epoch storage.Epoch, e hosting.EntityKey) error {
	set, err := s.setFor(ctx, id, epoch)
	if err != nil {
		return err
	}
	ref := storage.EntityRef{Kind: e.Kind, ID: e.ID}
	for {
		set.mu.Lock()
		m := set.remembered[ref]
		var wait chan struct{}
		switch {
		case set.st.stopped || (m != nil && m.fenced):
			set.mu.Unlock()
			return fmt.Errorf("remember %s %q: %w", e.Kind, e.ID, errMoving)
		case m == nil:
			set.mu.Unlock()
			return fmt.Errorf("remember %s %q: not activated on shard %d at epoch %d (forgotten meanwhile?): %w", e.Kind, e.ID, id, epoch, errMoving)
		case !m.queued:
			set.mu.Unlock()
			return nil
		default:
			wait = m.stored
		}
		set.mu.Unlock()
		if wait == nil {
			return nil
		}
		select {
		case <-wait:
		case <-set.ctx.Done():
			return fmt.Errorf("remember %s %q: shard %d left this runner: %w", e.Kind, e.ID, id, context.Cause(set.ctx))
		case <-ctx.Done():
			return fmt.Errorf("remember %s %q: waiting for its marker: %w", e.Kind, e.ID, context.Cause(ctx))
		}
	}
}

// RememberedCount returns the number of remembered entities of the shards
// whose state is loaded here.
func (s *Service) RememberedCount() int64 { return s.remembered.Load() }

// kindCounts counts the remembered entities of each kind over the sets,
// and remembers the count each kind was last logged at.
type kindCounts struct {
	mu     sync.Mutex // a leaf: taken under a set's mutex
	counts map[string]*kindCount
}

type kindCount struct {
	n      int64
	warned int64 // the count at the last WARN; 0 while at or under the threshold
}

// countKind adds d to kind's count of remembered entities; past
// Config.WarnRememberedAt it logs a WARN, and again each time the count
// doubles since the last one.
func (s *Service) countKind(kind string, d int64) {
	k := &s.kinds
	k.mu.Lock()
	if k.counts == nil {
		k.counts = map[string]*kindCount{}
	}
	c := k.counts[kind]
	if c == nil {
		c = &kindCount{}
		k.counts[kind] = c
	}
	c.n += d
	n, at := c.n, s.cfg.WarnRememberedAt
	warn := false
	switch {
	case at <= 0:
	case n <= at:
		c.warned = 0
	case c.warned == 0 || n > 2*c.warned:
		c.warned, warn = n, true
	}
	k.mu.Unlock()
	if warn {
		s.log.Warn("remembered entities of a kind keep growing: they are never passivated until they call entity.Forget",
			"kind", kind, "remembered", n, "warn_at", at,
			"hint", "check that the kind's entities call entity.Forget when done; a runner that takes their shards over activates every one (raise Config.RememberedWarnAt if this many is expected)")
	}
}

// RememberedByKind returns the number of remembered entities of each kind
// that has had some on the sets of this runner (0 once they are gone).
func (s *Service) RememberedByKind() map[string]int64 {
	k := &s.kinds
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]int64, len(k.counts))
	for kind, c := range k.counts {
		out[kind] = c.n
	}
	return out
}

// RememberedByShard returns the number of remembered entities of each
// loaded shard that has some.
func (s *Service) RememberedByShard() map[sharding.ShardID]int {
	s.mu.Lock()
	sets := make([]*shardSet, 0, len(s.sets))
	for _, set := range s.sets {
		sets = append(sets, set)
	}
	s.mu.Unlock()
	out := map[sharding.ShardID]int{}
	for _, set := range sets {
		set.mu.Lock()
		if n := len(set.remembered); n > 0 && !set.st.stopped {
			out[set.id] = n
		}
		set.mu.Unlock()
	}
	return out
}

// writeRemembered writes the queued puts: one fenced write per shard, all
// in one store call (the store batches them into few transactions), each
// set's write lock held so no Forget interleaves. A set's puts beyond
// storage.MaxShardWriteOps wait for the next call.
func (s *Service) writeRemembered(ctx context.Context, ms []*rememberedEntity) error {
	bySet := map[*shardSet][]*rememberedEntity{}
	var order []*shardSet
	for _, m := range ms {
		if _, ok := bySet[m.set]; !ok {
			order = append(order, m.set)
		}
		bySet[m.set] = append(bySet[m.set], m)
	}
	sets := s.live(order)
	slices.SortFunc(sets, func(a, b *shardSet) int { return int(a.id) - int(b.id) })
	// Only this goroutine takes several write locks, in shard order; every
	// other holder takes one and waits for nothing of this goroutine's.
	for _, set := range sets {
		set.writeMu.Lock()
	}
	defer func() {
		for _, set := range sets {
			set.writeMu.Unlock()
		}
	}()
	var writes []storage.ShardWrite
	var lives [][]*rememberedEntity
	var later []*rememberedEntity
	for _, set := range sets {
		set.mu.Lock()
		var refs []storage.EntityRef
		var live []*rememberedEntity
		for _, m := range bySet[set] {
			switch {
			case !m.queued || m.removed || set.st.stopped:
			case len(refs) == storage.MaxShardWriteOps:
				later = append(later, m)
			default:
				refs = append(refs, m.ref)
				live = append(live, m)
			}
		}
		set.mu.Unlock()
		if len(refs) > 0 {
			writes = append(writes, storage.ShardWrite{Shard: set.id, Epoch: set.epoch, PutRemembered: refs})
			lives = append(lives, live)
		}
	}
	defer func() {
		// Queued again without a wake: the side loop goes on at once
		// when this call succeeded (puts beyond the bound), after its
		// back-off when it failed (a wake here would make it retry a
		// failing store in a busy loop).
		if len(later) > 0 {
			s.mu.Lock()
			s.rememberQ = append(s.rememberQ, later...)
			s.mu.Unlock()
		}
	}()
	if len(writes) == 0 {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.OpTimeout)
	res, err := s.store.WriteShardStates(cctx, writes)
	cancel()
	var first error
	for i, w := range writes {
		e := err
		if res != nil {
			e = res[i].Err
		}
		switch {
		case e == nil || errors.Is(e, storage.ErrFenced):
			// Fenced: the shard moved on, its next owner does not know them.
			fenced := e != nil
			if !fenced {
				s.met.Writes.Add(context.Background(), 1, s.met.Attrs, opAttr("remember"))
			}
			set := lives[i][0].set
			set.mu.Lock()
			for _, m := range lives[i] {
				m.queued = m.queued && fenced
				m.fenced = fenced
				m.putEnded()
			}
			set.mu.Unlock()
		default:
			later = append(later, lives[i]...)
			if first == nil {
				first = fmt.Errorf("remember %d entities of shard %d: %w", len(w.PutRemembered), w.Shard, e)
			}
		}
	}
	return first
}

// badMarker logs a remembered entity this runner does not activate (once
// per key) and counts it.
func (s *Service) badMarker(id sharding.ShardID, ref storage.EntityRef, why string) {
	s.met.Corrupt.Add(context.Background(), 1, s.met.Attrs)
	key := storage.RememberedKey(id, ref)
	if s.firstLog(key) {
		s.log.Warn("remembered entity not activated", "key", key, "why", why)
	}
}
