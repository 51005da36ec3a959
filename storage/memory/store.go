package memory

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

// DefaultOpTimeout bounds a call whose context has no earlier deadline.
const DefaultOpTimeout = storage.DefaultOpTimeout

var _ storage.Store = (*Store)(nil)

// Store is one client of a Cluster. Its fault hooks affect this client only.
type Store struct {
	c         *Cluster
	name      string
	opTimeout time.Duration

	mu          sync.Mutex
	partitioned bool
	healed      chan struct{} // closed when a partition heals
	broken      chan struct{} // closed by BreakWatches
	fail        map[Op]error
	delay       map[Op]time.Duration
	calls       map[Op]int
	delivered   map[string]int       // watch events delivered, by watched prefix (or key)
	late        map[Op]time.Duration // LateWrites
	order       storage.StateOrder   // the order keys of shard state writes (storage/stateorder.go)
}

// Cluster returns the cluster this client talks to.
func (s *Store) Cluster() *Cluster { return s.c }

// Grant implements storage.Leases.
func (s *Store) Grant(ctx context.Context, ttl time.Duration) (storage.Lease, error) {
	if err := storage.CheckTTL(ttl); err != nil {
		return storage.Lease{}, err
	}
	c, err := s.enter(ctx, OpGrant)
	if err != nil {
		return storage.Lease{}, err
	}
	defer c.mu.Unlock()
	c.nextLease++
	id := c.nextLease
	l := &lease{id: id, ttl: ttl, expiry: time.Now().Add(ttl), keys: make(map[string]struct{})}
	l.timer = time.AfterFunc(ttl, func() { c.expire(id) })
	c.leases[id] = l
	return storage.Lease{ID: id, TTL: ttl}, nil
}

// KeepAliveOnce implements storage.Leases.
func (s *Store) KeepAliveOnce(ctx context.Context, id storage.LeaseID) (time.Duration, error) {
	c, err := s.enter(ctx, OpKeepAlive)
	if err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	l, ok := c.leases[id]
	if !ok {
		return 0, fmt.Errorf("keep-alive lease %x: %w", id, storage.ErrLeaseNotFound)
	}
	if !time.Now().Before(l.expiry) { // the timer has not run yet
		c.revokeLocked(l)
		return 0, fmt.Errorf("keep-alive lease %x: %w", id, storage.ErrLeaseNotFound)
	}
	l.expiry = time.Now().Add(l.ttl)
	l.timer.Reset(l.ttl)
	return l.ttl, nil
}

// Revoke implements storage.Leases.
func (s *Store) Revoke(ctx context.Context, id storage.LeaseID) error {
	if err := s.admit(ctx, OpRevoke); err != nil {
		return err
	}
	if !s.c.ExpireLease(id) {
		return fmt.Errorf("revoke lease %x: %w", id, storage.ErrLeaseNotFound)
	}
	return nil
}

// LeaseKeys implements storage.Leases (fault hooks: OpVerify).
func (s *Store) LeaseKeys(ctx context.Context, id storage.LeaseID) ([]string, error) {
	c, err := s.enter(ctx, OpVerify)
	if err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	l, ok := c.leases[id]
	if !ok || !time.Now().Before(l.expiry) {
		return nil, fmt.Errorf("keys of lease %x: %w", id, storage.ErrLeaseNotFound)
	}
	keys := make([]string, 0, len(l.keys))
	for k := range l.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys) // deterministic (the simulation replays seeds)
	return keys, nil
}

// PutRunner implements storage.Registry.
func (s *Store) PutRunner(ctx context.Context, leaseID storage.LeaseID, rec storage.RunnerRecord) (storage.Revision, error) {
	val, err := storage.EncodeRunner(rec)
	if err != nil {
		return 0, err
	}
	if err := storage.CheckLease(leaseID); err != nil {
		return 0, err
	}
	c, err := s.enter(ctx, OpPutRunner)
	if err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	key := runnerKey(rec.ID)
	if e, ok := c.kvs[key]; ok && e.lease != leaseID {
		return 0, &storage.RunnerConflictError{ID: rec.ID, Exists: true, Existing: e.keyValue(key)}
	}
	tx := c.begin()
	if err := tx.put(key, val, leaseID); err != nil {
		return 0, fmt.Errorf("put runner %q: %w", rec.ID, err)
	}
	return tx.commit(), nil
}

// ReplaceRunner implements storage.Registry.
func (s *Store) ReplaceRunner(ctx context.Context, leaseID storage.LeaseID, rec storage.RunnerRecord, rev storage.Revision) (storage.Revision, error) {
	val, err := storage.EncodeRunner(rec)
	if err != nil {
		return 0, err
	}
	if err := errors.Join(storage.CheckLease(leaseID), storage.CheckRevision(rev)); err != nil {
		return 0, err
	}
	c, err := s.enter(ctx, OpPutRunner)
	if err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	key := runnerKey(rec.ID)
	e, ok := c.kvs[key]
	if !ok || e.mod != rev {
		ce := &storage.RunnerConflictError{ID: rec.ID, Exists: ok}
		if ok {
			ce.Existing = e.keyValue(key)
		}
		return 0, ce
	}
	tx := c.begin()
	if err := tx.put(key, val, leaseID); err != nil {
		return 0, fmt.Errorf("replace runner %q: %w", rec.ID, err)
	}
	return tx.commit(), nil
}

func runnerKey(id string) string { return storage.Key(storage.KeyspaceRunners, id) }

var shardKey, handoffKey = storage.LockKey, storage.HandoffKey

func lockOf(key string, e *kv) storage.Lock { l, _ := storage.DecodeLock(e.keyValue(key)); return l }

// handoffOf decodes the handoff record of shard sh from runner from.
func handoffOf(from string, sh sharding.ShardID, e *kv) storage.Handoff {
	kv := e.keyValue(handoffKey(from, sh))
	kv.Key = sh.String()
	h, _ := storage.DecodeHandoff(from, kv)
	return h
}

// Ping implements storage.Store.
func (s *Store) Ping(ctx context.Context) error {
	return s.admit(ctx, OpPing)
}
