package memory

import (
	"context"
	"fmt"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Handoff records and checkpoints.

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
			from := puts[i].Record.From
			key := handoffKey(from, puts[i].Shard)
			out[i].Shard = puts[i].Shard
			if e, ok := c.kvs[key]; ok && e.lease != leaseID {
				out[i].Err = &storage.HandoffConflictError{Shard: puts[i].Shard, Existing: handoffOf(from, puts[i].Shard, e)}
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
func (s *Store) DeleteHandoffs(ctx context.Context, leaseID storage.LeaseID, refs []storage.HandoffRef) ([]sharding.ShardID, error) {
	if err := storage.CheckHandoffRefs(leaseID, refs); err != nil {
		return nil, err
	}
	var deleted []sharding.ShardID
	err := s.batched(ctx, OpHandoff, len(refs), func(c *Cluster, tx *txn, lo, hi int) error {
		for _, ref := range refs[lo:hi] {
			key := handoffKey(ref.From, ref.Shard)
			if e, ok := c.kvs[key]; ok && e.lease == leaseID {
				tx.del(key)
				deleted = append(deleted, ref.Shard)
			}
		}
		return nil
	})
	if err != nil {
		return deleted, fmt.Errorf("delete %d handoff records: %w", len(refs), err)
	}
	return deleted, nil
}

// DeleteNotices implements storage.Notices (fault hooks: OpHandoff).
func (s *Store) DeleteNotices(ctx context.Context, to string, seen []storage.NoticeSeen) (int, error) {
	if err := storage.CheckNotices(to, seen); err != nil {
		return 0, err
	}
	n := 0
	err := s.batched(ctx, OpHandoff, len(seen), func(c *Cluster, tx *txn, lo, hi int) error {
		for _, ns := range seen[lo:hi] {
			key := storage.NoticeKey(to, ns.Shard)
			if e, ok := c.kvs[key]; ok && e.mod == ns.Revision {
				tx.del(key)
				n++
			}
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("delete %d notices to %s: %w", len(seen), to, err)
	}
	return n, nil
}

// WriteCheckpoint implements storage.Checkpoints.
func (s *Store) WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision, data []byte) (storage.Revision, error) {
	if err := storage.CheckCheckpointWrite(shard, epoch, prev); err != nil {
		return 0, err
	}
	data = append([]byte(nil), data...)
	if err := s.lateWrite(OpCheckpoint, func(c *Cluster, tx *txn) {
		if c.checkpointFence(shard, name, epoch, prev) == nil {
			_ = tx.put(storage.CheckpointKey(shard, name), storage.EncodeCheckpoint(epoch, data), storage.NoLease)
		}
	}); err != nil {
		return 0, fmt.Errorf("write checkpoint of shard %d: %w", shard, err)
	}
	c, err := s.enter(ctx, OpCheckpoint)
	if err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	if err := c.checkpointFence(shard, name, epoch, prev); err != nil {
		return 0, err
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
