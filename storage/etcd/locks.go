package etcd

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Lock operations: each batch is one transaction of nested per-shard
// transactions (storage.MaxShardsPerTxn shards), up to batchParallelism
// batches in flight.

// batchTxn runs one transaction whose Then holds one nested op per shard of
// shards[lo:hi] and returns the nested responses and the revision.
func (s *Store) batchTxn(ctx context.Context, ops []clientv3.Op) ([]*clientv3.TxnResponse, storage.Revision, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, translate(err)
	}
	out := make([]*clientv3.TxnResponse, len(resp.Responses))
	for i, r := range resp.Responses {
		t := r.GetResponseTxn()
		if t == nil {
			return nil, 0, fmt.Errorf("%w: nested response %d is not a txn", storage.ErrUnavailable, i)
		}
		out[i] = (*clientv3.TxnResponse)(t)
	}
	return out, storage.Revision(resp.Header.Revision), nil
}

// firstKV returns the key read by the first operation of r, or nil.
func firstKV(r *clientv3.TxnResponse) *mvccpb.KeyValue {
	if len(r.Responses) == 0 {
		return nil
	}
	return rangeKV(r.Responses[0])
}

// prevKV returns the previous key of the put of a succeeded per-shard
// transaction (see putLockOps), or nil when the key was absent.
func prevKV(r *clientv3.TxnResponse) *mvccpb.KeyValue {
	if len(r.Responses) == 0 {
		return nil
	}
	if pr := r.Responses[0].GetResponsePut(); pr != nil {
		return pr.PrevKv
	}
	return nil
}

// rangeKV returns the first key of a range response, or nil.
func rangeKV(op *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	if rr := op.GetResponseRange(); rr != nil && len(rr.Kvs) > 0 {
		return rr.Kvs[0]
	}
	return nil
}

// putLockOps returns, per shard, a transaction that puts the lock under
// lease if cmp(key) holds, else reads the lock.
func (s *Store) putLockOps(lease storage.LeaseID, val []byte, shards []sharding.ShardID, cmp func(key string) clientv3.Cmp) []clientv3.Op {
	v := string(val)
	ops := make([]clientv3.Op, len(shards))
	for i, sh := range shards {
		key := s.shardKey(sh)
		ops[i] = clientv3.OpTxn(
			[]clientv3.Cmp{cmp(key)},
			[]clientv3.Op{clientv3.OpPut(key, v, clientv3.WithLease(clientv3.LeaseID(lease)), clientv3.WithPrevKV())},
			[]clientv3.Op{clientv3.OpGet(key)})
	}
	return ops
}

// batchParallelism is how many batch transactions of one call are in flight
// at once: etcd commits concurrent requests in one raft entry and fsync, so
// a 4096-shard acquire takes a few round trips instead of 64.
const batchParallelism = 8

// forBatches calls fn for each [lo, hi) batch of n items, up to
// batchParallelism at a time, and returns the first error (the other
// batches still complete: each is atomic on its own).
func forBatches(n int, fn func(lo, hi int) error) error {
	return forBatchesOf(n, storage.MaxShardsPerTxn, fn)
}

// forBatchesOf is forBatches with batches of size items.
func forBatchesOf(n, size int, fn func(lo, hi int) error) error {
	return forRanges(storage.Batches(n, size), fn)
}

