package runner

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/transport"
)

// Defaults of Config.
const (
	DefaultNumShards              = 1024
	DefaultLeaseTTL               = 5 * time.Second
	DefaultKeepAliveRetryInterval = 250 * time.Millisecond
	DefaultAcquireRetryInterval   = 200 * time.Millisecond
	DefaultAcquireRetryWindow     = 2 * time.Second
	DefaultRebalanceDebounce      = 100 * time.Millisecond
	DefaultResyncInterval         = time.Minute
	DefaultOpTimeout              = 3 * time.Second
	DefaultDrainTimeout           = 10 * time.Second
	DefaultProbeInterval          = 500 * time.Millisecond
	DefaultStorageErrorThreshold  = 3
	DefaultMaxConnections         = 1024
	DefaultReminderCatchUpRate    = 5000
	DefaultMaxRemindersPerShard   = 10000
	DefaultRememberedStartRate    = 20000
	// DefaultRememberedWarnAt is the count of one kind's remembered
	// entities on a runner's shards past which it is logged at WARN: such
	// entities are never passivated until they call Forget, and a runner
	// that takes their shards over activates them at RememberedStartRate
	// (100 000 at the default rate: 5 s before the last runs again).
	DefaultRememberedWarnAt = 100000
	// DefaultStartTimeout is how long Run waits to be ready before it
	// fails with ErrStartTimeout: long enough to ride out an etcd restart
	// or leader election, short enough that a process supervisor (systemd's
	// default start timeout is 90 s; Kubernetes restarts a failed container
	// with its own backoff) sees a misconfigured process fail and says so.
	DefaultStartTimeout = time.Minute
)

// WaitForever as StartTimeout makes Run wait to be ready without bound.
const WaitForever time.Duration = -1

// SingleAttempt as AcquireRetryWindow makes every acquisition a single
// attempt: a shard held elsewhere is not retried until a watch reports its
// lock deleted (or the next resync).
const SingleAttempt time.Duration = -1

