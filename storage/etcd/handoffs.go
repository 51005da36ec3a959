package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Handoff records and checkpoints.

// PutHandoffs implements storage.Handoffs: per record, a nested
// transaction that creates the key if absent, else updates it if it is
// under lease, else reads it (a conflict).
func (s *Store) PutHandoffs(ctx context.Context, lease storage.LeaseID, puts []storage.HandoffPut) ([]storage.HandoffResult, error) {
	vals, err := storage.EncodeHandoffs(lease, puts)
	if err != nil {
		return nil, err
	}
	out := make([]storage.HandoffResult, len(puts))
	err = forBatches(len(puts), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for i := lo; i < hi; i++ {
			hk := s.handoffKey(puts[i].Shard)
			put := clientv3.OpPut(hk, string(vals[i]), clientv3.WithLease(clientv3.LeaseID(lease)))
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(hk), "=", 0)},
				[]clientv3.Op{put},
				[]clientv3.Op{clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(hk), "=", clientv3.LeaseID(lease))},
					[]clientv3.Op{put},
					[]clientv3.Op{clientv3.OpGet(hk)})}))
		}
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			err = fmt.Errorf("put %d handoff records: %w", hi-lo, err)
			for i := lo; i < hi; i++ {
				out[i] = storage.HandoffResult{Shard: puts[i].Shard, Err: err}
			}
			return err
		}
		for k, r := range resps {
			res := storage.HandoffResult{Shard: puts[lo+k].Shard, Revision: rev}
			if !r.Succeeded {
				if nested := r.Responses[0].GetResponseTxn(); nested != nil && !nested.Succeeded {
					e := &storage.HandoffConflictError{Shard: res.Shard}
					if kv := firstKV((*clientv3.TxnResponse)(nested)); kv != nil {
						e.Existing, _ = storage.DecodeHandoff(keyValue(kv, len(s.key(storage.KeyspaceHandoffs, ""))))
					}
					res.Revision, res.Err = 0, e
				}
			}
			out[lo+k] = res
		}
		return nil
	})
	return out, err
}

// DeleteHandoffs implements storage.Handoffs.
func (s *Store) DeleteHandoffs(ctx context.Context, lease storage.LeaseID, shards []sharding.ShardID) ([]sharding.ShardID, error) {
	if err := storage.CheckShardsFor(lease, shards); err != nil {
		return nil, err
	}
	deleted := make([]bool, len(shards))
	err := forBatches(len(shards), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, sh := range shards[lo:hi] {
			hk := s.handoffKey(sh)
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(hk), "=", clientv3.LeaseID(lease))},
				[]clientv3.Op{clientv3.OpDelete(hk)}, nil))
		}
		resps, _, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for k, r := range resps {
			deleted[lo+k] = r.Succeeded
		}
		return nil
	})
	var out []sharding.ShardID
	for i, ok := range deleted {
		if ok {
			out = append(out, shards[i])
		}
	}
	if err != nil {
		return out, fmt.Errorf("delete %d handoff records: %w", len(shards), err)
	}
	return out, nil
}

// WriteCheckpoint implements storage.Checkpoints.
func (s *Store) WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, data []byte) (storage.Revision, error) {
	if err := storage.CheckEpoch(shard, epoch); err != nil {
		return 0, err
	}
	sk := s.shardKey(shard)
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sk), "=", int64(epoch))).
		Then(clientv3.OpPut(s.checkpointKey(shard, name), string(storage.EncodeCheckpoint(epoch, data)))).
		Else(clientv3.OpGet(sk)).Commit()
	if err != nil {
		return 0, fmt.Errorf("write checkpoint of shard %d: %w", shard, translate(err))
	}
	if !resp.Succeeded {
		fe := &storage.FencedError{Shard: shard, Epoch: epoch}
		if kv := firstKV(resp); kv != nil {
			fe.Current = storage.Epoch(kv.ModRevision)
		}
		return 0, fe
	}
	return storage.Revision(resp.Header.Revision), nil
}

// ReadCheckpoint implements storage.Checkpoints.
func (s *Store) ReadCheckpoint(ctx context.Context, shard sharding.ShardID, name string) (storage.Checkpoint, bool, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.checkpointKey(shard, name))
	if err != nil {
		return storage.Checkpoint{}, false, fmt.Errorf("read checkpoint of shard %d: %w", shard, translate(err))
	}
	if len(resp.Kvs) == 0 {
		return storage.Checkpoint{}, false, nil
	}
	cp, err := storage.DecodeCheckpoint(shard, name, resp.Kvs[0].Value, storage.Revision(resp.Kvs[0].ModRevision))
	return cp, err == nil, err
}
