package runner

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/lease"
	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/runner/internal/eventhub"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/registration"
	"github.com/shardhost/shardhost/runner/internal/reminders"
	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
)

// Runner hosts shards of a cluster. See the package documentation.
type Runner struct {
	// Set by New (served by Run before its goroutines start),
	// read-only afterwards.
	store       storage.Store
	cfg         Config
	log         *slog.Logger
	met         *metrics
	keeper      *lease.Keeper
	incarnation string
	ownerValue  []byte // the lock value this runner writes (storage.EncodeOwner)
	hub         eventhub.Hub[Event]
	hosting     *hosting.Host       // the entities of the owned shards (internal/hosting)
	sched       *schedule.Scheduler // the one timer structure: entity timers and reminders (internal/schedule)
	reminders   *reminders.Service  // the owned shards' reminders (internal/reminders)
	router      *routing.Router     // sends calls to their entities (internal/routing)
	net         transport.Transport // runner-to-runner delivery (Config.Transport, or gRPC)
	trace       *tracing.Tracer     // the runner's tracer (Config.TracerProvider; tracing.go)
	life        *lifeTracer         // the lifecycle spans (trace_lifecycle.go)
	served      bool                // the transport listens

	// Safe without a lock: channels, atomics, and types with a lock of
	// their own.
	sig         signals           // the loops' wake-ups and the ends of Run (signals)
	singletons  singletonRecorder // writes the records of the singletons started here (workers.go)
	running     atomic.Bool       // Run was called and has not returned
	trip        *detachInstant    // the detach instant, for the admission checks (trip.go)
	opDrain     drainState        // the operator's drain request (drain.go)
	st          startState        // starting up (start.go)
	ownLog      ownershipLog      // ownership changes of a round (ownershiplog.go)
	async       asyncSends        // SendAsync's sends in flight (async.go)
	healthReads healthReads       // the health checks' read in flight (health.go)
	storeProbe  storeProbe        // a ClientOnly runner's probes of the store (health.go)

	// Everything below is guarded by mu.
	mu sync.Mutex

	// The lifecycle and the current attachment (set by attach, ended by
	// detachLocked).
	lifecycle lifeState       // changed by toLocked only (lifestate.go)
	wd        watchdogState   // what decides and reports a detach (detach.go; its machine set by New)
	started   time.Time       // when Run was called (set before Run starts its goroutines, which read it freely)
	att       attachment      // the current attachment
	stopCtx   context.Context // the context of the first Shutdown call

	// The cluster as the watches see it, and what this runner owns and does
	// about it (the control loop).
	view          clusterView    // the watches' view of the cluster and the assignment (cluster.go)
	shards        shardTable     // every shard's ownership state (shardstate.go)
	work          *control.Queue // dirty shards and per-shard timers of the control loop
	attachedSince bool           // attached since the last assignment install: the next one decides every shard
	workerRegs    []workerReg    // shard workers and singletons (workers.go), fixed once Run began

	// The own record, and what the runner has reported.
	reg       *registration.Record // the own record (internal/registration)
	address   string               // advertised transport address (Config.Address or the listener's)
	fatal     error                // set once: Run ends with it (failRun)
	keys      damagedKeys          // damaged keys already logged (keys.go)
	lostLocks []lostLock           // dropped shards not logged yet
	// noticesSeen: notices applied, to delete (notices.go).
	noticesSeen []storage.NoticeSeen
	parked      parkingLot // requests waiting for a shard being acquired here (park.go)
}

