package memory

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/shardhost/shardhost/storage"
)

// Listing and watching a keyspace.

// List implements storage.Lister.
func (s *Store) List(ctx context.Context, ks storage.Keyspace) (storage.Snapshot, error) {
	c, err := s.enter(ctx, OpList)
	if err != nil {
		return storage.Snapshot{}, fmt.Errorf("list %s: %w", ks, err)
	}
	defer c.mu.Unlock()
	prefix := string(ks) + "/"
	snap := storage.Snapshot{Revision: c.rev}
	for k, e := range c.kvs {
		if name, ok := strings.CutPrefix(k, prefix); ok {
			kv := e.keyValue(k)
			kv.Key = name // relative to the keyspace listed
			snap.KVs = append(snap.KVs, kv)
		}
	}
	slices.SortFunc(snap.KVs, func(a, b storage.KeyValue) int { return strings.Compare(a.Key, b.Key) })
	return snap, nil
}

// Watch implements storage.Lister.
func (s *Store) Watch(ctx context.Context, ks storage.Keyspace, from storage.Revision) <-chan storage.WatchResponse {
	ch := make(chan storage.WatchResponse)
	s.mu.Lock()
	if s.calls == nil {
		s.calls = make(map[Op]int)
	}
	s.calls[OpWatch]++
	s.mu.Unlock()
	go s.watch(ctx, string(ks)+"/", false, from, ch)
	return ch
}

// WatchKey implements storage.Lister (fault hooks: OpWatch).
func (s *Store) WatchKey(ctx context.Context, key string, from storage.Revision) <-chan storage.WatchResponse {
	ch := make(chan storage.WatchResponse)
	s.mu.Lock()
	if s.calls == nil {
		s.calls = make(map[Op]int)
	}
	s.calls[OpWatch]++
	s.mu.Unlock()
	go s.watch(ctx, key, true, from, ch)
	return ch
}

// watch delivers the events of the keys under prefix (exact: of the key
// prefix alone), named relative to their keyspace.
func (s *Store) watch(ctx context.Context, prefix string, exact bool, next storage.Revision, ch chan<- storage.WatchResponse) {
	defer close(ch)
	c := s.c
	broken := s.brokenCh()
	send := func(r storage.WatchResponse) bool {
		select {
		case ch <- r:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		// A partitioned client sees nothing until the partition heals.
		s.mu.Lock()
		healed, partitioned := s.healed, s.partitioned
		s.mu.Unlock()
		if partitioned {
			select {
			case <-ctx.Done():
				return
			case <-broken:
				send(storage.WatchResponse{Err: fmt.Errorf("watch %s: %w: broken by test", prefix, storage.ErrUnavailable)})
				return
			case <-healed:
			}
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			send(storage.WatchResponse{Err: storage.ErrClosed})
			return
		}
		if next < c.compacted { // like etcd: revisions >= the compact revision remain
			c.mu.Unlock()
			send(storage.WatchResponse{Err: fmt.Errorf("watch %s from %d: %w (compacted at %d)", prefix, next, storage.ErrCompacted, c.compacted)})
			return
		}
		i, _ := slices.BinarySearchFunc(c.history, next, func(e event, r storage.Revision) int {
			return int(e.kv.ModRevision - r)
		})
		var evs []storage.Event
		for _, e := range c.history[i:] {
			if exact && e.key == prefix {
				kv := e.kv
				_, kv.Key = storage.KeyspaceOf(e.key)
				evs = append(evs, storage.Event{Type: e.typ, KV: kv})
			} else if name, ok := strings.CutPrefix(e.key, prefix); ok && !exact {
				kv := e.kv
				kv.Key = name // relative to the keyspace watched
				evs = append(evs, storage.Event{Type: e.typ, KV: kv})
			}
		}
		next = c.rev + 1
		changed := c.changed
		c.mu.Unlock()
		if len(evs) > 0 {
			if !send(storage.WatchResponse{Events: evs}) {
				return
			}
			s.mu.Lock()
			if s.delivered == nil {
				s.delivered = make(map[string]int)
			}
			s.delivered[prefix] += len(evs)
			s.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-broken:
			send(storage.WatchResponse{Err: fmt.Errorf("watch %s: %w: broken by test", prefix, storage.ErrUnavailable)})
			return
		case <-changed:
		}
	}
}
