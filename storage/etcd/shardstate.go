package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Per-shard state (storage.ShardStates): a read is one read-only
// transaction of two range reads per shard (its reminders and remembered
// entities); a write is, per shard, a nested transaction that applies the
// shard's operations if its lock is at the write's epoch, else reads the
// lock.

// ReadShardStates implements storage.ShardStates.
func (s *Store) ReadShardStates(ctx context.Context, shards []sharding.ShardID) ([]storage.ShardState, error) {
	if err := storage.CheckShards(shards); err != nil {
		return nil, err
	}
	out := make([]storage.ShardState, len(shards))
	families := []storage.Keyspace{storage.KeyspaceReminders, storage.KeyspaceRemembered}
	err := forBatchesOf(len(shards), storage.MaxShardsPerTxn/2, func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, 2*(hi-lo))
		for _, id := range shards[lo:hi] {
			for _, ks := range families {
				start, end := storage.ShardFamilyRange(ks, id)
				ops = append(ops, clientv3.OpGet(s.prefix+start, clientv3.WithRange(s.prefix+end)))
			}
		}
		cctx, cancel := s.ctx(ctx)
		defer cancel()
		resp, err := s.cli.Txn(cctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("read the state of %d shards: %w", hi-lo, translate(err))
		}
		rev := storage.Revision(resp.Header.Revision)
		for k, id := range shards[lo:hi] {
			var kvs [2][]storage.KeyValue
			for f, ks := range families {
				rr := resp.Responses[2*k+f].GetResponseRange()
				if rr == nil {
					return fmt.Errorf("read the state of shard %d: %w: no range response", id, storage.ErrUnavailable)
				}
				n := len(s.key(ks, ""))
				for _, kv := range rr.Kvs {
					kvs[f] = append(kvs[f], keyValue(kv, n))
				}
			}
			out[lo+k] = storage.DecodeShardState(id, rev, kvs[0], kvs[1])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// WriteShardStates implements storage.ShardStates.
func (s *Store) WriteShardStates(ctx context.Context, writes []storage.ShardWrite) ([]storage.ShardWriteResult, error) {
	encoded, ids, err := storage.CheckShardWrites(writes)
	if err != nil {
		return nil, err
	}
	batches, err := storage.StateBatches(ids, encoded)
	if err != nil {
		return nil, err
	}
	out := make([]storage.ShardWriteResult, len(writes))
	err = forRanges(batches, func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for i := lo; i < hi; i++ {
			w := writes[i]
			sk := s.shardKey(w.Shard)
			then := make([]clientv3.Op, 0, len(encoded[i]))
			for _, op := range encoded[i] {
				if op.Delete {
					then = append(then, clientv3.OpDelete(s.prefix+op.Key))
				} else {
					then = append(then, clientv3.OpPut(s.prefix+op.Key, string(op.Value)))
				}
			}
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sk), "=", int64(w.Epoch))},
				then, []clientv3.Op{clientv3.OpGet(sk)}))
		}
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			err = fmt.Errorf("write the state of %d shards: %w", hi-lo, err)
			for i := lo; i < hi; i++ {
				out[i] = storage.ShardWriteResult{Shard: writes[i].Shard, Err: err}
			}
			return err
		}
		for k, r := range resps {
			w := writes[lo+k]
			res := storage.ShardWriteResult{Shard: w.Shard}
			if r.Succeeded {
				res.Revision = rev
			} else {
				fe := &storage.FencedError{Shard: w.Shard, Epoch: w.Epoch}
				if kv := firstKV(r); kv != nil {
					fe.Current = storage.Epoch(kv.ModRevision)
				}
				res.Err = fe
			}
			out[lo+k] = res
		}
		return nil
	})
	return out, err
}
