package etcd

import (
	"context"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
			hk := s.prefix + storage.HandoffKey(puts[i].Record.From, puts[i].Shard)
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
						from := puts[lo+k].Record.From
						e.Existing, _ = storage.DecodeHandoff(from, keyValue(kv, len(s.key(storage.HandoffsFrom(from), ""))))
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
func (s *Store) DeleteHandoffs(ctx context.Context, lease storage.LeaseID, refs []storage.HandoffRef) ([]sharding.ShardID, error) {
	if err := storage.CheckHandoffRefs(lease, refs); err != nil {
		return nil, err
	}
	deleted := make([]bool, len(refs))
	err := forBatches(len(refs), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, ref := range refs[lo:hi] {
			hk := s.prefix + storage.HandoffKey(ref.From, ref.Shard)
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
			out = append(out, refs[i].Shard)
		}
	}
	if err != nil {
		return out, fmt.Errorf("delete %d handoff records: %w", len(refs), err)
	}
	return out, nil
}

// DeleteNotices implements storage.Notices: per notice, a nested
// transaction that deletes it if it is still at the revision applied.
func (s *Store) DeleteNotices(ctx context.Context, to string, seen []storage.NoticeSeen) (int, error) {
	if err := storage.CheckNotices(to, seen); err != nil {
		return 0, err
	}
	var mu sync.Mutex
	n := 0
	err := forBatches(len(seen), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, ns := range seen[lo:hi] {
			nk := s.prefix + storage.NoticeKey(to, ns.Shard)
			ops = append(ops, clientv3.OpTxn(
				[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(nk), "=", int64(ns.Revision))},
				[]clientv3.Op{clientv3.OpDelete(nk)}, nil))
		}
		resps, _, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, r := range resps {
			if r.Succeeded {
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
	ck := s.checkpointKey(shard, name)
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(s.checkpointFence(shard, ck, epoch, prev)...).
		Then(clientv3.OpPut(ck, string(storage.EncodeCheckpoint(epoch, data)))).
		Else(clientv3.OpGet(s.shardKey(shard)), clientv3.OpGet(ck, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return 0, fmt.Errorf("write checkpoint of shard %d: %w", shard, translate(err))
	}
	if !resp.Succeeded {
		return 0, checkpointRefused(resp, shard, name, epoch, prev)
	}
	return storage.Revision(resp.Header.Revision), nil
}

// checkpointFence is the condition of a checkpoint write or delete: the
// shard's lock at epoch and, unless prev is AnyRevision, the checkpoint
// key ck at revision prev (0: absent).
func (s *Store) checkpointFence(shard sharding.ShardID, ck string, epoch storage.Epoch, prev storage.Revision) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(s.shardKey(shard)), "=", int64(epoch))}
	if prev != storage.AnyRevision {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(ck), "=", int64(prev)))
	}
	return cmps
}

// lockFence is the *FencedError of a write fenced by epoch when the
// shard's lock (as read, nil when absent) is not at epoch, else nil.
func lockFence(lock *mvccpb.KeyValue, shard sharding.ShardID, epoch storage.Epoch) error {
	if lock != nil && storage.Epoch(lock.ModRevision) == epoch {
		return nil
	}
	fe := &storage.FencedError{Shard: shard, Epoch: epoch}
	if lock != nil {
		fe.Current = storage.Epoch(lock.ModRevision)
	}
	return fe
}

// checkpointRefused is the error of a checkpoint write or delete whose
// fence failed; resp's Else read the lock, then the checkpoint key.
func checkpointRefused(resp *clientv3.TxnResponse, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision) error {
	var lock, cp *mvccpb.KeyValue
	if len(resp.Responses) == 2 {
		lock, cp = rangeKV(resp.Responses[0]), rangeKV(resp.Responses[1])
	}
	if err := lockFence(lock, shard, epoch); err != nil {
		return err
	}
	ce := &storage.CheckpointChangedError{Shard: shard, Name: name, Prev: prev}
	if cp != nil {
		ce.Current = storage.Revision(cp.ModRevision)
	}
	return ce
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
