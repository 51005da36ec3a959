package reminders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Defaults of Config.
const (
	DefaultMaxPerShard = 10000
	DefaultStartRate   = 20000
	DefaultStuckAfter  = 30 * time.Second
)

// Config is what the service needs of the runner's configuration.
type Config struct {
	// MaxPerShard bounds the reminders stored per shard (at most
	// storage.MaxProgressFired, so a shard's progress always fits).
	MaxPerShard int
	// OpTimeout bounds each store call the service makes on its own.
	OpTimeout time.Duration
	// StartRate bounds the remembered entities activated without a
	// message, per second (default DefaultStartRate).
	StartRate float64
	// StuckAfter is how long a set may be unable to fire, while its shard
	// is owned here and not in a cutover, before the watchdog reloads it
	// (default DefaultStuckAfter); WatchEvery is how often the watchdog
	// looks (default StuckAfter/6).
	StuckAfter, WatchEvery time.Duration
	// WarnRememberedAt: a kind with more remembered entities than this
	// over the sets is logged at WARN, and again each time the count
	// doubles; 0 or less: never.
	WarnRememberedAt int64
}

// Metrics are the service's instruments (created by NewMetrics).
type Metrics struct {
	Attrs   metric.MeasurementOption
	Fires   metric.Int64Counter
	FireLag metric.Float64Histogram
	Writes  metric.Int64Counter // by op
	Corrupt metric.Int64Counter
	// RememberedRestarts counts remembered entities activated again after
	// their activation failed or their instance panicked.
	RememberedRestarts metric.Int64Counter
	// Reloads counts the sets the watchdog reloaded, by cause.
	Reloads metric.Int64Counter
}

// NewMetrics creates the service's instruments on m (documented with the
// runner's); attrs is added to every measurement.
func NewMetrics(m metric.Meter, attrs metric.MeasurementOption) (*Metrics, error) {
	out := &Metrics{Attrs: attrs}
	var errs []error
	var err error
	out.Fires, err = m.Int64Counter("sharding.reminder_fires", metric.WithUnit("{tick}"), metric.WithDescription("reminder ticks fired (their handler started)"))
	errs = append(errs, err)
	out.FireLag, err = m.Float64Histogram("sharding.reminder_fire_lag", metric.WithUnit("s"),
		metric.WithDescription("how late reminder ticks fired after their due time (ticks on schedule; catch-up fires after a load are not counted)"))
	errs = append(errs, err)
	out.Writes, err = m.Int64Counter("sharding.reminder_writes", metric.WithUnit("{write}"), metric.WithDescription("store writes of reminders, by op"))
	errs = append(errs, err)
	out.Corrupt, err = m.Int64Counter("sharding.reminders_corrupt", metric.WithUnit("{record}"),
		metric.WithDescription("stored reminder and remembered-entity records skipped as corrupt or unknown"))
	errs = append(errs, err)
	out.RememberedRestarts, err = m.Int64Counter("sharding.remembered_restarts", metric.WithUnit("{restart}"),
		metric.WithDescription("remembered entities activated again after their activation failed or their instance panicked"))
	errs = append(errs, err)
	out.Reloads, err = m.Int64Counter("sharding.reminder_reloads", metric.WithUnit("{shard}"),
		metric.WithDescription("shards whose reminders could not fire for 30 s although owned and not moving, reloaded from the store (logged at WARN), by cause: load, reload, rewrite, fenced"))
	errs = append(errs, err)
	return out, errors.Join(errs...)
}

// Service runs the reminders of a runner's shards. See the package
// documentation.
type Service struct {
	cfg   Config
	store storage.ShardStates
	host  *hosting.Host
	sched *schedule.Scheduler
	// starts activates remembered entities (its catch-up queue bounds
	// the rate: StartRate).
	starts *schedule.Scheduler
	met    *Metrics
	log    *slog.Logger

	loaded     atomic.Int64  // reminders loaded, over every set
	remembered atomic.Int64  // remembered entities, over every set
	loading    atomic.Int64  // sets neither loaded nor stopped
	kinds      kindCounts    // the same, by kind
	kick       chan struct{} // the set loop's (run.go)
	sideKick   chan struct{} // the side loop's

	mu   sync.Mutex
	sets map[sharding.ShardID]*shardSet // the current set of each shard
	// readQ and rewriteQ: the sets whose state asks for a read or a
	// rewrite (setState.work), each in one at most (shardSet.queued,
	// which stays set while its call runs).
	readQ, rewriteQ []*shardSet
	deleteQ         []*reminder
	// rememberQ: remembered entities whose marker is to be written.
	rememberQ []*rememberedEntity
	logged    map[string]struct{} // bad records already logged (firstLog)
}

