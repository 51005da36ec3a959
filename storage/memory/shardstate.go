package memory

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// ReadShardStates implements storage.ShardStates.
func (s *Store) ReadShardStates(ctx context.Context, shards []sharding.ShardID) ([]storage.ShardState, error) {
	if err := storage.CheckShards(shards); err != nil {
		return nil, err
	}
	out := make([]storage.ShardState, 0, len(shards))
	for _, b := range storage.Batches(len(shards), storage.MaxShardsPerTxn/2) {
		c, err := s.enter(ctx, OpShardState)
		if err != nil {
			return nil, fmt.Errorf("read the state of %d shards: %w", len(shards), err)
		}
		batch := shards[b[0]:b[1]]
		rem := make(map[sharding.ShardID][]storage.KeyValue, len(batch))
		mem := make(map[sharding.ShardID][]storage.KeyValue, len(batch))
		want := make(map[sharding.ShardID]bool, len(batch))
		for _, id := range batch {
			want[id] = true
		}
		for k, e := range c.kvs {
			ks, rest, _ := strings.Cut(k, "/")
			if ks != string(storage.KeyspaceReminders) && ks != string(storage.KeyspaceRemembered) {
				continue
			}
			id, ok := shardOfStateKey(rest, want)
			if !ok {
				continue
			}
			if ks == string(storage.KeyspaceReminders) {
				rem[id] = append(rem[id], e.keyValue(k))
			} else {
				mem[id] = append(mem[id], e.keyValue(k))
			}
		}
		rev := c.rev
		c.mu.Unlock()
		for _, id := range batch {
			byKey := func(a, b storage.KeyValue) int { return strings.Compare(a.Key, b.Key) }
			slices.SortFunc(rem[id], byKey)
			slices.SortFunc(mem[id], byKey)
			out = append(out, storage.DecodeShardState(id, rev, rem[id], mem[id]))
		}
	}
	return out, nil
}

// shardOfStateKey returns the shard whose state-family range holds the
// key rest (relative to its keyspace), if it is one of want: the range of
// shard N is [N, N0), which holds N, N/... and anything else sorting
// between them (e.g. "N-x": corrupt, reported by the decoder).
func shardOfStateKey(rest string, want map[sharding.ShardID]bool) (sharding.ShardID, bool) {
	for id := range want {
		start := id.String()
		if rest >= start && rest < start+"0" {
			return id, true
		}
	}
	return 0, false
}

// WriteShardStates implements storage.ShardStates.
func (s *Store) WriteShardStates(ctx context.Context, writes []storage.ShardWrite) ([]storage.ShardWriteResult, error) {
	ops, ids, err := storage.CheckShardWrites(writes)
	if err != nil {
		return nil, err
	}
	if _, err := storage.StateBatches(ids, ops); err != nil {
		return nil, err
	}
	fenced := make([]storage.ShardWrite, len(writes)) // shard and epoch: what applyShardWrites reads of writes
	for i, w := range writes {
		fenced[i] = storage.ShardWrite{Shard: w.Shard, Epoch: w.Epoch}
	}
	return storage.WriteOrdered(ctx, &s.order, writes, func(ctx context.Context, idx []int, expect []storage.Revision) ([]storage.ShardWriteResult, error) {
		sub := make([]storage.ShardWrite, len(idx))
		subOps := make([][]storage.StateOp, len(idx))
		for k, i := range idx {
			sub[k], subOps[k] = fenced[i], ops[i]
		}
		res := make([]storage.ShardWriteResult, len(idx))
		if err := s.lateWrite(OpShardState, func(c *Cluster, tx *txn) {
			applyShardWrites(c, tx, sub, subOps, expect, make([]storage.ShardWriteResult, len(idx)), 0, len(idx))
		}); err != nil {
			err = fmt.Errorf("write the state of %d shards: %w", len(idx), err)
			for k, w := range sub {
				res[k] = storage.ShardWriteResult{Shard: w.Shard, Err: err}
			}
			return res, err
		}
		ids := make([]sharding.ShardID, len(idx))
		for k, w := range sub {
			ids[k] = w.Shard
		}
		batches, err := storage.StateBatches(ids, subOps)
		if err != nil {
			return nil, err
		}
		var first error
		for _, b := range batches {
			err := s.txn(ctx, OpShardState, func(c *Cluster, tx *txn) error {
				applyShardWrites(c, tx, sub, subOps, expect, res, b[0], b[1])
				return nil
			})
			if err != nil {
				err = fmt.Errorf("write the state of %d shards: %w", b[1]-b[0], err)
				for k := b[0]; k < b[1]; k++ {
					res[k] = storage.ShardWriteResult{Shard: sub[k].Shard, Err: err}
				}
				if first == nil {
					first = err
				}
			}
		}
		return res, first
	})
}

// applyShardWrites carries out writes[lo:hi] (their encoded ops) in tx,
// each fenced by its shard's lock and ordered by its order key (expected at
// expect[i]), and records each outcome in res.
func applyShardWrites(c *Cluster, tx *txn, writes []storage.ShardWrite, ops [][]storage.StateOp, expect []storage.Revision, res []storage.ShardWriteResult, lo, hi int) {
	for i := lo; i < hi; i++ {
		w := writes[i]
		res[i].Shard = w.Shard
		if fe := c.lockFence(w.Shard, w.Epoch); fe != nil {
			res[i].Err = fe
			continue
		}
		orderKey := storage.StateOrderKey(w.Shard)
		var cur storage.Revision
		if o, ok := c.kvs[orderKey]; ok {
			cur = o.mod
		}
		if cur != expect[i] {
			res[i].Err = &storage.StateOrderError{Shard: w.Shard, Expected: expect[i], Current: cur}
			continue
		}
		_ = tx.put(orderKey, nil, storage.NoLease)
		for _, op := range ops[i] {
			if op.Delete {
				tx.del(op.Key)
			} else {
				_ = tx.put(op.Key, op.Value, storage.NoLease)
			}
		}
		res[i].Revision = tx.rev
	}
}
