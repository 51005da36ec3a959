package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// DeleteCheckpoint implements storage.Checkpoints.
func (s *Store) DeleteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision) error {
	if err := storage.CheckCheckpointWrite(shard, epoch, prev); err != nil {
		return err
	}
	ck := s.checkpointKey(shard, name)
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(s.checkpointFence(shard, ck, epoch, prev)...).
		Then(clientv3.OpDelete(ck)).
		Else(clientv3.OpGet(s.shardKey(shard)), clientv3.OpGet(ck, clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return fmt.Errorf("delete checkpoint of shard %d: %w", shard, translate(err))
	}
	if !resp.Succeeded {
		return checkpointRefused(resp, shard, name, epoch, prev)
	}
	return nil
}

func (s *Store) clusterKey() string { return s.prefix + storage.ClusterKey }

// ReadCluster implements storage.Clusters.
func (s *Store) ReadCluster(ctx context.Context) (storage.ClusterInfo, bool, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.clusterKey())
	if err != nil {
		return storage.ClusterInfo{}, false, fmt.Errorf("read cluster record: %w", translate(err))
	}
	if len(resp.Kvs) == 0 {
		return storage.ClusterInfo{}, false, nil
	}
	info, err := storage.DecodeCluster(keyValue(resp.Kvs[0], len(s.prefix)))
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
	key := s.clusterKey()
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	// An absent key's ModRevision compares as 0: rev 0 means "absent".
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", int64(rev))).
		Then(clientv3.OpPut(key, string(val))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return 0, fmt.Errorf("write cluster record: %w", translate(err))
	}
	if !resp.Succeeded {
		ce := &storage.ClusterConflictError{}
		if kv := firstKV(resp); kv != nil {
			ce.Exists, ce.Existing = true, keyValue(kv, len(s.prefix))
		}
		return 0, ce
	}
	return storage.Revision(resp.Header.Revision), nil
}

// Endpoints returns the etcd endpoints the store's client uses (for logs:
// the runner names them when the store cannot be reached).
func (s *Store) Endpoints() []string { return s.cli.Endpoints() }