// New returns a service; Run does its background work.
func New(cfg Config, store storage.ShardStates, host *hosting.Host, sched *schedule.Scheduler, met *Metrics, log *slog.Logger) *Service {
	if cfg.MaxPerShard <= 0 {
		cfg.MaxPerShard = DefaultMaxPerShard
	}
	cfg.MaxPerShard = min(cfg.MaxPerShard, storage.MaxProgressFired)
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = storage.DefaultOpTimeout
	}
	if cfg.StartRate <= 0 {
		cfg.StartRate = DefaultStartRate
	}
	if cfg.StuckAfter <= 0 {
		cfg.StuckAfter = DefaultStuckAfter
	}
	if cfg.WatchEvery <= 0 {
		cfg.WatchEvery = cfg.StuckAfter / 6
	}
	return &Service{
		cfg: cfg, store: store, host: host, sched: sched, met: met, log: log,
		starts: schedule.New(schedule.Config{CatchUpRate: cfg.StartRate}),
		kick:   make(chan struct{}, 1), sideKick: make(chan struct{}, 1),
		sets: make(map[sharding.ShardID]*shardSet), logged: make(map[string]struct{}),
	}
}

var _ hosting.Reminders = (*Service)(nil)

// Loaded returns the number of reminders loaded on this runner.
func (s *Service) Loaded() int64 { return s.loaded.Load() }

// Loading returns how many owned shards' sets are not loaded yet: their
// reminders fire, and their remembered entities activate, once loaded.
func (s *Service) Loading() int64 { return s.loading.Load() }

// wake wakes both background loops (run.go).
func (s *Service) wake() {
	for _, k := range []chan struct{}{s.kick, s.sideKick} {
		select {
		case k <- struct{}{}:
		default:
		}
	}
}

// needLocked queues set for the store call its state asks for, unless it
// is queued already (called by toLocked, under set.mu; lock order: a
// set's mutex, then the service's).
func (s *Service) needLocked(set *shardSet) {
	s.mu.Lock()
	if !set.queued {
		set.queued = true
		s.requeueLocked(set, set.st.work())
	}
	s.mu.Unlock()
	s.wake()
}

// Acquired starts the reminders of shard id, owned at epoch under the
// shard's context ctx: they are loaded in the background, then fired. A
// set of an earlier epoch of the shard is stopped and forgotten.
func (s *Service) Acquired(id sharding.ShardID, epoch storage.Epoch, ctx context.Context) {
	set := &shardSet{s: s, id: id, epoch: epoch, ctx: ctx, loadedCh: make(chan struct{}),
		since: time.Now()}
	s.mu.Lock()
	old := s.sets[id]
	s.sets[id] = set
	set.queued = true // its load: the initial state asks for a read
	s.readQ = append(s.readQ, set)
	s.loading.Add(1)
	s.mu.Unlock()
	if old != nil {
		old.stop(true)
	}
	s.wake()
}

// current returns the set of shard id at epoch, or nil.
func (s *Service) current(id sharding.ShardID, epoch storage.Epoch) *shardSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	if set := s.sets[id]; set != nil && set.epoch == epoch {
		return set
	}
	return nil
}

// Pause stops firing the reminders of shard id at epoch (a cutover
// begins); a tick delivered but not started yet is withdrawn (it fires
// after Resume, or at the next owner), one already started counts.
func (s *Service) Pause(id sharding.ShardID, epoch storage.Epoch) {
	if set := s.current(id, epoch); set != nil {
		set.pause()
	}
}

