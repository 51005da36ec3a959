package hosting

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/runner/internal/sparse"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Config is what hosting needs of the runner's configuration.
type Config struct {
	RunnerID  string // named in StaleResultError
	NumShards int
	// DrainTimeout bounds the wait for a previous epoch's handlers and a
	// passivated entity's Release hook.
	DrainTimeout time.Duration
	// CutoverWaiters is how many senders may wait for one shard's cutover.
	CutoverWaiters int
	// MaxResidentEntities caps resident entities (0: no cap).
	MaxResidentEntities int
	// PassivationInterval is the janitor's period.
	PassivationInterval time.Duration
	// Scheduler fires the entities' timers (the runner's one timer
	// structure; its Run is the runner's).
	Scheduler *schedule.Scheduler
	// Tracer traces the handlers (trace.go); nil: never.
	Tracer *tracing.Tracer
}

// Env is what hosting asks of the runner around it.
type Env interface {
	// PastDetach reports whether the detach instant has passed (and makes
	// the runner detach): no handler may start, nor have its result
	// acknowledged, after it.
	PastDetach() bool
	// NotHere is the error for a message to a shard not hosted here.
	NotHere(id sharding.ShardID) error
}

// Checkpoints is the part of storage.Store entities' lifecycle hooks use.
type Checkpoints interface {
	WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision, data []byte) (storage.Revision, error)
	ReadCheckpoint(ctx context.Context, shard sharding.ShardID, name string) (cp storage.Checkpoint, ok bool, err error)
	DeleteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision) error
}

// Metrics are the instruments hosting records to (created by the runner,
// which documents them). Attrs is added to every measurement.
type Metrics struct {
	Attrs             metric.MeasurementOption
	Activations       metric.Int64Counter
	Passivations      metric.Int64Counter
	Evictions         metric.Int64Counter
	MailboxRejections metric.Int64Counter
	HandlerDuration   metric.Float64Histogram
	Panics            metric.Int64Counter
	Dropped           metric.Int64Counter // by reason: DropShardLeft, DropStaleResult
	CutoverBuffered   metric.Int64Counter
	CutoverRejected   metric.Int64Counter
	SignalFailures    metric.Int64Counter // by kind and method
	WorkerRestarts    metric.Int64Counter
}

// NewMetrics creates hosting's instruments on m (their names, units and
// meanings are documented with the runner's); attrs is added to every
// measurement.
func NewMetrics(m metric.Meter, attrs metric.MeasurementOption) (*Metrics, error) {
	out := &Metrics{Attrs: attrs}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	out.Activations, err = m.Int64Counter("sharding.entity_activations", metric.WithUnit("{entity}"), metric.WithDescription("entity instances created"))
	add(err)
	out.Passivations, err = m.Int64Counter("sharding.entity_passivations", metric.WithUnit("{entity}"), metric.WithDescription("entities passivated (idle or evicted)"))
	add(err)
	out.Evictions, err = m.Int64Counter("sharding.entity_evictions", metric.WithUnit("{entity}"), metric.WithDescription("entities passivated by the resident cap"))
	add(err)
	out.MailboxRejections, err = m.Int64Counter("sharding.mailbox_rejections", metric.WithUnit("{message}"), metric.WithDescription("messages refused by a full mailbox"))
	add(err)
	out.HandlerDuration, err = m.Float64Histogram("sharding.handler_duration", metric.WithUnit("s"),
		metric.WithDescription("handler run time, sampled 1 in 64 messages per entity"))
	add(err)
	out.Panics, err = m.Int64Counter("sharding.handler_panics", metric.WithUnit("{message}"), metric.WithDescription("handler panics (message failed, instance discarded)"))
	add(err)
	out.Dropped, err = m.Int64Counter("sharding.messages_dropped", metric.WithUnit("{message}"),
		metric.WithDescription("messages dropped, by reason: shard_left (a signal whose shard left before it ran), stale_result (a handler finished after its shard left, or its reply came from an epoch older than one already seen: result withheld)"))
	add(err)
	out.CutoverBuffered, err = m.Int64Counter("sharding.cutover_buffered", metric.WithUnit("{message}"), metric.WithDescription("sends held while their shard cut over"))
	add(err)
	out.CutoverRejected, err = m.Int64Counter("sharding.cutover_rejected", metric.WithUnit("{message}"), metric.WithDescription("sends refused (retryable) because too many waited for a cutover"))
	add(err)
	out.SignalFailures, err = m.Int64Counter("sharding.signal_failures", metric.WithUnit("{message}"), metric.WithDescription("signal handlers that returned an error, by kind and method"))
	add(err)
	out.WorkerRestarts, err = m.Int64Counter("sharding.worker_restarts", metric.WithUnit("{restart}"), metric.WithDescription("shard workers and singletons restarted after an error or a panic"))
	add(err)
	return out, errors.Join(errs...)
}