// New returns a runner on store. It does nothing until Run.
func New(store storage.Store, cfg Config) (*Runner, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	if err := cfg.checkSet(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keeper, err := newKeeper(store, cfg)
	if err != nil {
		return nil, err
	}
	r := newRunner(store, cfg, keeper)
	// A strategy that reads the current owners needs every lock.
	r.view.full = cfg.FullLockView || !sharding.IgnoresCurrent(cfg.Strategy)
	if r.ownerValue, err = storage.EncodeOwner(r.owner()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	r.async.init()
	r.reg = registration.New(registration.Config{ID: cfg.ID, Incarnation: r.incarnation, LeaseTTL: cfg.LeaseTTL}, store, r.log)
	localIncarnations.Store(r.incarnation, struct{}{})
	r.net = cfg.Transport
	if r.net == nil {
		r.net = newTransport(cfg, r.log, r.peerCheck())
	}
	r.address = cfg.Address
	r.met, err = newMetrics(cfg.MeterProvider, cfg.ID, r.deadlineLag, r.gaugeReadings)
	if err != nil {
		return nil, fmt.Errorf("runner: metrics: %w", err)
	}
	r.ownLog.self, r.ownLog.log, r.ownLog.met = cfg.ID, r.log, r.met
	r.singletons = singletonRecorder{queue: make(chan storage.SingletonRecord, singletonRecQueue), store: store, log: r.log,
		attachment: func() context.Context {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.att.ctx
		}}
	r.st.init(store, r.log, r.met, cfg)
	r.hub.Observe = r.ownLog.note
	r.sched = schedule.New(schedule.Config{CatchUpRate: float64(cfg.ReminderCatchUpRate)})
	tracer := newTracer(cfg, r.log)
	r.trace = tracer
	r.life = newLifeTracer(tracer, cfg.DrainTimeout)
	r.hosting = hosting.New(hosting.Config{
		RunnerID: cfg.ID, NumShards: cfg.NumShards, DrainTimeout: cfg.DrainTimeout, CutoverWaiters: cfg.CutoverWaiters,
		MaxResidentEntities: cfg.MaxResidentEntities, PassivationInterval: cfg.PassivationInterval, Scheduler: r.sched,
		Tracer: tracer,
	}, hostingEnv{r}, fenceWatch{store, r}, &r.met.host, r.log)
	r.reminders = reminders.New(reminders.Config{MaxPerShard: cfg.MaxRemindersPerShard, OpTimeout: cfg.OpTimeout, StartRate: float64(cfg.RememberedStartRate),
		WarnRememberedAt: int64(cfg.RememberedWarnAt)},
		store, r.hosting, r.sched, &r.met.rem, r.log)
	r.hosting.SetReminders(r.reminders)
	r.hosting.SetRemembrance(r.reminders)
	r.router = routing.New(routing.Config{
		RunnerID: cfg.ID, NumShards: cfg.NumShards, MaxWaitingSends: cfg.MaxWaitingSends, MaxMessageSize: cfg.MaxMessageSize,
		Tracer: tracer,
	}, routingDir{r}, r.hosting, r.net, &r.met.route, r.log)
	return r, nil
}

// newKeeper returns the lease keeper of a runner configured with cfg.
func newKeeper(store storage.Store, cfg Config) (*lease.Keeper, error) {
	keeper, err := lease.New(store, lease.Config{
		TTL:           cfg.LeaseTTL,
		RenewInterval: cfg.LeaseRenewInterval,
		RetryInterval: cfg.KeepAliveRetryInterval,
		// A renewal is of use until the detach instant: with the defaults
		// its (hedged) call may take TTL - margin - interval.
		CallTimeout: min(max(cfg.LeaseRenewInterval, cfg.LeaseTTL-cfg.DetachMargin-cfg.LeaseRenewInterval), cfg.OpTimeout),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return keeper, nil
}

// newTransport returns the gRPC transport of a runner configured with cfg.
func newTransport(cfg Config, log *slog.Logger, verifyPeer func(string, tls.ConnectionState) error) transport.Transport {
	listen := cfg.ListenAddr
	if cfg.ClientOnly {
		listen = "" // routes only: serves nothing
	}
	return transport.NewGRPC(transport.GRPCConfig{
		ListenAddr: listen, TLS: cfg.TLS, PeerTLS: cfg.PeerTLS, MaxMessageSize: cfg.MaxMessageSize,
		RequestTimeout: cfg.RequestTimeout, ConnectTimeout: cfg.ConnectTimeout, MaxConnections: cfg.MaxConnections,
		VerifyPeer: verifyPeer, Logger: log,
	})
}

// signals are the channels the runner's loops wait on and the ends of
// its life (safe without a lock).
type signals struct {
	kick      chan struct{} // 1-buffered: run a control round now
	rebalance chan struct{} // 1-buffered: membership changed
	noticeGC  chan struct{} // 1-buffered: notices applied, to delete (notices.go)
	stopReq   chan struct{} // closed by Shutdown: release and stop
	closeReq  chan struct{} // closed by Close: stop abruptly
	done      chan struct{} // closed when Run has returned
	stopOnce  sync.Once     // closes stopReq
	closeOnce sync.Once     // closes closeReq
}

func newSignals() signals {
	return signals{
		kick: make(chan struct{}, 1), rebalance: make(chan struct{}, 1), noticeGC: make(chan struct{}, 1),
		stopReq: make(chan struct{}), closeReq: make(chan struct{}), done: make(chan struct{}),
	}
}

// attachment is the runner's current attachment (guarded by Runner.mu):
// set by attach, ended by detachLocked.
type attachment struct {
	gen   uint64                  // incremented on every attach and detach
	ctx   context.Context         // the attachment's: cancelled by its detach
	stop  context.CancelCauseFunc // cancels ctx
	lease storage.LeaseID         // the lease it holds (NoLease while detached)
	rev   storage.Revision        // revision of its registration
	// detachedLease is the lease of the last detach: a Shutdown under it
	// does not mark its record Stopped (lifecycle.go).
	detachedLease storage.LeaseID
}

// newRunner returns the runner's state before its parts are wired.
func newRunner(store storage.Store, cfg Config, keeper *lease.Keeper) *Runner {
	log := slog.New(tracing.LogHandler(cfg.Logger.Handler())).With("runner", cfg.ID)
	return &Runner{
		store:  store,
		cfg:    cfg,
		log:    log,
		keys:   newDamagedKeys(log, cfg.NumShards),
		keeper: keeper,
		wd: watchdogState{
			machine: detachment.New(detachment.Config{
				Enabled: !cfg.DisableDetachment, RecoverWindow: cfg.RecoverWindow,
				// Probes come every ProbeInterval: a longer silence (a paused
				// process, a hung probe) is not observed health.
				MaxSignalGap: 2 * cfg.ProbeInterval,
			}),
			storageErrs: make(map[string]int),
		},
		trip:        newDetachInstant(!cfg.DisableDetachment, detachment.Policy{Margin: cfg.DetachMargin, FailureThreshold: cfg.KeepAliveFailureThreshold}),
		incarnation: newIncarnation(),
		opDrain:     drainState{kick: make(chan struct{}, 1)},
		sig:         newSignals(),
		shards:      newShardTable(cfg.NumShards),
		work:        control.NewQueue(cfg.NumShards),
		view: clusterView{
			members:  make(map[string]storage.Runner),
			byLease:  make(map[storage.LeaseID]storage.Runner),
			locks:    control.NewLockView(cfg.NumShards),
			handoffs: make(map[sharding.ShardID]storage.Handoff),
			planner:  sharding.NewPlanner(cfg.Strategy),
			stuck:    newStuckWatches(),
		},
	}
}

// ID returns the runner's ID.
func (r *Runner) ID() string { return r.cfg.ID }

// Config returns the effective configuration (defaults applied).
func (r *Runner) Config() Config { return r.cfg }

// Address returns the transport address published for this runner ("" if
// it serves none); with ListenAddr ":0" it is known once Run has started.
func (r *Runner) Address() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.address
}

// Subscribe returns a subscription to the runner's events from now on.
func (r *Runner) Subscribe() *Subscription { return r.hub.Subscribe() }

func (r *Runner) owner() storage.Owner {
	return storage.Owner{RunnerID: r.cfg.ID, Incarnation: r.incarnation}
}

func (r *Runner) base() EventBase { return EventBase{Runner: r.cfg.ID, Time: time.Now()} }

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Owned returns the shards owned now, with their epochs.
func (r *Runner) Owned() map[sharding.ShardID]storage.Epoch {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[sharding.ShardID]storage.Epoch, r.shards.owned)
	for s := range r.shards.ownedShards() {
		out[s.id] = s.epoch
	}
	return out
}

// ShardInfo describes where a handler runs.
type ShardInfo struct {
	Runner string // the runner's ID
	Shard  sharding.ShardID
	Epoch  storage.Epoch // the ownership epoch the handler runs under
}

// shardEnv is what the context of a shard's handlers and hooks carries:
// set once per shard (installWithLocked), so no message pays for it.
type shardEnv struct {
	info ShardInfo
	r    *Runner
}

type shardEnvKey struct{}

// withShardEnv returns ctx carrying shard info of runner r.
func withShardEnv(ctx context.Context, r *Runner, info ShardInfo) context.Context {
	return context.WithValue(ctx, shardEnvKey{}, &shardEnv{info: info, r: r})
}

// ShardInfoFrom returns the ShardInfo carried by a handler's (or lifecycle
// hook's) context.
func ShardInfoFrom(ctx context.Context) (ShardInfo, bool) {
	env, ok := ctx.Value(shardEnvKey{}).(*shardEnv)
	if !ok {
		return ShardInfo{}, false
	}
	return env.info, true
}

// Assignment returns the assignment this runner computed last (nil before
// the membership was first listed).
func (r *Runner) Assignment() sharding.Assignment {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.view.assignment.Expand()
}

// Status is a snapshot of a runner's state.
type Status struct {
	Phase       string
	Incarnation string // this runner instance's unique name (its record's and its locks')
	Detached    bool
	Reason      detachment.Reason // while detached
	Lease       storage.LeaseID
	Deadline    time.Time // lease deadline
	Owned       int
	// Entities is how many entities are resident, Timers how many of
	// their timers run, Reminders how many reminders and Remembered how
	// many remembered entities the owned shards hold (of those whose state
	// is read: ShardsLoading). The metrics report the same.
	Entities   int
	Timers     int64
	Reminders  int64
	Remembered int64
	// ShardsLoading is how many owned shards' reminders and remembered
	// entities are not read from the store yet: their reminders fire,
	// and their remembered entities activate, once read (after a cold
	// start, the shards are read a batch at a time).
	ShardsLoading int
	Members       int
	// AssignmentDigest is the Digest of the assignment this runner
	// computed last (0 before the first): runners with equal digests agree
	// on the assignment.
	AssignmentDigest uint64
	// NotStarted says, while the runner is not ready because its start
	// calls to the store keep failing, since when and why: "not started:
	// etcd at 10.0.0.1:2379 unreachable since 10:04:05 (45s, 9 failed
	// attempts): etcd unreachable: 10.0.0.1:2379: dial tcp 10.0.0.1:2379:
	// connect: connection refused (...)". "" once ready and before a first
	// failure. StartError is the last failure it quotes.
	NotStarted string
	StartError error
}

// Status returns a snapshot of the runner's state.
func (r *Runner) Status() Status {
	h, _ := r.keeper.Health()
	st := r.wd.machine.State()
	note, startErr := r.st.notStarted()
	entities, timers := r.hosting.EntityCount(), r.hosting.Timers()
	reminders, remembered := r.reminders.Loaded(), r.reminders.RememberedCount()
	r.mu.Lock()
	defer r.mu.Unlock()
	return Status{
		Phase: r.lifecycle.phase.String(), Incarnation: r.incarnation, Detached: r.lifecycle.phase == phaseDetached, Reason: st.Reason,
		Entities: entities, Timers: timers, Reminders: reminders, Remembered: remembered,
		Lease: r.att.lease, Deadline: h.Deadline, Owned: r.shards.owned, ShardsLoading: int(r.reminders.Loading()), Members: len(r.view.members),
		AssignmentDigest: r.view.assignDigest, NotStarted: note, StartError: startErr,
	}
}

func (r *Runner) deadlineLag() (time.Duration, bool) {
	h, _ := r.keeper.Health()
	if h.Lease == storage.NoLease {
		return 0, false
	}
	return time.Until(h.Deadline), true
}

// gaugeReadings are the values of the runner's observed gauges.
func (r *Runner) gaugeReadings() gaugeReadings {
	remembered := r.reminders.RememberedByKind()
	for _, kind := range r.hosting.KindNames() { // every hosted kind has its series, 0 when it has none
		if _, ok := remembered[kind]; !ok {
			remembered[kind] = 0
		}
	}
	return gaugeReadings{entities: r.hosting.EntityCount(), reminders: r.reminders.Loaded(), timers: r.hosting.Timers(), remembered: remembered}
}

// opCtx returns the context for one storage call of the attachment gen:
// cancelled on detach, bounded by OpTimeout and by the detach instant.
func (r *Runner) opCtx(parent context.Context) (context.Context, context.CancelFunc) {
	return r.boundedCtx(parent, r.cfg.OpTimeout)
}

// boundedCtx bounds ctx by d and by the detach instant of the current
// lease (if any).
func (r *Runner) boundedCtx(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(d)
	if h, _ := r.keeper.Health(); h.Lease != storage.NoLease {
		if trip := r.trip.policy.TripAt(h.Deadline); trip.Before(deadline) {
			deadline = trip
		}
	}
	return context.WithDeadline(ctx, deadline)
}

// storageResult records the outcome of a list/acquire/verify/release call
// and detaches when one kind of call (other than release) failed
// StorageErrorThreshold times in a row (streaks are per operation: a working verify does not hide a
// failing acquire). A write refused for a lost lease trips at once.
func (r *Runner) storageResult(op string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.wd.storageErrs, op)
		return
	}
	if r.lifecycle.phase != phaseAttached {
		return
	}
	if errors.Is(err, storage.ErrLeaseNotFound) {
		r.keeper.ReportLost(r.att.lease)
		r.tripLocked(detachment.ReasonLeaseLost, fmt.Sprintf("%s: %v", op, err))
		return
	}
	r.wd.storageErrs[op]++
	n := r.wd.storageErrs[op]
	r.met.storageErrors.Add(context.Background(), 1, r.met.attrs, withErrorType(err))
	r.log.Warn("storage call failed", "op", op, "streak", n, "err", err)
	// A failed release costs nobody safety (the shard is no longer ours
	// locally and the lock is retried); everything else detaches.
	if op != "release" && n >= r.cfg.StorageErrorThreshold {
		r.tripLocked(detachment.ReasonStorageError, fmt.Sprintf("%s failed %d times: %v", op, n, err))
	}
}