// Resume fires the reminders of shard id at epoch again after a Pause (a
// cutover that failed). If a final progress may have been written for it,
// it is rewritten as not final first.
func (s *Service) Resume(id sharding.ShardID, epoch storage.Epoch) {
	if set := s.current(id, epoch); set != nil {
		set.resume()
	}
}

// Progress returns the writes that record, fenced by epoch, what the next
// owner of shard id needs before its lock moves or is deleted: the final
// progress of its reminders, and the markers of entities remembered here
// whose put is still queued (the service's writer skips a stopped set:
// without them the next owner would not know those entities). The first
// write holds the progress and as many markers as fit
// (storage.MaxShardWriteOps), each further one more markers: the caller
// writes them in order, one per store call. There is nothing to write
// when the set fired nothing (not loaded) or holds no reminder, and
// remembered nothing new. err says the progress cannot be known exactly
// now (a registration or cancellation is still being written): written
// anyway it could lose or repeat ticks, so the writes hold no progress
// (the next owner fires at least once), only the markers, which are
// still to be written. Call it only once no handler of the shard can
// start any more (after a handoff's drain, or after a release's handlers
// returned). The set is marked: firing again needs Resume.
func (s *Service) Progress(id sharding.ShardID, epoch storage.Epoch) ([]storage.ShardWrite, error) {
	set := s.current(id, epoch)
	if set == nil {
		return nil, nil
	}
	p, final, err := set.progress()
	w := storage.ShardWrite{Shard: id, Epoch: epoch}
	if final && err == nil {
		w.Progress = &p
	}
	refs := set.unstoredRemembered()
	n := min(len(refs), storage.MaxShardWriteOps-w.Ops())
	w.PutRemembered, refs = refs[:n], refs[n:]
	var ws []storage.ShardWrite
	if w.Ops() > 0 {
		ws = append(ws, w)
	}
	for chunk := range slices.Chunk(refs, storage.MaxShardWriteOps) {
		ws = append(ws, storage.ShardWrite{Shard: id, Epoch: epoch, PutRemembered: chunk})
	}
	return ws, err
}

// Stop ends the reminders of shard id at epoch (its ownership ended): no
// tick fires any more. With keep, the set stays for a later Progress
// (a plain release computes it once its handlers returned), until Forget.
func (s *Service) Stop(id sharding.ShardID, epoch storage.Epoch, keep bool) {
	set := s.current(id, epoch)
	if set == nil {
		return
	}
	set.stop(!keep)
	if !keep {
		s.Forget(id, epoch)
	}
}

// Forget drops the (stopped) set of shard id at epoch.
func (s *Service) Forget(id sharding.ShardID, epoch storage.Epoch) {
	s.mu.Lock()
	set := s.sets[id]
	if set != nil && set.epoch == epoch {
		delete(s.sets, id)
	}
	s.mu.Unlock()
	if set != nil && set.epoch == epoch {
		set.stop(true)
	}
}

// StopAll stops and forgets every set (a detach, Close, Shutdown's end).
func (s *Service) StopAll() {
	s.mu.Lock()
	sets := s.sets
	s.sets = make(map[sharding.ShardID]*shardSet)
	for _, set := range append(s.readQ, s.rewriteQ...) {
		set.queued = false
	}
	s.readQ, s.rewriteQ, s.deleteQ, s.rememberQ = nil, nil, nil, nil
	s.mu.Unlock()
	for _, set := range sets {
		set.stop(true)
	}
}

// Sets returns the number of shards whose reminders are loaded and the
// number still loading.
func (s *Service) Sets() (loaded, loading int) {
	s.mu.Lock()
	sets := make([]*shardSet, 0, len(s.sets))
	for _, set := range s.sets {
		sets = append(sets, set)
	}
	s.mu.Unlock()
	for _, set := range sets {
		set.mu.Lock()
		if set.st.loaded {
			loaded++
		} else if !set.st.stopped {
			loading++
		}
		set.mu.Unlock()
	}
	return loaded, loading
}

