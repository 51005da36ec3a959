package reminders

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// ownedShard returns a service (not run) of runner "a", which acquired
// shard id in c, with the store it writes with and the shard's epoch; the
// shard's state is loaded if loaded. ctx is the shard's.
func ownedShard(ctx context.Context, t *testing.T, c *memory.Cluster, id sharding.ShardID, loaded bool) (*Service, *memory.Store, storage.Epoch) {
	t.Helper()
	st, epoch := acquire(t, c, "a", id)
	s := newTestService(t, st)
	s.Acquired(id, epoch, ctx)
	if loaded {
		if err := s.read(ctx, []*shardSet{s.current(id, epoch)}); err != nil {
			t.Fatal(err)
		}
	}
	return s, st, epoch
}

// TestReleaseWritesTheMarkersStillQueued: entities remembered just before
// their shard is released are in the writes that end the ownership, so
// that the next owner activates them: their markers' puts still queued
// (the service's writer skips a stopped set), or the entities remembered
// before the set's state loaded — also when the progress cannot be
// written (a registration still being written: the markers are written
// without it), and more than one write holds (several writes, in order).
// Without it, a remembered entity activated moments before a graceful
// stop was never activated again.
func TestReleaseWritesTheMarkersStillQueued(t *testing.T) {
	for _, tc := range []struct {
		name             string
		loaded, writing  bool
		entities, writes int
	}{
		{"put queued", true, false, 1, 1},
		{"remembered before the load", false, false, 1, 1},
		{"progress not known", true, true, 1, 1},
		{"more than a write holds", false, false, storage.MaxShardWriteOps + 10, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := memory.NewCluster()
			defer c.Close()
			const id = sharding.ShardID(5)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			// Not run: nothing writes the queued puts or loads the set,
			// as when the release comes first.
			s, st, epoch := ownedShard(ctx, t, c, id, tc.loaded)
			want := map[storage.EntityRef]bool{}
			for i := range tc.entities {
				ref := storage.EntityRef{Kind: "twin", ID: fmt.Sprintf("pump-%d", i)}
				want[ref] = true
				s.Remember(id, epoch, hosting.EntityKey{Kind: ref.Kind, ID: ref.ID})
			}
			// The release: pause, drain, stop keeping the set, then the
			// final writes.
			s.Pause(id, epoch)
			s.Stop(id, epoch, true)
			if tc.writing {
				set := s.current(id, epoch)
				set.mu.Lock()
				set.writers++ // a registration still being written
				set.mu.Unlock()
			}

			ws, err := s.Progress(id, epoch)
			if (err != nil) != tc.writing || len(ws) != tc.writes {
				t.Fatalf("Progress = %d writes, %v; want %d (an error: %v)", len(ws), err, tc.writes, tc.writing)
			}
			put := 0
			for _, w := range ws {
				if w.Shard != id || w.Epoch != epoch || w.Ops() > storage.MaxShardWriteOps || (tc.writing && w.Progress != nil) {
					t.Fatalf("write %+v: want shard %d at epoch %d, at most %d operations (and no progress when it is not known)", w, id, epoch, storage.MaxShardWriteOps)
				}
				put += len(w.PutRemembered)
				if res, err := st.WriteShardStates(t.Context(), []storage.ShardWrite{w}); err != nil || res[0].Err != nil {
					t.Fatalf("the release's write: %+v, %v", res, err)
				}
			}
			got, err := c.NewStore("next").ReadShardStates(t.Context(), []sharding.ShardID{id})
			if err != nil || len(got) != 1 || put != tc.entities || len(got[0].Remembered) != tc.entities {
				t.Fatalf("the writes put %d markers; the next owner reads %d, %v; want %d", put, len(got[0].Remembered), err, tc.entities)
			}
			for _, m := range got[0].Remembered {
				if !want[m.Entity] {
					t.Fatalf("the next owner reads a marker of %v, not remembered", m.Entity)
				}
			}
		})
	}
}

// TestReleaseLeavesOutAMarkerBeingForgotten: an entity whose forget is
// being written when the release computes its writes is not put back.
func TestReleaseLeavesOutAMarkerBeingForgotten(t *testing.T) {
	c := memory.NewCluster()
	defer c.Close()
	const id = sharding.ShardID(5)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	s, st, epoch := ownedShard(ctx, t, c, id, true)
	set := s.current(id, epoch)
	ref := storage.EntityRef{Kind: "twin", ID: "pump-7"}
	s.Remember(id, epoch, hosting.EntityKey{Kind: ref.Kind, ID: ref.ID})
	// Its forget's delete is in flight: the store holds it back.
	st.Delay(memory.OpShardState, time.Hour)
	forgot := make(chan error, 1)
	go func() { forgot <- s.ForgetEntity(ctx, id, epoch, hosting.EntityKey{Kind: ref.Kind, ID: ref.ID}) }()
	for {
		set.mu.Lock()
		forgetting := set.remembered[ref].forgetting
		set.mu.Unlock()
		if forgetting {
			break
		}
		time.Sleep(time.Millisecond)
	}
	s.Pause(id, epoch)
	s.Stop(id, epoch, true)
	ws, err := s.Progress(id, epoch)
	if err != nil || len(ws) != 0 {
		t.Fatalf("Progress = %+v, %v; want nothing to write (the only entity is being forgotten)", ws, err)
	}
	cancel()
	if err := <-forgot; err == nil {
		t.Fatal("the forget held back by the store succeeded")
	}
}
