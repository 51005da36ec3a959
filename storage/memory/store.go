package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// DefaultOpTimeout bounds a call whose context has no earlier deadline.
const DefaultOpTimeout = storage.DefaultOpTimeout

var _ storage.Store = (*Store)(nil)

// Op names a kind of call, for fault injection and call counting.
type Op string

// The operations of a Store.
const (
	OpGrant      Op = "grant"
	OpKeepAlive  Op = "keepalive"
	OpRevoke     Op = "revoke"
	OpPutRunner  Op = "put-runner"
	OpAcquire    Op = "acquire"
	OpVerify     Op = "verify"
	OpRelease    Op = "release"
	OpRewrite    Op = "rewrite"
	OpTransfer   Op = "transfer"
	OpHandoff    Op = "handoff"
	OpCheckpoint Op = "checkpoint"
	OpCluster    Op = "cluster" // ReadCluster and WriteCluster
	OpList       Op = "list"
	OpWatch      Op = "watch"
	OpPing       Op = "ping"
)

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
}

// Cluster returns the cluster this client talks to.
func (s *Store) Cluster() *Cluster { return s.c }

// Partition cuts this client off (on) or reconnects it (off). While cut off,
// calls block until their context ends and fail with storage.ErrUnavailable;
// watches deliver nothing and catch up after the partition heals.
func (s *Store) Partition(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if on == s.partitioned {
		return
	}
	s.partitioned = on
	if on {
		s.healed = make(chan struct{})
	} else {
		close(s.healed)
	}
}

// BreakWatches ends every open watch of this client with
// storage.ErrUnavailable, as a lost connection does on etcd.
func (s *Store) BreakWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken != nil {
		close(s.broken)
	}
	s.broken = make(chan struct{})
}

func (s *Store) brokenCh() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken == nil {
		s.broken = make(chan struct{})
	}
	return s.broken
}

// FailKeepAlive makes KeepAliveOnce fail at once with storage.ErrUnavailable
// (on) or work again (off).
func (s *Store) FailKeepAlive(on bool) {
	if on {
		s.Fail(OpKeepAlive, storage.ErrUnavailable)
	} else {
		s.Fail(OpKeepAlive, nil)
	}
}

// Fail makes every call of op fail at once with err (wrapped with the
// operation); a nil err removes the fault.
func (s *Store) Fail(op Op, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail == nil {
		s.fail = make(map[Op]error)
	}
	if err == nil {
		delete(s.fail, op)
	} else {
		s.fail[op] = err
	}
}

// Delay makes every call of op wait d (or until its context ends) before it
// is carried out; 0 removes the delay.
func (s *Store) Delay(op Op, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.delay == nil {
		s.delay = make(map[Op]time.Duration)
	}
	if d <= 0 {
		delete(s.delay, op)
	} else {
		s.delay[op] = d
	}
}

// Calls returns how many calls of op this client has started.
func (s *Store) Calls(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[op]
}

// admit applies the faults for op, bounded by the default timeout like the
// etcd store's calls.
func (s *Store) admit(ctx context.Context, op Op) error {
	ctx, cancel := storage.WithOpTimeout(ctx, s.opTimeout)
	defer cancel()
	return s.faults(ctx, op)
}

// enter admits op (see admit) and locks the cluster for it: the caller
// unlocks c.mu.
func (s *Store) enter(ctx context.Context, op Op) (*Cluster, error) {
	if err := s.admit(ctx, op); err != nil {
		return nil, err
	}
	s.c.mu.Lock()
	return s.c, nil
}

func (s *Store) faults(ctx context.Context, op Op) error {
	s.mu.Lock()
	if s.calls == nil {
		s.calls = make(map[Op]int)
	}
	s.calls[op]++
	d := s.delay[op]
	s.mu.Unlock()
	if d > 0 {
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return s.ctxErr(ctx, op)
		case <-t.C:
		}
	}
	s.mu.Lock()
	healed, partitioned := s.healed, s.partitioned
	failErr := s.fail[op]
	s.mu.Unlock()
	if partitioned {
		select {
		case <-ctx.Done():
			return s.ctxErr(ctx, op)
		case <-healed:
		}
	}
	if failErr != nil {
		return fmt.Errorf("memory %s: %s: %w", s.name, op, failErr)
	}
	if err := ctx.Err(); err != nil {
		return s.ctxErr(ctx, op)
	}
	s.c.mu.Lock()
	closed := s.c.closed
	s.c.mu.Unlock()
	if closed {
		return storage.ErrClosed
	}
	return nil
}

