package etcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/storage"
)

// Listing and watching a keyspace.

// List implements storage.Lister.
func (s *Store) List(ctx context.Context, ks storage.Keyspace) (storage.Snapshot, error) {
	prefix := s.key(ks, "")
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return storage.Snapshot{}, fmt.Errorf("list %s: %w", ks, translate(err))
	}
	snap := storage.Snapshot{Revision: storage.Revision(resp.Header.Revision), KVs: make([]storage.KeyValue, len(resp.Kvs))}
	for i, kv := range resp.Kvs {
		snap.KVs[i] = keyValue(kv, len(prefix))
	}
	return snap, nil
}

// Watch implements storage.Lister. The watch requires a leader: if the
// member it is connected to loses its leader, the watch fails with
// storage.ErrUnavailable instead of stalling.
func (s *Store) Watch(ctx context.Context, ks storage.Keyspace, from storage.Revision) <-chan storage.WatchResponse {
	prefix := s.key(ks, "")
	return s.watch(ctx, ks, prefix, len(prefix), from, clientv3.WithPrefix())
}

// WatchKey implements storage.Lister, as Watch for one key.
func (s *Store) WatchKey(ctx context.Context, key string, from storage.Revision) <-chan storage.WatchResponse {
	ks, _ := storage.KeyspaceOf(key)
	return s.watch(ctx, ks, s.prefix+key, len(s.prefix)+len(ks)+1, from)
}

// watch watches key (with opts: a prefix) from revision from; the names
// of the events' keys start at offset nameAt of the full key.
func (s *Store) watch(ctx context.Context, ks storage.Keyspace, key string, nameAt int, from storage.Revision, opts ...clientv3.OpOption) <-chan storage.WatchResponse {
	out := make(chan storage.WatchResponse)
	prefix := key
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	wch := s.cli.Watch(wctx, key, append(opts, clientv3.WithRev(int64(from)))...)
	go func() {
		defer close(out)
		defer cancel()
		send := func(r storage.WatchResponse) bool {
			select {
			case out <- r:
				return true
			case <-ctx.Done():
				return false
			}
		}
		for wr := range wch {
			if err := wr.Err(); err != nil {
				switch {
				case wr.CompactRevision != 0:
					err = fmt.Errorf("watch %s from %d: %w (compacted at %d)", ks, from, storage.ErrCompacted, wr.CompactRevision)
				case wr.Canceled && !errors.Is(classify(err), storage.ErrPermissionDenied):
					err = s.cancelled(ctx, ks, prefix, err)
				default:
					err = fmt.Errorf("watch %s: %w", ks, translate(err))
				}
				send(storage.WatchResponse{Err: err})
				return
			}
			if len(wr.Events) == 0 {
				continue
			}
			evs := make([]storage.Event, len(wr.Events))
			for i, ev := range wr.Events {
				evs[i].KV = keyValue(ev.Kv, nameAt)
				if ev.Type == mvccpb.DELETE {
					evs[i].Type = storage.EventDelete
				} else {
					evs[i].Type = storage.EventPut
				}
			}
			if !send(storage.WatchResponse{Events: evs}) {
				return
			}
		}
		if ctx.Err() == nil {
			send(storage.WatchResponse{Err: fmt.Errorf("watch %s: %w: watch channel closed", ks, storage.ErrUnavailable)})
		}
	}()
	return out
}

// cancelled explains a watch the server cancelled. The client hands over
// the server's reason as text only (a watch refused by the role, for
// one, arrives as the text of a gRPC status), so the store asks once,
// with a read of the same prefix, and reports what that read is refused
// with when it is a permission error; otherwise ErrUnavailable. The read
// is serializable (the member answers it without its leader, checking the
// same permission) and bounded by the attempt timeout: a watch cancelled
// because the leader changed is reported without waiting for the next.
func (s *Store) cancelled(ctx context.Context, ks storage.Keyspace, prefix string, err error) error {
	ctx, cancel := context.WithTimeout(ctx, s.attemptTimeout)
	defer cancel()
	if _, gerr := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithSerializable()); gerr != nil && errors.Is(classify(gerr), storage.ErrPermissionDenied) {
		return fmt.Errorf("watch %s: %w: %w (the server cancelled the watch: %v)", ks, storage.ErrPermissionDenied, gerr, err)
	}
	return fmt.Errorf("watch %s: %w: cancelled by the server: %w", ks, storage.ErrUnavailable, err)
}
