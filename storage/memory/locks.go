package memory

import (
	"cmp"
	"context"
	"fmt"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Lock operations, batched like the etcd store's (storage.MaxShardsPerTxn
// shards per transaction).

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
				res.Status, res.Epoch, res.Holder = storage.AlreadyOwned, storage.Epoch(e.mod), lockOf(key, e)
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

// releasedNotice is the value of a NoticeReleased.
var releasedNotice, _ = storage.EncodeNotice(storage.NoticeRecord{Kind: storage.NoticeReleased})

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
				if h.Tell != "" {
					_ = tx.put(storage.NoticeKey(h.Tell, h.Shard), releasedNotice, leaseID) // the lease holds the lock: it exists
				}
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
	vals, notices := make([][]byte, len(reqs)), make([][]byte, len(reqs))
	for i, req := range reqs {
		v, err := storage.EncodeOwner(req.ToOwner)
		if err != nil {
			return nil, err
		}
		n, err := storage.EncodeNotice(storage.NoticeRecord{Kind: storage.NoticeMoved, From: req.From, Incarnation: req.ToOwner.Incarnation})
		if err != nil {
			return nil, err
		}
		vals[i], notices[i] = v, n
	}
	out := make([]storage.TransferResult, len(reqs))
	for i, req := range reqs {
		out[i].Shard = req.Shard
	}
	err := s.batchedEach(ctx, OpTransfer, len(reqs), func(c *Cluster, tx *txn, lo, hi int) error {
		move := make([]bool, hi-lo)
		for i := lo; i < hi; i++ {
			req := reqs[i]
			sk, hk := shardKey(req.Shard), handoffKey(req.From, req.Shard)
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
			if req := reqs[i]; move[i-lo] {
				_ = tx.put(shardKey(req.Shard), vals[i], req.ToLease) // the lease exists
				tx.del(handoffKey(req.From, req.Shard))
				_ = tx.put(storage.NoticeKey(req.ToOwner.RunnerID, req.Shard), notices[i], req.ToLease)
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
