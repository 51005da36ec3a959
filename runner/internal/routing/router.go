package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/sparse"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/transport"
	"go.opentelemetry.io/otel/metric"
)

// Config is what routing needs of the runner's configuration.
type Config struct {
	RunnerID        string
	NumShards       int
	MaxWaitingSends int // sends waiting for an owner at once
	MaxMessageSize  int // bytes of a request or response received
	// Tracer traces the calls sent and received (trace.go); nil: never.
	Tracer *tracing.Tracer
}

// Directory is the runner's view of the cluster that routing reads.
type Directory interface {
	// Route returns the member owning shard id (its Address is "" if it
	// serves no transport); ok is false when no other runner is known to
	// own it.
	Route(id sharding.ShardID) (owner storage.Runner, ok bool)
	// Member returns the record of member id.
	Member(id string) (storage.Runner, bool)
	// Assignee returns the other runner the assignment gives shard id to,
	// when no live runner holds its lock (ok false otherwise, or when
	// unknown), and the revisions of the views that say so: a send with no
	// route tries it, and it parks the request until it has acquired the
	// shard (Park).
	Assignee(id sharding.ShardID) (assignee storage.Runner, seen ViewSeen, ok bool)
	// ByAssignment reports whether the runner routes by the assignment
	// (no view of every lock): Assignee is then where a send without a
	// known owner usually goes, whatever time its caller has left.
	ByAssignment() bool
	// Learned records what a send learned of shard id's owner: refusedBy
	// answered "not the owner" naming owner ("" when it named none), or
	// owner answered the send (refusedBy ""). Called only when
	// ByAssignment.
	Learned(id sharding.ShardID, owner, refusedBy string)
	// Park waits, for a request received for shard id, while this runner
	// acquires the shard (bounded by ctx and by the directory's own
	// limits) — or, for a request its sender aimed here as the assignee
	// (seen not zero), while this runner's views are older than the
	// sender's were — and reports whether the shard is hosted here now.
	Park(ctx context.Context, id sharding.ShardID, seen ViewSeen) bool
	// NoRoute explains why shard id had no route after waited.
	NoRoute(id sharding.ShardID, waited time.Duration) error
	// NotHere is the error for a message to a shard not hosted here.
	NotHere(id sharding.ShardID) error
	// LeaseEndsByDrain reports whether every shard held under lease is or
	// was given up by its owner's own drain and release: the lease is a
	// live member's (it moves a shard only after its drain), or its
	// member's last record before the lease ended said Stopped (a clean
	// Shutdown, see storage.RunnerRecord). False for a lease that ended
	// otherwise (expired, or revoked after a detach) or is not known.
	LeaseEndsByDrain(lease storage.LeaseID) bool
	// Running reports whether the runner runs; WaitRun waits (briefly)
	// for Run to be called and says why not when it is not running;
	// ClosedErr is the error of a send to a runner that stopped.
	Running() bool
	WaitRun(ctx context.Context) error
	ClosedErr() error
}

// ViewSeen is the revisions a runner's views of the shard locks and of the
// runner records are at. A send to a shard's assignee carries the
// sender's (transport.DeliverRequest's LocksSeen and RunnersSeen): the
// assignee, if its own views are older, has not seen yet what made the
// sender come to it (typically the crashed owner's lease ending) and may
// wait for it instead of refusing at once.
type ViewSeen struct{ Locks, Runners storage.Revision }

// Behind reports whether a view at s is older than one at other in either
// keyspace.
func (s ViewSeen) Behind(other ViewSeen) bool {
	return s.Locks < other.Locks || s.Runners < other.Runners
}

// Metrics are the instruments routing records to (created and documented
// by the runner). Attrs is added to every measurement.
type Metrics struct {
	Attrs       metric.MeasurementOption
	SendRetries metric.Int64Counter
	Dropped     metric.Int64Counter // reason hosting.DropStaleResult
}

// NewMetrics creates routing's instruments on m (documented with the
// runner's); dropped is the entity host's sharding.messages_dropped
// counter, which routing shares; attrs is added to every measurement.
func NewMetrics(m metric.Meter, attrs metric.MeasurementOption, dropped metric.Int64Counter) (*Metrics, error) {
	out := &Metrics{Attrs: attrs, Dropped: dropped}
	var err error
	out.SendRetries, err = m.Int64Counter("sharding.messages_retried", metric.WithUnit("{attempt}"), metric.WithDescription("send attempts retried (not delivered: not owner, moving, unreachable, no owner yet)"))
	return out, err
}

// Router sends calls to their entities.
type Router struct {
	cfg  Config
	dir  Directory
	host *hosting.Host
	net  transport.Transport
	rc   transport.RouteCaller // net, if it implements it (else nil)
	// routes recycles the callRoutes of remote attempts (send.go).
	routes sync.Pool
	met    *Metrics
	log    *slog.Logger

	epochs  *sparse.Table[atomic.Int64]   // by shard: the newest epoch seen (checkEpoch)
	routeCh atomic.Pointer[chan struct{}] // closed at every routing change
	waiting atomic.Int64                  // sends waiting for an owner
}

// New returns a Router delivering through host and net.
func New(cfg Config, dir Directory, host *hosting.Host, net transport.Transport, met *Metrics, log *slog.Logger) *Router {
	r := &Router{cfg: cfg, dir: dir, host: host, net: net, met: met, log: log, epochs: sparse.New[atomic.Int64](cfg.NumShards)}
	r.rc, _ = net.(transport.RouteCaller)
	r.routes.New = func() any { return new(callRoute) }
	ch := make(chan struct{})
	r.routeCh.Store(&ch)
	return r
}

