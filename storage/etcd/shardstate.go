package etcd

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Per-shard state (storage.ShardStates): a read is one read-only
// transaction of two range reads per shard (its reminders and remembered
// entities), hedged across the members (see Store); a write is, per shard, a nested transaction that applies the
// shard's operations and puts its order key if its lock is at the write's
// epoch and the order key at the revision expected (storage.StateOrder),
// else reads both.

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
		// Read-only: hedged across members like a renewal (one slow
		// member must not hold back a shard's reminders and remembered
		// entities after its install).
		resp, err := hedged(cctx, s.members, s.attemptTimeout, func(ctx context.Context, m *member) (*clientv3.TxnResponse, error) {
			return m.kv.Txn(clientv3.WithRequireLeader(ctx)).Then(ops...).Commit()
		})
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
	if _, err := storage.StateBatches(ids, encoded); err != nil {
		return nil, err
	}
	return storage.WriteOrdered(ctx, &s.order, writes, func(ctx context.Context, idx []int, expect []storage.Revision) ([]storage.ShardWriteResult, error) {
		sub, subOps := make([]sharding.ShardID, len(idx)), make([][]storage.StateOp, len(idx))
		for k, i := range idx {
			sub[k], subOps[k] = ids[i], encoded[i]
		}
		batches, err := storage.StateBatches(sub, subOps)
		if err != nil {
			return nil, err
		}
		out := make([]storage.ShardWriteResult, len(idx))
		err = forRanges(batches, func(lo, hi int) error {
			ops := make([]clientv3.Op, 0, hi-lo)
			for k := lo; k < hi; k++ {
				w := writes[idx[k]]
				sk, ok := s.shardKey(w.Shard), s.prefix+storage.StateOrderKey(w.Shard)
				then := make([]clientv3.Op, 0, len(subOps[k])+1)
				for _, op := range subOps[k] {
					if op.Delete {
						then = append(then, clientv3.OpDelete(s.prefix+op.Key))
					} else {
						then = append(then, clientv3.OpPut(s.prefix+op.Key, string(op.Value)))
					}
				}
				then = append(then, clientv3.OpPut(ok, ""))
				ops = append(ops, clientv3.OpTxn(
					[]clientv3.Cmp{
						clientv3.Compare(clientv3.ModRevision(sk), "=", int64(w.Epoch)),
						clientv3.Compare(clientv3.ModRevision(ok), "=", int64(expect[k])),
					},
					then, []clientv3.Op{clientv3.OpGet(sk), clientv3.OpGet(ok, clientv3.WithKeysOnly())}))
			}
			resps, rev, err := s.batchTxn(ctx, ops)
			if err != nil {
				err = fmt.Errorf("write the state of %d shards: %w", hi-lo, err)
				for k := lo; k < hi; k++ {
					out[k] = storage.ShardWriteResult{Shard: sub[k], Err: err}
				}
				return err
			}
			for j, r := range resps {
				k := lo + j
				w := writes[idx[k]]
				res := storage.ShardWriteResult{Shard: w.Shard}
				if r.Succeeded {
					res.Revision = rev
				} else {
					res.Err = stateRefused(r, w, expect[k])
				}
				out[k] = res
			}
			return nil
		})
		return out, err
	})
}

// stateRefused is the error of a state write w whose nested transaction
// failed: r's Else read the lock, then the order key.
func stateRefused(r *clientv3.TxnResponse, w storage.ShardWrite, expect storage.Revision) error {
	var lock, order *mvccpb.KeyValue
	if len(r.Responses) == 2 {
		lock, order = rangeKV(r.Responses[0]), rangeKV(r.Responses[1])
	}
	if err := lockFence(lock, w.Shard, w.Epoch); err != nil {
		return err
	}
	oe := &storage.StateOrderError{Shard: w.Shard, Expected: expect}
	if order != nil {
		oe.Current = storage.Revision(order.ModRevision)
	}
	return oe
}
