package memory

import (
	"context"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// DeleteCheckpoint implements storage.Checkpoints.
func (s *Store) DeleteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision) error {
	if err := storage.CheckCheckpointWrite(shard, epoch, prev); err != nil {
		return err
	}
	c, err := s.enter(ctx, OpCheckpoint)
	if err != nil {
		return err
	}
	defer c.mu.Unlock()
	if err := c.checkpointFence(shard, name, epoch, prev); err != nil {
		return err
	}
	tx := c.begin()
	tx.del(storage.CheckpointKey(shard, name))
	tx.commit()
	return nil
}

// lockFence is the *FencedError of a write fenced by epoch when shard's
// lock is not at epoch (or absent), else nil. Called with c.mu held.
func (c *Cluster) lockFence(shard sharding.ShardID, epoch storage.Epoch) *storage.FencedError {
	e, ok := c.kvs[shardKey(shard)]
	if ok && storage.Epoch(e.mod) == epoch {
		return nil
	}
	fe := &storage.FencedError{Shard: shard, Epoch: epoch}
	if ok {
		fe.Current = storage.Epoch(e.mod)
	}
	return fe
}

// checkpointFence checks the condition of a checkpoint write or delete
// (storage.Checkpoints): the shard's lock at epoch (unless fencing is off,
// a fault of this store), the checkpoint at revision prev (0: absent) or
// prev AnyRevision. Called with c.mu held.
func (c *Cluster) checkpointFence(shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision) error {
	if fe := c.lockFence(shard, epoch); fe != nil && !c.unfenced {
		return fe
	}
	if prev == storage.AnyRevision {
		return nil
	}
	var cur storage.Revision
	if cp, ok := c.kvs[storage.CheckpointKey(shard, name)]; ok {
		cur = cp.mod
	}
	if cur != prev {
		return &storage.CheckpointChangedError{Shard: shard, Name: name, Prev: prev, Current: cur}
	}
	return nil
}

// clusterKV is the stored cluster record (keyValue names keys within a
// keyspace; this key has none).
func clusterKV(e *kv) storage.KeyValue {
	out := e.keyValue(storage.ClusterKey)
	out.Key = storage.ClusterKey
	return out
}

// ReadCluster implements storage.Clusters.
func (s *Store) ReadCluster(ctx context.Context) (storage.ClusterInfo, bool, error) {
	c, err := s.enter(ctx, OpCluster)
	if err != nil {
		return storage.ClusterInfo{}, false, err
	}
	defer c.mu.Unlock()
	e, ok := c.kvs[storage.ClusterKey]
	if !ok {
		return storage.ClusterInfo{}, false, nil
	}
	info, err := storage.DecodeCluster(clusterKV(e))
	return info, true, err
}

// WriteCluster implements storage.Clusters.
func (s *Store) WriteCluster(ctx context.Context, rec storage.ClusterRecord, rev storage.Revision) (storage.Revision, error) {
	val, err := storage.EncodeCluster(rec)
	if err != nil {
		return 0, err
	}
	if rev < 0 {
		return 0, storage.CheckRevision(rev)
	}
	c, err := s.enter(ctx, OpCluster)
	if err != nil {
		return 0, err
	}
	defer c.mu.Unlock()
	e, ok := c.kvs[storage.ClusterKey]
	switch {
	case ok && e.mod != rev:
		return 0, &storage.ClusterConflictError{Exists: true, Existing: clusterKV(e)}
	case !ok && rev != 0:
		return 0, &storage.ClusterConflictError{}
	}
	tx := c.begin()
	_ = tx.put(storage.ClusterKey, val, storage.NoLease)
	return tx.commit(), nil
}