// forRanges calls fn for each [lo, hi) of batches, up to batchParallelism
// at a time, and returns the first error.
func forRanges(batches [][2]int, fn func(lo, hi int) error) error {
	if len(batches) == 0 {
		return nil
	}
	if len(batches) == 1 {
		return fn(batches[0][0], batches[0][1])
	}
	errs := make([]error, len(batches))
	sem := make(chan struct{}, batchParallelism)
	var wg sync.WaitGroup
	for i, b := range batches {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = fn(b[0], b[1])
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// Acquire implements storage.Locks.
func (s *Store) Acquire(ctx context.Context, lease storage.LeaseID, owner storage.Owner, shards []sharding.ShardID) ([]storage.AcquireResult, error) {
	val, err := storage.EncodeOwner(owner)
	if err != nil {
		return nil, err
	}
	if err := storage.CheckShardsFor(lease, shards); err != nil {
		return nil, err
	}
	out := make([]storage.AcquireResult, len(shards))
	err = forBatches(len(shards), func(lo, hi int) error {
		batch := shards[lo:hi]
		ops := s.putLockOps(lease, val, batch, func(key string) clientv3.Cmp {
			// Absent or without a lease: a missing key's lease compares as 0.
			return clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.NoLease)
		})
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for i, r := range resps {
			res := storage.AcquireResult{Shard: batch[i]}
			kv := firstKV(r)
			switch {
			case r.Succeeded:
				res.Status, res.Epoch = storage.Acquired, storage.Epoch(rev)
				if prev := prevKV(r); prev != nil {
					replaced := s.lockOf(prev)
					res.Replaced = &replaced
				}
			case kv != nil && storage.LeaseID(kv.Lease) == lease:
				res.Status, res.Epoch, res.Holder = storage.AlreadyOwned, storage.Epoch(kv.ModRevision), s.lockOf(kv)
			case kv != nil:
				res.Status, res.Holder = storage.HeldElsewhere, s.lockOf(kv)
			default:
				return fmt.Errorf("shard %d: %w: lock neither created nor found", batch[i], storage.ErrUnavailable)
			}
			out[lo+i] = res
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("acquire %d shards: %w", len(shards), err)
	}
	return out, nil
}

// Verify implements storage.Locks: one read-only transaction per batch that
// compares lease and ModRevision of every lock and returns no reads on the
// healthy path.
func (s *Store) Verify(ctx context.Context, lease storage.LeaseID, held []storage.Held) ([]storage.LostLock, error) {
	if err := storage.CheckHeldBy(lease, held); err != nil {
		return nil, err
	}
	perBatch := make([][]storage.LostLock, len(storage.Batches(len(held), storage.MaxShardsPerTxn)))
	err := forBatches(len(held), func(lo, hi int) error {
		batch := held[lo:hi]
		cmps := make([]clientv3.Cmp, 0, 2*len(batch))
		gets := make([]clientv3.Op, len(batch))
		for i, h := range batch {
			key := s.shardKey(h.Shard)
			cmps = append(cmps,
				clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.LeaseID(lease)),
				clientv3.Compare(clientv3.ModRevision(key), "=", int64(h.Epoch)))
			gets[i] = clientv3.OpGet(key)
		}
		tctx, cancel := s.ctx(ctx)
		resp, err := hedged(tctx, s.members, s.attemptTimeout, func(ctx context.Context, m *member) (*clientv3.TxnResponse, error) {
			return m.kv.Txn(clientv3.WithRequireLeader(ctx)).If(cmps...).Else(gets...).Commit()
		})
		cancel()
		if err != nil {
			return translate(err)
		}
		if resp.Succeeded {
			return nil
		}
		lost := &perBatch[lo/storage.MaxShardsPerTxn]
		for i, h := range batch {
			kv := rangeKV(resp.Responses[i])
			switch {
			case kv == nil:
				*lost = append(*lost, storage.LostLock{Shard: h.Shard})
			case storage.LeaseID(kv.Lease) != lease || storage.Epoch(kv.ModRevision) != h.Epoch:
				*lost = append(*lost, storage.LostLock{Shard: h.Shard, Exists: true, Holder: s.lockOf(kv)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("verify %d locks: %w", len(held), err)
	}
	return slices.Concat(perBatch...), nil
}

// releasedNotice is the value of a NoticeReleased.
var releasedNotice = func() string {
	b, _ := storage.EncodeNotice(storage.NoticeRecord{Kind: storage.NoticeReleased}) // valid
	return string(b)
}()

// Release implements storage.Locks.
func (s *Store) Release(ctx context.Context, lease storage.LeaseID, held []storage.Held) ([]sharding.ShardID, error) {
	if err := storage.CheckHeldBy(lease, held); err != nil {
		return nil, err
	}
	done := make([]bool, len(held))
	err := forBatches(len(held), func(lo, hi int) error {
		batch := held[lo:hi]
		ops := make([]clientv3.Op, len(batch))
		for i, h := range batch {
			key := s.shardKey(h.Shard)
			then := []clientv3.Op{clientv3.OpDelete(key)}
			if h.Tell != "" {
				then = append(then, clientv3.OpPut(s.prefix+storage.NoticeKey(h.Tell, h.Shard), releasedNotice, clientv3.WithLease(clientv3.LeaseID(lease))))
			}
			ops[i] = clientv3.OpTxn(
				[]clientv3.Cmp{
					clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.LeaseID(lease)),
					clientv3.Compare(clientv3.ModRevision(key), "=", int64(h.Epoch)),
				},
				then, nil)
		}
		resps, _, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for i, r := range resps {
			done[lo+i] = r.Succeeded
		}
		return nil
	})
	var released []sharding.ShardID
	for i, ok := range done {
		if ok {
			released = append(released, held[i].Shard)
		}
	}
	if err != nil {
		return released, fmt.Errorf("release %d shards: %w", len(held), err)
	}
	return released, nil
}

// Rewrite implements storage.Locks.
func (s *Store) Rewrite(ctx context.Context, lease storage.LeaseID, owner storage.Owner, shards []sharding.ShardID) ([]storage.AcquireResult, error) {
	val, err := storage.EncodeOwner(owner)
	if err != nil {
		return nil, err
	}
	if err := storage.CheckShardsFor(lease, shards); err != nil {
		return nil, err
	}
	out := make([]storage.AcquireResult, len(shards)) // Status 0: absent, dropped below
	err = forBatches(len(shards), func(lo, hi int) error {
		batch := shards[lo:hi]
		ops := s.putLockOps(lease, val, batch, func(key string) clientv3.Cmp {
			return clientv3.Compare(clientv3.LeaseValue(key), "=", clientv3.LeaseID(lease)) // ours
		})
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			return err
		}
		for i, r := range resps {
			if r.Succeeded {
				out[lo+i] = storage.AcquireResult{Shard: batch[i], Status: storage.Acquired, Epoch: storage.Epoch(rev)}
			} else if kv := firstKV(r); kv != nil {
				out[lo+i] = storage.AcquireResult{Shard: batch[i], Status: storage.HeldElsewhere, Holder: s.lockOf(kv)}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rewrite %d locks: %w", len(shards), err)
	}
	return slices.DeleteFunc(out, func(r storage.AcquireResult) bool { return r.Status == 0 }), nil
}

// Transfer implements storage.Locks: per shard, a nested transaction that
// moves the lock and deletes the handoff record if the lock is the
// caller's at FromEpoch and the record the target's, else reads both.
func (s *Store) Transfer(ctx context.Context, reqs []storage.TransferRequest) ([]storage.TransferResult, error) {
	if err := storage.CheckTransfers(reqs); err != nil {
		return nil, err
	}
	vals, notices := make([]string, len(reqs)), make([]string, len(reqs))
	for i, req := range reqs {
		v, err := storage.EncodeOwner(req.ToOwner)
		if err != nil {
			return nil, err
		}
		n, err := storage.EncodeNotice(storage.NoticeRecord{Kind: storage.NoticeMoved, From: req.From, Incarnation: req.ToOwner.Incarnation})
		if err != nil {
			return nil, err
		}
		vals[i], notices[i] = string(v), string(n)
	}
	out := make([]storage.TransferResult, len(reqs))
	err := forBatches(len(reqs), func(lo, hi int) error {
		ops := make([]clientv3.Op, 0, hi-lo)
		for i := lo; i < hi; i++ {
			req := reqs[i]
			sk, hk := s.shardKey(req.Shard), s.prefix+storage.HandoffKey(req.From, req.Shard)
			nk := s.prefix + storage.NoticeKey(req.ToOwner.RunnerID, req.Shard)
			cmps := []clientv3.Cmp{
				clientv3.Compare(clientv3.LeaseValue(sk), "=", clientv3.LeaseID(req.FromLease)),
				clientv3.Compare(clientv3.ModRevision(sk), "=", int64(req.FromEpoch)),
				clientv3.Compare(clientv3.LeaseValue(hk), "=", clientv3.LeaseID(req.ToLease)),
			}
			if req.HandoffRevision != 0 {
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(hk), "=", int64(req.HandoffRevision)))
			}
			ops = append(ops, clientv3.OpTxn(cmps,
				[]clientv3.Op{
					clientv3.OpPut(sk, vals[i], clientv3.WithLease(clientv3.LeaseID(req.ToLease))),
					clientv3.OpDelete(hk),
					clientv3.OpPut(nk, notices[i], clientv3.WithLease(clientv3.LeaseID(req.ToLease))),
				},
				[]clientv3.Op{clientv3.OpGet(sk)}))
		}
		resps, rev, err := s.batchTxn(ctx, ops)
		if err != nil {
			err = fmt.Errorf("transfer %d shards: %w", hi-lo, err)
			for i := lo; i < hi; i++ {
				out[i] = storage.TransferResult{Shard: reqs[i].Shard, Err: err}
			}
			return err
		}
		for k, r := range resps {
			req := reqs[lo+k]
			res := storage.TransferResult{Shard: req.Shard}
			switch kv := firstKV(r); {
			case r.Succeeded:
				res.Epoch = storage.Epoch(rev)
			case kv == nil || storage.LeaseID(kv.Lease) != req.FromLease || storage.Epoch(kv.ModRevision) != req.FromEpoch:
				res.Err = fmt.Errorf("transfer shard %d: %w", req.Shard, storage.ErrNotOwner)
			default:
				res.Err = fmt.Errorf("transfer shard %d: %w", req.Shard, storage.ErrNoHandoff)
			}
			out[lo+k] = res
		}
		return nil
	})
	return out, err
}