// Config holds the settings of a Runner. Zero fields mean the documented
// defaults, applied by New; New validates the result, relations included.
// Every runner of a cluster must agree on NumShards and Strategy.
type Config struct {
	// ID is the runner's stable name, unique among the live processes of
	// the cluster (e.g. a pod name): 1-128 bytes of UTF-8 without '/' or
	// control characters. Default: the host name.
	//
	// A restarted process with the same ID is a new incarnation: it does
	// not inherit the old one's locks, and it registers only once the old
	// incarnation's record is gone: at most the old lease's TTL plus 2 s
	// after a crash. A second live process with this ID makes Run fail with
	// ErrDuplicateRunnerID instead of stealing it; docs/guarantees.md ("A
	// self-repairing registration") states the rules.
	ID string
	// ListenAddr is where the runner serves its transport (gRPC), e.g.
	// ":7100" or "127.0.0.1:0". Empty (and Address empty): no server —
	// for client-only runners, and for hosting runners of a cluster that
	// lives in one process (tests); see ClientOnly for what happens when
	// another process joins. When Address is empty it defaults to the
	// listener's address.
	ListenAddr string
	// Address is the host:port other runners use to reach this one
	// (published in the runner record).
	Address string
	// DebugURL is the URL at which this process serves the runner's debug
	// page (DebugHandler), as the other runners' processes reach it, e.g.
	// "http://10.0.0.5:8081/debug/shardhost/". A hosting runner publishes
	// it in its runner record, so that every runner's page fetches this
	// runner's own state — phase, lease lag, rates — and marks it
	// unreachable as soon as its process is gone, without
	// DebugConfig.PeerURL. Default "": none published. It must be an
	// absolute http or https URL without credentials (user:password@ is
	// refused: the record is readable by whoever may read the namespace,
	// and the pages show it); the pages fetch it without credentials.
	DebugURL string
	// TLS configures the transport server (nil: plaintext, which New
	// refuses beyond loopback unless AllowInsecureTransport is set). Set
	// ClientAuth (tls.RequireAndVerifyClientCert) and ClientCAs for mutual
	// TLS.
	// Refused handshakes are logged at WARN with the peer's address and
	// the reason: at most once a minute per peer host and kind of reason
	// (so a peer's junk hides no other refusal), each line counting the
	// refusals not logged since.
	TLS *tls.Config
	// PeerTLS configures connections to other runners (nil: plaintext).
	PeerTLS *tls.Config
	// AllowInsecureTransport lets the transport listen beyond loopback
	// without TLS: whoever reaches ListenAddr can then call any method of
	// any entity, and answer as a runner to whoever dials it (SECURITY.md).
	// Without it New refuses such a configuration with an
	// *InsecureTransportError; set it only where the network itself is
	// trusted. A loopback ListenAddr (127.0.0.0/8, ::1, localhost) needs no
	// TLS and no flag; an empty host (":7100", every interface) or a host
	// name other than localhost counts as beyond loopback. Default false.
	AllowInsecureTransport bool
	// RequireClusterPeers makes mutual TLS check who a peer is, not only
	// that a trusted CA signed its certificate (any certificate of a CA
	// shared with other services would do otherwise). A peer's certificate
	// names it by its DNS and URI subject alternative names; the check
	// accepts:
	//   - on this runner's server (TLS), a client whose certificate names
	//     a runner registered in the cluster (by ID) or one of
	//     ClientPeerNames: client-only runners do not register;
	//   - on a connection to a peer (PeerTLS), a server whose certificate
	//     names the runner registered at the address dialed.
	// Others are refused in the handshake and logged. A runner that just
	// registered is refused for the moment the others take to see its
	// record (a watch event); its sends retry meanwhile. It needs TLS with
	// ClientAuth tls.RequireAndVerifyClientCert (unless the runner serves
	// no transport) and PeerTLS, and applies to the default gRPC transport
	// only (not with Transport). Default false.
	RequireClusterPeers bool
	// ClientPeerNames are the certificate names (DNS or URI SANs) of the
	// client-only runners allowed to connect when RequireClusterPeers is
	// set, e.g. the gateways' IDs.
	ClientPeerNames []string
	// Transport carries messages between runners. Default: gRPC
	// (transport.NewGRPC) serving on ListenAddr with TLS, reaching peers
	// with PeerTLS, bounded by MaxMessageSize, RequestTimeout,
	// ConnectTimeout and MaxConnections. Set another implementation, e.g.
	// a transport.InmemNetwork's, to run runners without sockets (tests,
	// the deterministic simulation); those fields are then ignored, and
	// Address defaults to the address the transport listens at. A
	// transport that also implements transport.RouteCaller (both of the
	// package's do) lets a routing change end a send's wait for a
	// connection to a runner that is gone.
	Transport transport.Transport
	// MaxMessageSize bounds an encoded request or response. Default 4 MiB.
	// Give every runner of a cluster the same: the transport refuses a
	// message over MaxMessageSize + 64 KiB (transport's package doc,
	// Bounds).
	MaxMessageSize int
	// RequestTimeout bounds a remote call whose context has no deadline.
	// Default 30 s.
	RequestTimeout time.Duration
	// ConnectTimeout bounds waiting for a connection to a peer before a
	// send; on expiry the message is not sent and the send retries.
	// Default 1 s.
	ConnectTimeout time.Duration
	// MaxWaitingSends bounds the sends waiting for an owner (retrying);
	// beyond it Send fails with ErrTooManyWaiting. Default 10000.
	MaxWaitingSends int
	// MaxAsyncSends bounds the sends of SendAsync (AskAsync, TellAsync) in
	// flight at once, each on a goroutine; beyond it SendAsync refuses
	// with ErrTooManyAsyncSends. Default 10000.
	MaxAsyncSends int
	// MaxConnections bounds the connections the transport server holds at
	// once (peers keep 2 each); further ones are closed as soon as they are
	// accepted. Default 1024. Besides, a connection that has not completed
	// its TLS and HTTP/2 handshake within 5 s is closed, one without a call
	// for 5 min is closed (peers reconnect on demand), the server pings a
	// connection silent for 30 s and closes it when no answer comes within
	// 10 s, and a client pinging more often than every 5 s is disconnected.
	MaxConnections int
	// Weight is the relative share of shards this runner takes. Default 1.
	Weight int
	// ClientOnly: the runner routes Ask and Tell but hosts nothing: it takes
	// no lease, does not register and never owns shards (gateways, routers).
	//
	// A hosting runner (not ClientOnly) without ListenAddr and Address
	// serves no transport: no other runner can reach its shards. It is
	// meant for a cluster living in one process (tests, a single process);
	// Run fails with ErrNoTransport as soon as the cluster holds a runner of
	// another process.
	ClientOnly bool
	// FullLockView makes the runner watch every shard's lock, as runners
	// of coordination layout 1 did: it then routes every send straight to
	// the lock's owner, and its debug page shows every shard's owner. It
	// costs one watch event per lock change in the cluster (every move),
	// so it is meant for a few gateways at most. Without it (the default)
	// a runner watches the membership and its own keys only, and routes by
	// the assignment, corrected by the owners' answers while a shard moves
	// (docs/how-it-works.md, "Routing and delivery"). A strategy that reads the
	// current owners (sharding.StickyBalanced) implies it.
	FullLockView bool
	// NumShards in the cluster. Default 1024. Every runner of a cluster,
	// client-only ones included, must use the same value: the first runner
	// publishes it in the cluster record ({namespace}/cluster) and Run fails
	// with a *ClusterMismatchError on a runner configured otherwise.
	NumShards int
	// Strategy assigns shards to runners. Default sharding.Balanced().
	// Every hosting runner of a cluster must use the same one (by name, as
	// published in the cluster record; a *ClusterMismatchError otherwise).
	// A client-only runner computes the assignment too (a send with no
	// live owner goes to the shard's assignee) with the cluster record's
	// strategy when it is a built-in one (sharding.StrategyByName), else
	// with this one.
	Strategy sharding.Strategy
	// StartTimeout bounds how long Run waits to be ready (see Ready) before
	// it fails with ErrStartTimeout: Runner.Run states what happens
	// meanwhile and then. Default DefaultStartTimeout (1 min); WaitForever
	// (any negative value): wait as long as it takes.
	StartTimeout time.Duration

	// LeaseTTL of the runner's lease. Default 5 s. The trade-off: a crashed
	// runner's shards answer again about LeaseTTL after the crash, but a
	// renewal has only LeaseTTL - DetachMargin - LeaseRenewInterval (2.5 s at
	// the defaults) to be acknowledged, which this process's pauses (GC, CPU
	// starvation) and etcd's failovers must fit in, and an etcd leader frozen
	// for longer than the TTL revokes leases as it resumes (an etcd bug; the
	// runners detach safely). Figures: BENCHMARKS.md, "Crash failover" and
	// "etcd faults".
	LeaseTTL time.Duration
	// LeaseRenewInterval between renewals. Default LeaseTTL/6; at most
	// LeaseTTL/3. Shorter leaves each renewal more of the TTL to be
	// acknowledged through any etcd member, for one more renewal request;
	// BENCHMARKS.md ("etcd faults") compares TTL/3 with TTL/6.
	LeaseRenewInterval time.Duration
	// KeepAliveRetryInterval between renewal attempts after a failure.
	// Default 250 ms.
	KeepAliveRetryInterval time.Duration

	// DetachMargin: the runner detaches at lease deadline - DetachMargin.
	// Default LeaseTTL/3. It must exceed the worst pause plus clock-rate
	// drift over a TTL.
	DetachMargin time.Duration
	// KeepAliveFailureThreshold of consecutive failed renewals that detaches
	// early. Default 0: off (the deadline alone decides).
	KeepAliveFailureThreshold int
	// StorageErrorThreshold of consecutive failed list/acquire/verify calls
	// that detaches. Default 3. A single failure may be a request that went
	// to a dead etcd member; the lease deadline protects safety meanwhile.
	StorageErrorThreshold int
	// RecoverWindow of continuous, observed health before a detached
	// runner re-attaches. Default LeaseTTL/3. Health is what the probes
	// (every ProbeInterval) saw: a silence longer than 2 x ProbeInterval
	// between two probes — a paused process, a hung probe — starts the
	// window over.
	RecoverWindow time.Duration
	// ProbeInterval between probes of the store while detached. Default 500 ms.
	ProbeInterval time.Duration
	// DisableDetachment keeps the runner attached when it should detach and
	// only logs (for staged roll-outs). Detachment is enabled by default.
	// Even when disabled, a lease the store reports lost drops every shard,
	// since the store already deleted their locks.
	DisableDetachment bool

	// AcquireRetryInterval between attempts on a shard held elsewhere.
	// Default 200 ms.
	AcquireRetryInterval time.Duration
	// AcquireRetryWindow during which a shard held elsewhere is retried.
	// Default 2 s; SingleAttempt (any negative value) for one attempt.
	AcquireRetryWindow time.Duration
	// RebalanceDebounce is the unit of the membership-storm rule
	// (docs/how-it-works.md, "Membership storms"): a runner recomputes the assignment once
	// its view has been quiet for a few debounces, so membership changes
	// closer than that are coalesced; an isolated departure is acted on at
	// once. Default 100 ms.
	RebalanceDebounce time.Duration
	// ResyncInterval of the safety-net full reconciliation. Default 1 min.
	ResyncInterval time.Duration
	// VerifyInterval between read-only verifications of owned locks: one
	// store request each, whatever the runner owns (the keys attached to
	// its lease). Default LeaseTTL/3.
	VerifyInterval time.Duration
	// OpTimeout bounds each storage call (and never extends past the detach
	// instant). Default 3 s.
	OpTimeout time.Duration
	// DrainTimeout bounds draining a shard's entities before its lock is
	// released (so does the detach instant). In a handoff the drain waits
	// for the handlers running, and asks queued behind them go back to
	// their senders, who retry at the new owner; a handoff whose drain
	// ended with handlers still running keeps the shard here and tries
	// again after as long as the drain took (at least ProbeInterval, at
	// most DrainTimeout). Default 10 s.
	DrainTimeout time.Duration

	// DisableHandoff makes planned moves plain: the old owner drains and
	// deletes the lock, the new owner acquires it (the shard is
	// unavailable in between and nothing is warmed). Handoff is enabled by
	// default.
	DisableHandoff bool
	// WarmShard, if set, is called on the new owner of a shard during a
	// handoff, while the old owner still serves it (e.g. "consume the
	// partition's log until caught up"). One call per move, bounded by
	// WarmTimeout (ctx); it may block; an error is logged and the move
	// goes on. Calls for different shards may run concurrently.
	WarmShard func(ctx context.Context, shard sharding.ShardID, from string) error
	// ReleaseShard, if set, is called on the old owner of a shard after its
	// entities drained and ran their Release hooks, while its epoch is
	// still valid, just before the lock moves (handoff) or is deleted
	// (plain release, Shutdown); to is the new owner when known, else "".
	// The place for shard-level fenced writes: ctx carries the ShardInfo
	// (ShardInfoFrom) whose Epoch fences storage.Checkpoints writes.
	// Bounded by DrainTimeout and the detach instant (ctx); an error is
	// logged. Not called when the runner detaches or crashes. Calls for
	// different shards may run concurrently.
	ReleaseShard func(ctx context.Context, shard sharding.ShardID, to string) error
	// WarmTimeout bounds the warming of one handoff. Default 10 s.
	WarmTimeout time.Duration
	// AbortOnWarmTimeout: when warming exceeds WarmTimeout the new owner
	// gives the handoff up (the old owner keeps serving and releases the
	// shard plainly after HandoffWait). Default false: the new owner marks
	// itself ready anyway and takes over partly cold.
	AbortOnWarmTimeout bool
	// HandoffWait is how long an old owner keeps serving a shard assigned
	// elsewhere without a ready handoff before it releases it plainly.
	// Default WarmTimeout + 5 s.
	HandoffWait time.Duration
	// HotSetLimit is how many recently used entities of a shard the old
	// owner reports for warming. Default 128.
	HotSetLimit int
	// CutoverWaiters bounds, per shard, the senders waiting while a
	// handoff cuts over; more get a retryable NotOwner at once. Default 1024.
	CutoverWaiters int
	// ShutdownHandoffTimeout bounds how long Shutdown waits for peers to
	// take its shards by handoff when its context has no deadline.
	// Default 30 s.
	ShutdownHandoffTimeout time.Duration

	// MaxResidentEntities caps the entities resident on this runner; above
	// it the least recently used idle entity is passivated. Default 0: no
	// cap (kinds' IdleAfter still passivates).
	MaxResidentEntities int
	// PassivationInterval between sweeps for idle entities. Default 1 s.
	PassivationInterval time.Duration

	// ReminderCatchUpRate bounds, per second, the reminders this runner
	// fires that were already due when their shard's reminders were loaded
	// (a cold start, a takeover after a crash): they queue and fire at this
	// rate, oldest load first, so a restart with many overdue reminders is
	// no thundering herd. Reminders due later fire on time whatever the
	// backlog. Default 5000.
	ReminderCatchUpRate int
	// MaxRemindersPerShard bounds the reminders stored per shard:
	// registering one more fails with entity.ErrTooManyReminders. Default
	// 10000, at most 20000 (storage.MaxProgressFired).
	MaxRemindersPerShard int
	// RememberedStartRate bounds, per second, the remembered entities
	// (entity.Remembered) this runner activates without a message after
	// acquiring their shards, so a cold start is no herd. Default 20000.
	RememberedStartRate int
	// RememberedWarnAt: a kind with more remembered entities than this on
	// the shards this runner owns is logged at WARN, and again each time
	// that count doubles (sharding.remembered shows it per kind). Default
	// DefaultRememberedWarnAt; math.MaxInt: never.
	RememberedWarnAt int

	// Logger for lifecycle events. Default slog.Default().
	Logger *slog.Logger
	// MeterProvider for metrics (docs/observability.md lists them). Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider for traces (docs/tracing.md). Default
	// otel.GetTracerProvider(): while no program has set one
	// (otel.SetTracerProvider), and with a noop.TracerProvider, tracing is
	// off and costs nothing.
	TracerProvider trace.TracerProvider
	// Propagator carries the trace context and baggage of a call to the
	// runner that handles it (in the request's headers). Default
	// otel.GetTextMapPropagator(), which carries nothing until a program
	// sets one: set propagation.NewCompositeTextMapPropagator(
	// propagation.TraceContext{}, propagation.Baggage{}) (W3C traceparent
	// and baggage) here or globally, or each runner's spans start a trace
	// of their own (New logs a warning when tracing is on without it).
	Propagator propagation.TextMapPropagator
}

