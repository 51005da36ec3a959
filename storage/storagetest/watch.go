package storagetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Watches: no gaps, concurrent followers, compaction.

func nextEvents(t *testing.T, w <-chan storage.WatchResponse, n int) []storage.Event {
	t.Helper()
	var out []storage.Event
	timeout := time.After(opTimeout)
	for len(out) < n {
		select {
		case r, ok := <-w:
			if !ok {
				t.Fatalf("watch closed after %d of %d events", len(out), n)
			}
			if r.Err != nil {
				t.Fatalf("watch failed after %d of %d events: %v", len(out), n, r.Err)
			}
			out = append(out, r.Events...)
		case <-timeout:
			t.Fatalf("got %d of %d watch events (%+v) within %v", len(out), n, out, opTimeout)
		}
	}
	return out
}

func testWatchNoGaps(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	r0 := acquire(t, s, l, owner("a", "1"), 0, 1)[0]
	snap, err := s.List(ctx, storage.KeyspaceShards)
	if err != nil || len(snap.KVs) != 2 {
		t.Fatalf("List = %v, %v", snap.KVs, err)
	}
	// Writes between the list and the watch must not be lost.
	acquire(t, s, l, owner("a", "1"), 2)
	if _, err := s.Release(ctx, l, []storage.Held{{Shard: 0, Epoch: r0.Epoch}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.Watch(wctx, storage.KeyspaceShards, snap.Revision+1)
	acquire(t, s, l, owner("a", "1"), 3)
	evs := nextEvents(t, w, 3)
	want := []string{"PUT 2", "DELETE 0", "PUT 3"}
	var got []string
	last := snap.Revision
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%v %s", e.Type, e.KV.Key))
		if e.KV.ModRevision <= last {
			t.Errorf("event %v at revision %d, not after %d", e.Type, e.KV.ModRevision, last)
		}
		last = e.KV.ModRevision
	}
	if !slices.Equal(got, want) {
		t.Fatalf("watch from list revision + 1 = %v, want %v", got, want)
	}
}

// testWatchKey: a watch of one key from a past revision delivers that
// key's changes since (history first), named within its keyspace, and no
// other key's — not even one it is a prefix of.
func testWatchKey(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	r1 := acquire(t, s, l, owner("a", "1"), 1)[0]
	if _, err := s.Release(ctx, l, []storage.Held{{Shard: 1, Epoch: r1.Epoch}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.WatchKey(wctx, storage.LockKey(1), storage.Revision(r1.Epoch)+1)
	acquire(t, s, l, owner("a", "1"), 10, 11, 2) // shards/10 and shards/11 start with shards/1
	acquire(t, s, l, owner("a", "1"), 1)
	evs := nextEvents(t, w, 2)
	var got []string
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%v %s", e.Type, e.KV.Key))
	}
	if want := []string{"DELETE 1", "PUT 1"}; !slices.Equal(got, want) {
		t.Fatalf("watch of shards/1 = %v, want %v", got, want)
	}
}

// testFollowConcurrent checks that a Follow view equals a final list while
// writers race with the initial list.
func testFollowConcurrent(t *testing.T, in Instance) {
	s := in.Store
	l1, l2 := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	ctx, cancel := context.WithCancel(ctxT(t))
	var (
		mu   sync.Mutex
		view = map[string]storage.Revision{}
		rev  storage.Revision
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = storage.Follow(ctx, s, storage.KeyspaceShards, func(u storage.Update) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case u.Err != nil:
			case u.Reset:
				clear(view)
				for _, kv := range u.KVs {
					view[kv.Key] = kv.ModRevision
				}
				rev = u.Revision
			default:
				for _, e := range u.Events {
					if e.Type == storage.EventPut {
						view[e.KV.Key] = e.KV.ModRevision
					} else {
						delete(view, e.KV.Key)
					}
				}
				rev = u.Revision
			}
		})
	}()
	defer func() { cancel(); <-done }()
	var wg sync.WaitGroup
	for w, l := range []storage.LeaseID{l1, l2} {
		wg.Go(func() {
			for i := range 40 {
				sh := sharding.ShardID(i % 10)
				res, err := s.Acquire(ctx, l, owner(fmt.Sprint(w), "1"), []sharding.ShardID{sh})
				if err != nil {
					t.Errorf("Acquire = %v", err)
					return
				}
				if i%3 == 0 && res[0].Status != storage.HeldElsewhere {
					if _, err := s.Release(ctx, l, []storage.Held{{Shard: sh, Epoch: res[0].Epoch}}); err != nil {
						t.Errorf("Release = %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	snap, err := s.List(ctx, storage.KeyspaceShards)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]storage.Revision{}
	for _, kv := range snap.KVs {
		want[kv.Key] = kv.ModRevision
	}
	deadline := time.Now().Add(opTimeout)
	for {
		mu.Lock()
		caughtUp := rev >= snap.Revision || equalViews(view, want)
		same := equalViews(view, want)
		got, gotRev := maps.Clone(view), rev
		mu.Unlock()
		if caughtUp {
			if !same {
				// Not under mu: the deferred cancel waits for the follower,
				// whose callback takes mu.
				t.Fatalf("followed view %v at revision %d, want %v at %d", got, gotRev, want, snap.Revision)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower did not catch up to revision %d", snap.Revision)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func equalViews(a, b map[string]storage.Revision) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func testCompaction(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	first := acquire(t, s, l, owner("a", "1"), 1)[0].Epoch
	acquire(t, s, l, owner("a", "1"), 2)
	r3 := acquire(t, s, l, owner("a", "1"), 3)[0].Epoch
	if err := in.Compact(ctx, storage.Revision(r3)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	select {
	case r, ok := <-s.Watch(wctx, storage.KeyspaceShards, storage.Revision(first)):
		if !ok || !errors.Is(r.Err, storage.ErrCompacted) {
			t.Fatalf("Watch from a compacted revision = %+v (open %v), want ErrCompacted", r, ok)
		}
	case <-time.After(opTimeout):
		t.Fatal("Watch from a compacted revision did not fail")
	}
}