// Reasons of the sharding.messages_dropped counter.
const (
	DropShardLeft   = "shard_left"   // a signal whose shard left before it ran
	DropStaleResult = "stale_result" // a handler finished after its shard left: result withheld
)

// WithReason is the reason attribute of a measurement.
func WithReason(reason string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("reason", reason))
}

// Host hosts the entities of every shard a runner owns: the registered
// kinds, the table of hosted shards, the resident entities across shards
// (LRU, resident cap) and their passivation.
type Host struct {
	cfg   Config
	env   Env
	store Checkpoints
	met   *Metrics
	log   *slog.Logger

	kindsMu sync.Mutex
	kinds   atomic.Pointer[map[string]*Kind]     // copy on write
	ordered atomic.Pointer[[]*Kind]              // the same, by Kind.idx
	shards  *sparse.Table[atomic.Pointer[Shard]] // by shard ID; nil when not hosted

	residents residents
	sched     *schedule.Scheduler
	reminders Reminders // set by SetReminders
	// remembrance: the store side of remembered entities (SetRemembrance)
	remembrance Remembrance
	workers     []Worker // set by SetWorkers, under kindsMu
	timerCount  atomic.Int64
	waiters     sync.Pool     // of *waiter
	evictKick   chan struct{} // 1-buffered: the resident cap is exceeded
	sigLog      signalLog     // failed signals, rate-limited (signal.go)
}

// New returns a Host hosting nothing yet.
func New(cfg Config, env Env, store Checkpoints, met *Metrics, log *slog.Logger) *Host {
	h := &Host{
		cfg: cfg, env: env, store: store, met: met, log: log, sched: cfg.Scheduler,
		shards: sparse.New[atomic.Pointer[Shard]](cfg.NumShards), evictKick: make(chan struct{}, 1),
	}

	h.kinds.Store(&map[string]*Kind{})
	h.ordered.Store(&[]*Kind{})
	h.residents.h = h
	h.waiters.New = func() any { return &waiter{ch: make(chan Result, 1)} }
	return h
}

// Register makes kinds available. Registering a different kind under a
// name already taken is an error; registering the same kind twice is a
// no-op.
func (h *Host) Register(kinds ...entity.Descriptor) error {
	h.kindsMu.Lock()
	defer h.kindsMu.Unlock()
	cur := h.kinds.Load()
	next := make(map[string]*Kind, len(*cur)+len(kinds))
	for name, k := range *cur {
		next[name] = k
	}
	ordered := slices.Clone(*h.ordered.Load())
	for _, d := range kinds {
		idx := len(next)
		if d == nil || d.Name() == "" {
			return fmt.Errorf("%w: nil or unnamed kind", entity.ErrInvalidKind)
		}
		if old, ok := next[d.Name()]; ok {
			if old.Desc != d {
				return fmt.Errorf("%w: kind %q registered twice with different definitions", entity.ErrInvalidKind, d.Name())
			}
			continue
		}
		k := &Kind{Desc: d, Opts: d.Options(), name: d.Name(), idx: idx, warms: kindWarms(d)}
		next[d.Name()] = k
		ordered = append(ordered, k)
	}
	h.kinds.Store(&next)
	h.ordered.Store(&ordered)
	return nil
}

// Kind returns the registered kind named name, or nil.
func (h *Host) Kind(name string) *Kind { return (*h.kinds.Load())[name] }

// KindNames returns the names of the registered kinds, in no order.
func (h *Host) KindNames() []string {
	kinds := *h.kinds.Load()
	out := make([]string, 0, len(kinds))
	for name := range kinds {
		out = append(out, name)
	}
	return out
}