func (c Config) withDefaults() Config {
	if c.ID == "" {
		c.ID, _ = os.Hostname()
	}
	if c.Weight == 0 {
		c.Weight = 1
	}
	if c.ClientOnly {
		c.Weight = 0
	}
	if c.NumShards == 0 {
		c.NumShards = DefaultNumShards
	}
	if c.Strategy == nil {
		c.Strategy = sharding.Default()
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LeaseRenewInterval == 0 {
		c.LeaseRenewInterval = c.LeaseTTL / 6
	}
	if c.KeepAliveRetryInterval == 0 {
		c.KeepAliveRetryInterval = min(DefaultKeepAliveRetryInterval, c.LeaseRenewInterval/2)
	}
	if c.DetachMargin == 0 {
		c.DetachMargin = c.LeaseTTL / 3
	}
	if c.StorageErrorThreshold == 0 {
		c.StorageErrorThreshold = DefaultStorageErrorThreshold
	}
	if c.RecoverWindow == 0 {
		c.RecoverWindow = c.LeaseTTL / 3
	}
	if c.ProbeInterval == 0 {
		c.ProbeInterval = DefaultProbeInterval
	}
	if c.AcquireRetryInterval == 0 {
		c.AcquireRetryInterval = DefaultAcquireRetryInterval
	}
	if c.AcquireRetryWindow == 0 {
		c.AcquireRetryWindow = DefaultAcquireRetryWindow
	}
	if c.AcquireRetryWindow < 0 {
		c.AcquireRetryWindow = SingleAttempt
	}
	if c.RebalanceDebounce == 0 {
		c.RebalanceDebounce = DefaultRebalanceDebounce
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = DefaultResyncInterval
	}
	if c.VerifyInterval == 0 {
		c.VerifyInterval = c.LeaseTTL / 3
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	switch {
	case c.StartTimeout == 0:
		c.StartTimeout = DefaultStartTimeout
	case c.StartTimeout < 0: // negative is valid (forever): not among durations()
		c.StartTimeout = WaitForever
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = DefaultDrainTimeout
	}
	if c.WarmTimeout == 0 {
		c.WarmTimeout = 10 * time.Second
	}
	if c.HandoffWait == 0 {
		c.HandoffWait = c.WarmTimeout + 5*time.Second
	}
	if c.HotSetLimit == 0 {
		c.HotSetLimit = 128
	}
	if c.CutoverWaiters == 0 {
		c.CutoverWaiters = 1024
	}
	if c.ShutdownHandoffTimeout == 0 {
		c.ShutdownHandoffTimeout = 30 * time.Second
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = 4 << 20
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = time.Second
	}
	if c.MaxWaitingSends == 0 {
		c.MaxWaitingSends = 10000
	}
	if c.MaxAsyncSends == 0 {
		c.MaxAsyncSends = 10000
	}
	if c.MaxConnections == 0 {
		c.MaxConnections = DefaultMaxConnections
	}
	if c.ListenAddr == "" && c.Address != "" && !c.ClientOnly {
		c.ListenAddr = c.Address
	}
	if c.PassivationInterval == 0 {
		c.PassivationInterval = time.Second
	}
	if c.ReminderCatchUpRate == 0 {
		c.ReminderCatchUpRate = DefaultReminderCatchUpRate
	}
	if c.RememberedStartRate == 0 {
		c.RememberedStartRate = DefaultRememberedStartRate
	}
	if c.RememberedWarnAt == 0 {
		c.RememberedWarnAt = DefaultRememberedWarnAt
	}
	if c.MaxRemindersPerShard == 0 {
		c.MaxRemindersPerShard = DefaultMaxRemindersPerShard
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = otel.GetTextMapPropagator()
	}
	return c
}