func (s *Store) ctxErr(ctx context.Context, op Op) error {
	return fmt.Errorf("memory %s: %s: %w: %w", s.name, op, storage.ErrUnavailable, context.Cause(ctx))
}

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
func handoffOf(key string, e *kv) storage.Handoff {
	h, _ := storage.DecodeHandoff(e.keyValue(key))
	return h
}

// Acquire implements storage.Locks.
func (s *Store) Acquire(ctx context.Context, leaseID storage.LeaseID, owner storage.Owner, shards []sharding.ShardID) ([]storage.AcquireResult, error) {
	val, err := storage.EncodeOwner(owner)
	if err != nil {
		return nil, err
	}
	if err := storage.CheckShardsFor(leaseID, shards); err != nil {
		return nil, err
	}
	out := make([]storage.AcquireResult, len(shards))
	err = s.batched(ctx, OpAcquire, len(shards), func(c *Cluster, tx *txn, lo, hi int) error {
		for i, sh := range shards[lo:hi] {
			key, res := shardKey(sh), &out[lo+i]
			res.Shard = sh
			switch e, ok := c.kvs[key]; {
			case !ok || e.lease == storage.NoLease:
				if ok { // a lock without a lease is never an ownership
					replaced := lockOf(key, e)
					res.Replaced = &replaced
				}
				// Fails only for a missing lease, so at the batch's first
				// put: nothing was written yet.
				if err := tx.put(key, val, leaseID); err != nil {
					return err
				}
				res.Status, res.Epoch = storage.Acquired, storage.Epoch(tx.rev)
			case e.lease == leaseID:
				res.Status, res.Epoch = storage.AlreadyOwned, storage.Epoch(e.mod)
			default:
				res.Status, res.Holder = storage.HeldElsewhere, lockOf(key, e)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("acquire %d shards: %w", len(shards), err)
	}
	return out, nil
}

// batched runs fn on each batch of n items as one transaction (under the
// cluster lock), after applying op's faults to each batch. fn may fail
// only before its first write: the transaction is then not committed.
func (s *Store) batched(ctx context.Context, op Op, n int, fn func(c *Cluster, tx *txn, lo, hi int) error) error {
	for _, b := range storage.Batches(n, storage.MaxShardsPerTxn) {
		if err := s.txn(ctx, op, func(c *Cluster, tx *txn) error { return fn(c, tx, b[0], b[1]) }); err != nil {
			return err
		}
	}
	return nil
}

// batchedEach is batched for calls with per-item results: every batch runs
// (a failed one does not stop the others), failed turns a failed batch's
// error into its items' results and returns the error to report, and the
// first such error is returned.
func (s *Store) batchedEach(ctx context.Context, op Op, n int, fn func(c *Cluster, tx *txn, lo, hi int) error, failed func(lo, hi int, err error) error) error {
	var first error
	for _, b := range storage.Batches(n, storage.MaxShardsPerTxn) {
		if err := s.txn(ctx, op, func(c *Cluster, tx *txn) error { return fn(c, tx, b[0], b[1]) }); err != nil {
			first = cmp.Or(first, failed(b[0], b[1], err))
		}
	}
	return first
}

// txn runs fn as one transaction (under the cluster lock), after applying
// op's faults. fn may fail only before its first write: the transaction is
// then not committed.
func (s *Store) txn(ctx context.Context, op Op, fn func(c *Cluster, tx *txn) error) error {
	c, err := s.enter(ctx, op)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	tx := c.begin()
	if err := fn(c, tx); err != nil {
		return err
	}
	tx.commit()
	return nil
}

// Verify implements storage.Locks.
func (s *Store) Verify(ctx context.Context, leaseID storage.LeaseID, held []storage.Held) ([]storage.LostLock, error) {
	if err := storage.CheckHeldBy(leaseID, held); err != nil {
		return nil, err
	}
	var lost []storage.LostLock
	err := s.batched(ctx, OpVerify, len(held), func(c *Cluster, _ *txn, lo, hi int) error {
		for _, h := range held[lo:hi] {
			key := shardKey(h.Shard)
			e, ok := c.kvs[key]
			switch {
			case !ok:
				lost = append(lost, storage.LostLock{Shard: h.Shard})
			case e.lease != leaseID || storage.Epoch(e.mod) != h.Epoch:
				lost = append(lost, storage.LostLock{Shard: h.Shard, Exists: true, Holder: lockOf(key, e)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("verify %d locks: %w", len(held), err)
	}
	return lost, nil
}

// Release implements storage.Locks.
func (s *Store) Release(ctx context.Context, leaseID storage.LeaseID, held []storage.Held) ([]sharding.ShardID, error) {
	if err := storage.CheckHeldBy(leaseID, held); err != nil {
		return nil, err
	}
	var released []sharding.ShardID
	err := s.batched(ctx, OpRelease, len(held), func(c *Cluster, tx *txn, lo, hi int) error {
		for _, h := range held[lo:hi] {
			key := shardKey(h.Shard)
			if e, ok := c.kvs[key]; ok && e.lease == leaseID && storage.Epoch(e.mod) == h.Epoch {
				tx.del(key)
				released = append(released, h.Shard)
			}
		}
		return nil
	})
	if err != nil {
		return released, fmt.Errorf("release %d shards: %w", len(held), err)
	}
	return released, nil
}

// Rewrite implements storage.Locks.
func (s *Store) Rewrite(ctx context.Context, leaseID storage.LeaseID, owner storage.Owner, shards []sharding.ShardID) ([]storage.AcquireResult, error) {
	val, err := storage.EncodeOwner(owner)
	if err != nil {
		return nil, err
	}
	if err := storage.CheckShardsFor(leaseID, shards); err != nil {
		return nil, err
	}
	var out []storage.AcquireResult
	err = s.batched(ctx, OpRewrite, len(shards), func(c *Cluster, tx *txn, lo, hi int) error {
		for _, sh := range shards[lo:hi] {
			key := shardKey(sh)
			e, ok := c.kvs[key]
			switch {
			case !ok:
			case e.lease == leaseID:
				_ = tx.put(key, val, leaseID) // the lease exists: it holds the key
				out = append(out, storage.AcquireResult{Shard: sh, Status: storage.Acquired, Epoch: storage.Epoch(tx.rev)})
			default:
				out = append(out, storage.AcquireResult{Shard: sh, Status: storage.HeldElsewhere, Holder: lockOf(key, e)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rewrite %d locks: %w", len(shards), err)
	}
	return out, nil
}

// Transfer implements storage.Locks.
func (s *Store) Transfer(ctx context.Context, reqs []storage.TransferRequest) ([]storage.TransferResult, error) {
	if err := storage.CheckTransfers(reqs); err != nil {
		return nil, err
	}
	vals := make([][]byte, len(reqs))
	for i, req := range reqs {
		v, err := storage.EncodeOwner(req.ToOwner)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	out := make([]storage.TransferResult, len(reqs))
	for i, req := range reqs {
		out[i].Shard = req.Shard
	}
	err := s.batchedEach(ctx, OpTransfer, len(reqs), func(c *Cluster, tx *txn, lo, hi int) error {
		move := make([]bool, hi-lo)
		for i := lo; i < hi; i++ {
			req := reqs[i]
			sk, hk := shardKey(req.Shard), handoffKey(req.Shard)
			if e, ok := c.kvs[sk]; !ok || e.lease != req.FromLease || storage.Epoch(e.mod) != req.FromEpoch {
				out[i].Err = fmt.Errorf("transfer shard %d: %w", req.Shard, storage.ErrNotOwner)
				continue
			}
			if e, ok := c.kvs[hk]; !ok || e.lease != req.ToLease || (req.HandoffRevision != 0 && e.mod != req.HandoffRevision) {
				out[i].Err = fmt.Errorf("transfer shard %d: %w", req.Shard, storage.ErrNoHandoff)
				continue
			}
			if _, ok := c.leases[req.ToLease]; !ok {
				// Like etcd: a put under a missing lease fails the whole
				// transaction; nothing is written yet.
				return storage.ErrLeaseNotFound
			}
			move[i-lo] = true
		}
		for i := lo; i < hi; i++ {
			if move[i-lo] {
				_ = tx.put(shardKey(reqs[i].Shard), vals[i], reqs[i].ToLease) // the lease exists
				tx.del(handoffKey(reqs[i].Shard))
				out[i].Epoch = storage.Epoch(tx.rev)
			}
		}
		return nil
	}, func(lo, hi int, err error) error {
		err = fmt.Errorf("transfer %d shards: %w", hi-lo, err)
		for i := lo; i < hi; i++ {
			out[i] = storage.TransferResult{Shard: reqs[i].Shard, Err: err}
		}
		return err
	})
	return out, err
}

// PutHandoffs implements storage.Handoffs.
func (s *Store) PutHandoffs(ctx context.Context, leaseID storage.LeaseID, puts []storage.HandoffPut) ([]storage.HandoffResult, error) {
	vals, err := storage.EncodeHandoffs(leaseID, puts)
	if err != nil {
		return nil, err
	}
	out := make([]storage.HandoffResult, len(puts))
	err = s.batchedEach(ctx, OpHandoff, len(puts), func(c *Cluster, tx *txn, lo, hi int) error {
		if _, ok := c.leases[leaseID]; !ok {
			return storage.ErrLeaseNotFound
		}
		for i := lo; i < hi; i++ {
			key := handoffKey(puts[i].Shard)
			out[i].Shard = puts[i].Shard
			if e, ok := c.kvs[key]; ok && e.lease != leaseID {
				out[i].Err = &storage.HandoffConflictError{Shard: puts[i].Shard, Existing: handoffOf(key, e)}
				continue
			}
			_ = tx.put(key, vals[i], leaseID) // the lease exists
			out[i].Revision = tx.rev
		}
		return nil
	}, func(lo, hi int, err error) error {
		err = fmt.Errorf("put %d handoff records: %w", hi-lo, err)
		for i := lo; i < hi; i++ {
			out[i] = storage.HandoffResult{Shard: puts[i].Shard, Err: err}
		}
		return err
	})
	return out, err
}

// DeleteHandoffs implements storage.Handoffs.
func (s *Store) DeleteHandoffs(ctx context.Context, leaseID storage.LeaseID, shards []sharding.ShardID) ([]sharding.ShardID, error) {
	if err := storage.CheckShardsFor(leaseID, shards); err != nil {
		return nil, err
	}
	var deleted []sharding.ShardID
	err := s.batched(ctx, OpHandoff, len(shards), func(c *Cluster, tx *txn, lo, hi int) error {
		for _, sh := range shards[lo:hi] {
			key := handoffKey(sh)
			if e, ok := c.kvs[key]; ok && e.lease == leaseID {
				tx.del(key)
				deleted = append(deleted, sh)
			}
		}
		return nil
	})
	if err != nil {
		return deleted, fmt.Errorf("delete %d handoff records: %w", len(shards), err)
	}
	return deleted, nil
}

// WriteCheckpoint implements storage.Checkpoints.
func (s *Store) WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, data []byte) (storage.Revision, error) {
	if err := storage.CheckEpoch(shard, epoch); err != nil {
		return 0, err
	}
	c, err := s.enter(ctx, OpCheckpoint)
	if err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	e, ok := c.kvs[shardKey(shard)]
	if !ok || storage.Epoch(e.mod) != epoch {
		fe := &storage.FencedError{Shard: shard, Epoch: epoch}
		if ok {
			fe.Current = storage.Epoch(e.mod)
		}
		return 0, fe
	}
	tx := c.begin()
	_ = tx.put(storage.CheckpointKey(shard, name), storage.EncodeCheckpoint(epoch, data), storage.NoLease)
	return tx.commit(), nil
}

// ReadCheckpoint implements storage.Checkpoints.
func (s *Store) ReadCheckpoint(ctx context.Context, shard sharding.ShardID, name string) (storage.Checkpoint, bool, error) {
	c, err := s.enter(ctx, OpCheckpoint)
	if err != nil {
		return storage.Checkpoint{}, false, err
	}
	defer c.mu.Unlock()
	e, ok := c.kvs[storage.CheckpointKey(shard, name)]
	if !ok {
		return storage.Checkpoint{}, false, nil
	}
	cp, err := storage.DecodeCheckpoint(shard, name, e.value, e.mod)
	return cp, err == nil, err
}

// Ping implements storage.Store.
func (s *Store) Ping(ctx context.Context) error {
	return s.admit(ctx, OpPing)
}

// List implements storage.Lister.
func (s *Store) List(ctx context.Context, ks storage.Keyspace) (storage.Snapshot, error) {
	c, err := s.enter(ctx, OpList)
	if err != nil {
		return storage.Snapshot{}, fmt.Errorf("list %s: %w", ks, err)
	}
	defer c.mu.Unlock()
	prefix := string(ks) + "/"
	snap := storage.Snapshot{Revision: c.rev}
	for k, e := range c.kvs {
		if strings.HasPrefix(k, prefix) {
			snap.KVs = append(snap.KVs, e.keyValue(k))
		}
	}
	slices.SortFunc(snap.KVs, func(a, b storage.KeyValue) int { return strings.Compare(a.Key, b.Key) })
	return snap, nil
}

// Watch implements storage.Lister.
func (s *Store) Watch(ctx context.Context, ks storage.Keyspace, from storage.Revision) <-chan storage.WatchResponse {
	ch := make(chan storage.WatchResponse)
	s.mu.Lock()
	if s.calls == nil {
		s.calls = make(map[Op]int)
	}
	s.calls[OpWatch]++
	s.mu.Unlock()
	go s.watch(ctx, string(ks)+"/", from, ch)
	return ch
}

func (s *Store) watch(ctx context.Context, prefix string, next storage.Revision, ch chan<- storage.WatchResponse) {
	defer close(ch)
	c := s.c
	broken := s.brokenCh()
	send := func(r storage.WatchResponse) bool {
		select {
		case ch <- r:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		// A partitioned client sees nothing until the partition heals.
		s.mu.Lock()
		healed, partitioned := s.healed, s.partitioned
		s.mu.Unlock()
		if partitioned {
			select {
			case <-ctx.Done():
				return
			case <-broken:
				send(storage.WatchResponse{Err: fmt.Errorf("watch %s: %w: broken by test", prefix, storage.ErrUnavailable)})
				return
			case <-healed:
			}
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			send(storage.WatchResponse{Err: storage.ErrClosed})
			return
		}
		if next < c.compacted { // like etcd: revisions >= the compact revision remain
			c.mu.Unlock()
			send(storage.WatchResponse{Err: fmt.Errorf("watch %s from %d: %w (compacted at %d)", prefix, next, storage.ErrCompacted, c.compacted)})
			return
		}
		i, _ := slices.BinarySearchFunc(c.history, next, func(e event, r storage.Revision) int {
			return int(e.kv.ModRevision - r)
		})
		var evs []storage.Event
		for _, e := range c.history[i:] {
			if strings.HasPrefix(e.key, prefix) {
				evs = append(evs, storage.Event{Type: e.typ, KV: e.kv})
			}
		}
		next = c.rev + 1
		changed := c.changed
		c.mu.Unlock()
		if len(evs) > 0 && !send(storage.WatchResponse{Events: evs}) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-broken:
			send(storage.WatchResponse{Err: fmt.Errorf("watch %s: %w: broken by test", prefix, storage.ErrUnavailable)})
			return
		case <-changed:
		}
	}
}