// kindScan is how many registered kinds KindOf compares one by one.
const kindScan = 8

// KindOf returns the registered kind whose descriptor is d, or nil (d was
// not registered, or more than kindScan kinds were: look its name up with
// Kind). It compares descriptors, hashing nothing: the lookup per message
// of a sender.
func (h *Host) KindOf(d entity.Descriptor) *Kind {
	if l := *h.ordered.Load(); len(l) <= kindScan {
		for _, k := range l {
			if k.Desc == d {
				return k
			}
		}
	}
	return nil
}

// CanWarm reports whether a registered kind's instances can warm.
func (h *Host) CanWarm() bool {
	for _, k := range *h.kinds.Load() {
		if k.warms {
			return true
		}
	}
	return false
}

// Lookup returns the host of shard id, or nil when it is not hosted here.
func (h *Host) Lookup(id sharding.ShardID) *Shard {
	if p := h.shards.Peek(int(id)); p != nil {
		return p.Load()
	}
	return nil
}

// Install makes sh the host of its shard: messages find it from now on.
func (h *Host) Install(sh *Shard) { h.shards.At(int(sh.id)).Store(sh) }

// Uninstall stops sh being found by new messages, if it is still the host
// of its shard.
func (h *Host) Uninstall(sh *Shard) {
	if p := h.shards.Peek(int(sh.id)); p != nil {
		p.CompareAndSwap(sh, nil)
	}
}

// EntityCount returns the number of resident entities.
func (h *Host) EntityCount() int { return h.residents.count() }

// Hot returns up to limit resident entities of shard, most recently used
// first.
func (h *Host) Hot(shard sharding.ShardID, limit int) []EntityKey {
	return h.residents.hot(shard, limit)
}

// KindCount is what the debug page shows of one registered kind.
type KindCount struct {
	Name     string
	Active   int    // resident instances
	Handled  uint64 // messages whose handler ran
	Rejected uint64 // messages refused by a full mailbox
}

// KindCounts returns the registered kinds by name with their resident
// entities and message counters. It costs O(hosted shards + resident
// entities), each shard's entity table read-locked in turn.
func (h *Host) KindCounts() []KindCount {
	kinds := *h.kinds.Load()
	active := make(map[string]int, len(kinds))
	for _, p := range h.shards.Allocated() {
		sh := p.Load()
		if sh == nil {
			continue
		}
		sh.mu.RLock()
		for e := range sh.entities.all() {
			active[e.key.Kind]++
		}
		sh.mu.RUnlock()
	}
	out := make([]KindCount, 0, len(kinds))
	for name, k := range kinds {
		out = append(out, KindCount{Name: name, Active: active[name], Handled: k.stats.handled.load(), Rejected: k.stats.rejected.load()})
	}
	slices.SortFunc(out, func(a, b KindCount) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Janitor passivates idle entities periodically and evicts over the
// resident cap, until ctx ends. Release hooks of passivated entities run
// here, never on a sender's goroutine.
func (h *Host) Janitor(ctx context.Context) {
	t := time.NewTicker(h.cfg.PassivationInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			h.residents.passivateIdle(now)
			h.residents.evict()
		case <-h.evictKick:
			h.residents.evict()
		}
	}
}

// checkpointName is the storage name of an entity's checkpoint.
func checkpointName(key EntityKey) string { return key.Kind + "/" + key.ID }

// restoreFunc is the Restore of an entity's Warm hook.
func (h *Host) restoreFunc(id sharding.ShardID, key EntityKey) func(context.Context) ([]byte, bool, error) {
	return func(ctx context.Context) ([]byte, bool, error) {
		cp, ok, err := h.readCheckpoint(ctx, id, checkpointName(key))
		return cp.Data, ok, err
	}
}

// readCheckpoint reads checkpoint name of shard id (traced).
func (h *Host) readCheckpoint(ctx context.Context, id sharding.ShardID, name string) (storage.Checkpoint, bool, error) {
	cp, ok, err := h.store.ReadCheckpoint(ctx, id, name)
	if h.cfg.Tracer.On() {
		restored(ctx, len(cp.Data), ok, err)
	}
	return cp, ok, err
}

// signal wakes ch's reader without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
