package runner_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// record returns runner id's stored record.
func record(t *testing.T, c *memory.Cluster, id string) (storage.Runner, bool) {
	t.Helper()
	kv, ok := c.Get(storage.Key(storage.KeyspaceRunners, id))
	if !ok {
		return storage.Runner{}, false
	}
	kv.Key = id
	r, err := storage.DecodeRunner(kv)
	if err != nil {
		t.Fatalf("runner record %s: %v", id, err)
	}
	return r, true
}

// TestOperatorDrain: a drain request (drains/{ID}) makes the runner publish
// its record draining, weight kept, and its shards move to the other
// runner by handoff, none lost; the record stays so (the runner's own
// record guard does not undo it); a restarted runner with that ID
// registers drained again; deleting the request brings it back.
func TestOperatorDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 16
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		rec := newRecorder(t)
		a := start(t, c, rec, runner.Config{ID: "a", NumShards: n})
		b := start(t, c, rec, runner.Config{ID: "b", NumShards: n})
		rs := []*started{a, b}
		waitFor(t, 10*time.Second, "an exact partition", func() bool { ok, _ := partitionOK(rs, n); return ok })
		before := len(rec.all())
		aOwned := len(a.Owned())

		val, err := storage.EncodeDrain("a", storage.DrainRequest{Requested: time.Now(), By: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put(storage.DrainKey("a"), val, storage.NoLease); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "b owning every shard", func() bool { return len(a.Owned()) == 0 && len(b.Owned()) == n })
		cutovers := 0
		for _, ev := range rec.all()[before:] {
			switch e := ev.(type) {
			case runner.ShardLost:
				t.Errorf("shard %d lost on %s (%v) during the drain, want handoffs", e.Shard, e.Runner, e.Cause)
			case runner.HandoffPhase:
				if e.Phase == runner.PhaseCutover && e.Runner == "b" && e.From == "a" {
					cutovers++
				}
			}
		}
		if cutovers != aOwned {
			t.Errorf("%d cutovers a -> b, want one per shard a owned (%d)", cutovers, aOwned)
		}
		time.Sleep(10 * time.Second) // the record guard and several drain checks had their chance
		if r, ok := record(t, c, "a"); !ok || !r.Draining || r.Weight != 1 || r.Incarnation != a.Status().Incarnation {
			t.Errorf("record of a = %+v (%v), want draining with weight 1", r, ok)
		}
		if len(a.Owned()) != 0 {
			t.Errorf("a owns %d shards while drained", len(a.Owned()))
		}

		// A new process with the same ID registers drained again.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := a.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		a2 := start(t, c, rec, runner.Config{ID: "a", NumShards: n})
		waitFor(t, 30*time.Second, "the new a registered drained", func() bool {
			r, ok := record(t, c, "a")
			return ok && r.Incarnation == a2.Status().Incarnation && r.Draining
		})
		waitFor(t, 30*time.Second, "b owning every shard", func() bool { return len(a2.Owned()) == 0 && len(b.Owned()) == n })

		// Undrain.
		if !c.Delete(storage.DrainKey("a")) {
			t.Fatal("no drain request to delete")
		}
		rs = []*started{a2, b}
		waitFor(t, 30*time.Second, "a taking shards again", func() bool {
			r, ok := record(t, c, "a")
			p, _ := partitionOK(rs, n)
			return ok && !r.Draining && p && len(a2.Owned()) > 0
		})
	})
}
