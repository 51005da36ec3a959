package etcd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/storage"
)

// Operator calls: not part of storage.Store, used by tools such as
// cmd/shardhostctl that inspect and steer a cluster from outside.

// RequestDrain writes drains/{id} (storage.KeyspaceDrains), without a
// lease: runner id, whenever it runs, takes no shard until CancelDrain.
// An existing request is overwritten.
func (s *Store) RequestDrain(ctx context.Context, id string, req storage.DrainRequest) (storage.Revision, error) {
	val, err := storage.EncodeDrain(id, req)
	if err != nil {
		return 0, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Put(ctx, s.prefix+storage.DrainKey(id), string(val))
	if err != nil {
		return 0, fmt.Errorf("request drain of %q: %w", id, translate(err))
	}
	return storage.Revision(resp.Header.Revision), nil
}

// CancelDrain deletes drains/{id} and reports whether a request existed.
func (s *Store) CancelDrain(ctx context.Context, id string) (bool, error) {
	if err := storage.ValidateRunnerID(id); err != nil {
		return false, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Delete(ctx, s.prefix+storage.DrainKey(id))
	if err != nil {
		return false, fmt.Errorf("cancel drain of %q: %w", id, translate(err))
	}
	return resp.Deleted > 0, nil
}

// LeaseTimeToLive returns how long the lease has left on the server
// (storage.ErrLeaseNotFound when it expired or was revoked).
func (s *Store) LeaseTimeToLive(ctx context.Context, id storage.LeaseID) (time.Duration, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		return 0, fmt.Errorf("lease %x time to live: %w", id, translate(err))
	}
	if resp.TTL < 0 {
		return 0, fmt.Errorf("lease %x: %w", id, storage.ErrLeaseNotFound)
	}
	return time.Duration(resp.TTL) * time.Second, nil
}

// Revision returns the current revision of the etcd cluster (a
// linearizable read, so it also proves that etcd answers).
func (s *Store) Revision(ctx context.Context) (storage.Revision, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("read revision: %w", translate(err))
	}
	return storage.Revision(resp.Header.Revision), nil
}

// Namespaces returns the namespaces that hold shardhost keys in the etcd
// cluster behind cli — runners/, shards/, handoffs/, drains/, and what a
// cluster keeps with no runner up: its cluster record, remembered/,
// singletons/, reminders/ — sorted, looking at no more than limit keys (0:
// no limit).
func Namespaces(ctx context.Context, cli *clientv3.Client, limit int64) ([]string, error) {
	ctx, cancel := storage.WithOpTimeout(ctx, DefaultOpTimeout)
	defer cancel()
	resp, err := cli.Get(ctx, "/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("list namespaces: %w", translate(err))
	}
	seen := map[string]bool{}
	for _, kv := range resp.Kvs {
		ns, rest, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), "/"), "/")
		if !ok {
			continue
		}
		ks, _, _ := strings.Cut(rest, "/")
		switch storage.Keyspace(ks) {
		case storage.KeyspaceRunners, storage.KeyspaceShards, storage.KeyspaceHandoffs, storage.KeyspaceDrains,
			storage.Keyspace(storage.ClusterKey), storage.KeyspaceRemembered, storage.KeyspaceSingletons, storage.KeyspaceReminders:
			seen[ns] = true
		}
	}
	out := make([]string, 0, len(seen))
	for ns := range seen {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out, nil
}