// errMoving is the cause of a reminder call made while the shard is being
// handed off or released: the handler's shard is leaving.
var errMoving = fmt.Errorf("the shard is being handed off or released: %w", hosting.ErrShardMoved)

// setFor returns the loaded set of shard id at epoch, waiting for its load
// (bounded by ctx).
func (s *Service) setFor(ctx context.Context, id sharding.ShardID, epoch storage.Epoch) (*shardSet, error) {
	set := s.current(id, epoch)
	if set == nil {
		return nil, fmt.Errorf("shard %d at epoch %d is not owned here: %w", id, epoch, hosting.ErrShardMoved)
	}
	select {
	case <-set.loadedCh:
		return set, nil
	case <-set.ctx.Done():
		return nil, fmt.Errorf("shard %d left this runner: %w", id, context.Cause(set.ctx))
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the reminders of shard %d to load: %w", id, context.Cause(ctx))
	}
}

// Register implements hosting.Reminders: the reminder is written (fenced by
// epoch), then scheduled.
func (s *Service) Register(ctx context.Context, id sharding.ShardID, epoch storage.Epoch, e hosting.EntityKey, spec entity.ReminderSpec) error {
	set, err := s.setFor(ctx, id, epoch)
	if err != nil {
		return fmt.Errorf("register reminder %q: %w", spec.Name, err)
	}
	ref := storage.ReminderRef{Entity: storage.EntityRef{Kind: e.Kind, ID: e.ID}, Name: spec.Name}
	if err := set.beginWrite(ref, true); err != nil {
		return fmt.Errorf("register reminder %q: %w", spec.Name, err)
	}
	defer set.endWrite()
	rec := storage.Reminder{
		Shard: id, Entity: ref.Entity, Name: spec.Name, Method: spec.Handler.Name(),
		First: spec.Schedule.First.UTC(), Period: spec.Schedule.Period, Skip: spec.Schedule.Missed == entity.Skip,
		Payload: spec.Payload, Epoch: epoch,
	}
	rev, err := s.write(ctx, storage.ShardWrite{Shard: id, Epoch: epoch, PutReminders: []storage.Reminder{rec}}, "register")
	if err != nil {
		return fmt.Errorf("register reminder %q: %w", spec.Name, err)
	}
	rec.Revision = rev
	set.put(rec)
	return nil
}

// Cancel implements hosting.Reminders.
func (s *Service) Cancel(ctx context.Context, id sharding.ShardID, epoch storage.Epoch, e hosting.EntityKey, name string) error {
	set, err := s.setFor(ctx, id, epoch)
	if err != nil {
		return fmt.Errorf("cancel reminder %q: %w", name, err)
	}
	ref := storage.ReminderRef{Entity: storage.EntityRef{Kind: e.Kind, ID: e.ID}, Name: name}
	if err := set.beginWrite(ref, false); err != nil {
		return fmt.Errorf("cancel reminder %q: %w", name, err)
	}
	defer set.endWrite()
	if _, err := s.write(ctx, storage.ShardWrite{Shard: id, Epoch: epoch, DeleteReminders: []storage.ReminderRef{ref}}, "cancel"); err != nil {
		return fmt.Errorf("cancel reminder %q: %w", name, err)
	}
	set.remove(ref)
	return nil
}

// List implements hosting.Reminders.
func (s *Service) List(ctx context.Context, id sharding.ShardID, epoch storage.Epoch, e hosting.EntityKey) ([]entity.ReminderInfo, error) {
	set, err := s.setFor(ctx, id, epoch)
	if err != nil {
		return nil, err
	}
	return set.list(storage.EntityRef{Kind: e.Kind, ID: e.ID}), nil
}

// write makes one fenced state write and returns its revision.
func (s *Service) write(ctx context.Context, w storage.ShardWrite, op string) (storage.Revision, error) {
	res, err := s.store.WriteShardStates(ctx, []storage.ShardWrite{w})
	if len(res) == 1 {
		err = res[0].Err
	}
	if err != nil {
		return 0, err
	}
	s.met.Writes.Add(context.Background(), 1, s.met.Attrs, opAttr(op))
	return res[0].Revision, nil
}

func opAttr(op string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("op", op))
}
