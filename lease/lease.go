package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Defaults of Config.
const (
	DefaultTTL           = 5 * time.Second
	DefaultRetryInterval = 250 * time.Millisecond
	maxCallTimeout       = 2 * time.Second
)

// ErrInvalidConfig reports a Config that cannot work.
var ErrInvalidConfig = errors.New("lease: invalid config")

// Config holds the settings of a Keeper. Zero fields mean the defaults.
type Config struct {
	// TTL requested for the lease. Default 5 s.
	TTL time.Duration
	// RenewInterval between successful renewals. Default TTL/3; at most TTL/3.
	RenewInterval time.Duration
	// RetryInterval between attempts after a failed renewal. Default 250 ms;
	// less than RenewInterval.
	RetryInterval time.Duration
	// CallTimeout bounds each grant/renewal call. Default
	// min(RenewInterval, 2 s).
	CallTimeout time.Duration
}

func (c Config) withDefaults() Config {
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.RenewInterval == 0 {
		c.RenewInterval = c.TTL / 3
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = min(DefaultRetryInterval, c.RenewInterval/2)
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = min(c.RenewInterval, maxCallTimeout)
	}
	return c
}

// Validate reports whether c (after defaults) can work.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.TTL < 0 || c.RenewInterval < 0 || c.RetryInterval < 0 || c.CallTimeout < 0:
		return fmt.Errorf("%w: negative duration", ErrInvalidConfig)
	case c.RenewInterval > c.TTL/3:
		return fmt.Errorf("%w: RenewInterval %v must be at most TTL/3 (%v)", ErrInvalidConfig, c.RenewInterval, c.TTL/3)
	case c.RetryInterval >= c.RenewInterval:
		return fmt.Errorf("%w: RetryInterval %v must be less than RenewInterval %v", ErrInvalidConfig, c.RetryInterval, c.RenewInterval)
	}
	return nil
}

// Health is the published state of a Keeper's lease.
type Health struct {
	// Lease is the current lease; storage.NoLease before the first grant.
	Lease storage.LeaseID
	// TTL is the TTL the store granted.
	TTL time.Duration
	// Healthy: the last grant or renewal attempt succeeded.
	Healthy bool
	// FailureStreak counts consecutive failed renewals (0 when Healthy).
	FailureStreak int
	// Deadline: the lease is guaranteed to live until then (monotonic
	// clock): send time of the last acknowledged grant or renewal + TTL.
	Deadline time.Time
	// Lost: the store reported that the lease does not exist. The keeper
	// stops renewing until the next Grant.
	Lost bool
	// Err is the error of the last failed attempt, nil when Healthy.
	Err error
	// Renewals counts acknowledged renewals of this lease.
	Renewals int
}

// Keeper keeps one lease at a time alive. See the package documentation.
type Keeper struct {
	leases storage.Leases
	cfg    Config

	mu      sync.Mutex
	health  Health
	changed chan struct{} // closed and replaced on every publish
	kick    chan struct{} // 1-buffered: renew now
	granted chan struct{} // 1-buffered: a new lease was granted
}