// Send delivers c to its entity (see runner.Runner.Send, which documents
// it for users).
func (r *Router) Send(ctx context.Context, c entity.Call) (any, error) {
	if r.cfg.Tracer.On() {
		return r.sendTraced(ctx, c)
	}
	return r.send(ctx, &c, nil)
}

// send is Send, in the client span cs (nil: not traced).
func (r *Router) send(ctx context.Context, c *entity.Call, cs *clientSpan) (any, error) {
	v, err := r.sendOnce(ctx, c, cs)
	if err != nil && c.Handler != nil && c.Handler.Idempotent() && errors.Is(err, hosting.ErrMaybeDelivered) {
		return r.sendIdempotent(ctx, *c, err, cs)
	}
	return v, err
}

// sendOnce is one Send: admission, routing and the retries that keep
// delivery at most once.
func (r *Router) sendOnce(ctx context.Context, c *entity.Call, cs *clientSpan) (any, error) {
	if err := r.admit(ctx, c); err != nil {
		return nil, err
	}
	k, h, err := r.resolve(c)
	if err != nil {
		return nil, err
	}
	id := sharding.ShardOf(c.Entity, r.cfg.NumShards)
	var first error
	if sh := r.host.Lookup(id); sh != nil { // fast path
		res := sh.Deliver(ctx, k, h, c.Entity, c.Req, h.OneWay(), false, cs != nil)
		if cs != nil {
			cs.tried(r.cfg.RunnerID, "", res.Epoch != 0)
		}
		if !res.Undelivered || !retryable(res.Err) {
			return res.V, res.Err
		}
		first = res.Err
		cs.retry(first)
	}
	return r.sendSlow(ctx, k, h, id, *c, first, cs)
}

// admit is the first check of every Send, before any routing: a call whose
// context already ended is never delivered (no handler runs it, local or
// remote); a call made before Run is called waits for it (WaitRun); and a
// runner that has stopped refuses at once instead of waiting for an owner
// it will never learn.
func (r *Router) admit(ctx context.Context, c *entity.Call) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("runner: %s not sent: the context ended before admission: %w", nameOf(*c), hosting.ContextError(ctx))
	}
	if !r.dir.Running() {
		if err := r.dir.WaitRun(ctx); err != nil {
			return fmt.Errorf("%w; %s not sent", err, nameOf(*c))
		}
	}
	return nil
}

// nameOf names a call for errors: kind.method to "entity".
func nameOf(c entity.Call) string {
	kind, method := "?", "?"
	if c.Kind != nil {
		kind = c.Kind.Name()
	}
	if c.Handler != nil {
		method = c.Handler.Name()
	}
	return fmt.Sprintf("%s.%s to %q", kind, method, c.Entity)
}

// resolve finds the registered kind and handler of a call.
func (r *Router) resolve(c *entity.Call) (*hosting.Kind, *entity.Handler, error) {
	if c.Kind == nil {
		return nil, nil, fmt.Errorf("%w: nil kind", entity.ErrUnknownKind)
	}
	k := r.host.KindOf(c.Kind)
	if k == nil {
		k = r.host.Kind(c.Kind.Name())
	}
	if k == nil {
		return nil, nil, fmt.Errorf("%w: %q is not registered on runner %s", entity.ErrUnknownKind, c.Kind.Name(), r.cfg.RunnerID)
	}
	h := c.Handler
	if h == nil || k.Desc != c.Kind {
		name := ""
		if h != nil {
			name = h.Name()
		}
		var ok bool
		if h, ok = k.Desc.Handler(name); !ok {
			return nil, nil, fmt.Errorf("%w: %s.%s", entity.ErrUnknownMethod, k.Desc.Name(), name)
		}
	}
	return k, h, nil
}

// retryable reports whether a pre-delivery error from this runtime may be
// retried (backpressure such as a full mailbox is not).
func retryable(err error) bool {
	var (
		no *hosting.NotOwnerError
		ud *hosting.UndeliveredError
	)
	return errors.As(err, &no) || errors.As(err, &ud) || errors.Is(err, transport.ErrNotSent) || errors.Is(err, ErrNoOwner)
}

func newBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 5 * time.Millisecond
	b.RandomizationFactor = 0.5
	b.Multiplier = 2
	b.MaxInterval = 250 * time.Millisecond
	b.MaxElapsedTime = 0 // until the caller's context ends
	b.Reset()
	return b
}

// SawEpoch records that shard id was owned at epoch (a lock in the watch,
// an ownership installed here, a reply).
func (r *Router) SawEpoch(id sharding.ShardID, epoch storage.Epoch) {
	p := r.epochs.At(int(id))
	for cur := p.Load(); int64(epoch) > cur; cur = p.Load() {
		if p.CompareAndSwap(cur, int64(epoch)) {
			return
		}
	}
}

// RouteWatch returns a channel closed at the next routing change.
func (r *Router) RouteWatch() <-chan struct{} { return *r.routeCh.Load() }

// RoutesChanged wakes every send waiting for a routing change. Each
// channel is swapped out, hence closed, exactly once.
func (r *Router) RoutesChanged() {
	ch := make(chan struct{})
	close(*r.routeCh.Swap(&ch))
}
