package reminders

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestReleaseWritesTheMarkersStillQueued: an entity remembered just before
// its shard is released is in the write that ends the ownership, so that
// the next owner activates it: its marker's put still queued (the
// service's writer skips a stopped set), or the entity remembered before
// the set's state loaded — also when the progress cannot be written (a
// registration still being written): the markers are written without it.
// Without it, a remembered entity activated moments before a graceful
// stop was never activated again.
func TestReleaseWritesTheMarkersStillQueued(t *testing.T) {
	for _, tc := range []struct {
		name            string
		loaded, writing bool
	}{
		{"put queued", true, false},
		{"remembered before the load", false, false},
		{"progress not known", true, true},
	} {
		loaded := tc.loaded
		t.Run(tc.name, func(t *testing.T) {
			c := memory.NewCluster()
			defer c.Close()
			const id = sharding.ShardID(5)
			st, epoch := acquire(t, c, "a", id)
			met, err := NewMetrics(noop.NewMeterProvider().Meter("test"), metric.WithAttributes())
			if err != nil {
				t.Fatal(err)
			}
			// No Run: nothing writes the queued puts or loads the set, as
			// when the release comes first.
			s := New(Config{}, st, nil, schedule.New(schedule.Config{}), met, slog.New(slog.NewTextHandler(io.Discard, nil)))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			s.Acquired(id, epoch, ctx)
			if loaded {
				if err := s.read(ctx, []*shardSet{s.current(id, epoch)}); err != nil {
					t.Fatal(err)
				}
			}
			s.Remember(id, epoch, hosting.EntityKey{Kind: "twin", ID: "pump-7"})
			// The release: pause, drain, stop keeping the set, then the
			// final write.
			s.Pause(id, epoch)
			s.Stop(id, epoch, true)
			if tc.writing {
				set := s.current(id, epoch)
				set.mu.Lock()
				set.writers++ // a registration still being written
				set.mu.Unlock()
			}

			w, write, err := s.Progress(id, epoch)
			want := storage.EntityRef{Kind: "twin", ID: "pump-7"}
			if (err != nil) != tc.writing || (tc.writing && w.Progress != nil) || !write || len(w.PutRemembered) != 1 || w.PutRemembered[0] != want || w.Shard != id || w.Epoch != epoch {
				t.Fatalf("Progress = %+v, write %v, %v; want a write of shard %d at epoch %d putting %v (with an error and no progress: %v)", w, write, err, id, epoch, want, tc.writing)
			}
			if res, err := st.WriteShardStates(t.Context(), []storage.ShardWrite{w}); err != nil || res[0].Err != nil {
				t.Fatalf("the release's write: %+v, %v", res, err)
			}
			got, err := c.NewStore("next").ReadShardStates(t.Context(), []sharding.ShardID{id})
			if err != nil || len(got) != 1 || len(got[0].Remembered) != 1 || got[0].Remembered[0].Entity != want {
				t.Fatalf("the next owner reads %+v, %v; want the marker of %v", got, err, want)
			}
		})
	}
}