// New returns a keeper that renews leases of leases. It grants nothing yet.
func New(leases storage.Leases, cfg Config) (*Keeper, error) {
	if leases == nil {
		return nil, fmt.Errorf("%w: nil storage.Leases", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Keeper{
		leases:  leases,
		cfg:     cfg.withDefaults(),
		changed: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		granted: make(chan struct{}, 1),
	}, nil
}

// Config returns the effective configuration (defaults applied).
func (k *Keeper) Config() Config { return k.cfg }

// Health returns the current health and a channel closed at the next change.
func (k *Keeper) Health() (Health, <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.health, k.changed
}

func (k *Keeper) publishLocked(h Health) {
	k.health = h
	close(k.changed)
	k.changed = make(chan struct{})
}

// signal does a non-blocking send on a 1-buffered channel.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Grant obtains a new lease and makes it the one the keeper renews. The
// previous lease, if any, is abandoned (not revoked). On failure the health
// is left as it was.
func (k *Keeper) Grant(ctx context.Context) (storage.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.CallTimeout)
	defer cancel()
	sent := time.Now()
	l, err := k.leases.Grant(ctx, k.cfg.TTL)
	if err != nil {
		return storage.Lease{}, fmt.Errorf("grant lease: %w", err)
	}
	k.mu.Lock()
	k.publishLocked(Health{Lease: l.ID, TTL: l.TTL, Healthy: true, Deadline: sent.Add(l.TTL)})
	k.mu.Unlock()
	signal(k.granted)
	return l, nil
}

// ReportLost tells the keeper that the store refused a write for lease id
// as not found: the lease is marked lost (as a failed renewal would) and
// renewing stops until the next Grant. Reports for another lease are
// ignored.
func (k *Keeper) ReportLost(id storage.LeaseID) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.health.Lease != id || k.health.Lost || id == storage.NoLease {
		return
	}
	h := k.health
	h.Lost, h.Healthy = true, false
	h.Err = fmt.Errorf("lease %x: %w (reported by a write)", id, storage.ErrLeaseNotFound)
	k.publishLocked(h)
}

// RenewNow asks the running keeper to renew at once instead of at the next
// interval (a probe). It does not wait.
func (k *Keeper) RenewNow() { signal(k.kick) }

// Revoke revokes the current lease, deleting its keys, and stops renewing
// until the next Grant.
func (k *Keeper) Revoke(ctx context.Context) error {
	k.mu.Lock()
	id := k.health.Lease
	k.mu.Unlock()
	if id == storage.NoLease {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, k.cfg.CallTimeout)
	defer cancel()
	err := k.leases.Revoke(ctx, id)
	if err != nil && !errors.Is(err, storage.ErrLeaseNotFound) {
		return fmt.Errorf("revoke lease: %w", err)
	}
	k.mu.Lock()
	if k.health.Lease == id {
		h := k.health
		h.Lost, h.Healthy, h.Err = true, false, nil
		k.publishLocked(h)
	}
	k.mu.Unlock()
	return nil
}

// Run renews the current lease until ctx ends, and returns ctx's error.
func (k *Keeper) Run(ctx context.Context) error {
	timer := time.NewTimer(k.cfg.RenewInterval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		case <-k.kick:
		case <-k.granted:
			timer.Reset(k.cfg.RenewInterval)
			continue
		}
		// Since Go 1.23, Stop and Reset discard a pending expiry.
		timer.Stop()
		if next, ok := k.renew(ctx); ok {
			timer.Reset(next)
		}
	}
}

// renew performs one renewal and returns the wait until the next one; ok is
// false when the keeper must wait for a kick (a new grant) instead.
func (k *Keeper) renew(ctx context.Context) (next time.Duration, ok bool) {
	k.mu.Lock()
	h := k.health
	k.mu.Unlock()
	if h.Lease == storage.NoLease || h.Lost {
		return 0, false
	}
	cctx, cancel := context.WithTimeout(ctx, k.cfg.CallTimeout)
	// Every request the store sends for this call is sent after this
	// instant (see the package documentation).
	sent := time.Now()
	ttl, err := k.leases.KeepAliveOnce(cctx, h.Lease)
	cancel()
	if ctx.Err() != nil {
		return 0, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	cur := k.health
	if cur.Lease != h.Lease || cur.Lost { // re-granted or revoked meanwhile
		return k.cfg.RenewInterval, true
	}
	if err == nil {
		cur.Healthy, cur.FailureStreak, cur.Err = true, 0, nil
		cur.TTL = ttl
		if d := sent.Add(ttl); d.After(cur.Deadline) {
			cur.Deadline = d
		}
		cur.Renewals++
		k.publishLocked(cur)
		return max(k.cfg.RenewInterval-time.Since(sent), 0), true
	}
	cur.Healthy, cur.Err = false, err
	cur.FailureStreak++
	if errors.Is(err, storage.ErrLeaseNotFound) {
		cur.Lost = true
		k.publishLocked(cur)
		return 0, false
	}
	k.publishLocked(cur)
	return k.cfg.RetryInterval, true
}
