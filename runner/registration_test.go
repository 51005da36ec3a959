package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// noLossOrDetach fails on any Detached or ShardLost event of runner id.
func noLossOrDetach(t *testing.T, evs []runner.Event, id string) {
	t.Helper()
	for _, ev := range evs {
		if ev.Base().Runner != id {
			continue
		}
		switch e := ev.(type) {
		case runner.Detached:
			t.Errorf("%s detached (%v: %s)", id, e.Reason, e.Detail)
		case runner.ShardLost:
			t.Errorf("%s lost shard %d (%v)", id, e.Shard, e.Cause)
		}
	}
}

// ownRecord decodes runners/{id} of a memory cluster.
func ownRecord(t *testing.T, c *memory.Cluster, id string) (storage.Runner, bool) {
	t.Helper()
	kv, ok := c.Get("runners/" + id)
	if !ok {
		return storage.Runner{}, false
	}
	r, err := storage.DecodeRunner(kv)
	if err != nil {
		return storage.Runner{}, false
	}
	return r, true
}

// A runner's own record damaged while its lease lives is rewritten, with a
// WARN naming the key; the runner keeps every shard and the other runners
// see it again.
func TestOwnRecordDamagedIsRewritten(t *testing.T) {
	for _, tc := range []struct {
		name  string
		value string
		lease string // "own", "none" or "other"
	}{
		{"deleted", "", ""},
		{"garbage under its lease", "\x00garbage", "own"},
		{"wrong address under its lease", `{"id":"a","address":"10.9.9.9:7100","weight":1,"incarnation":"x","started":"2026-01-01T00:00:00Z"}`, "own"},
		{"draining under its lease", "", "own"},
		{"without a lease", `{"id":"a","weight":1,"incarnation":"x","started":"2026-01-01T00:00:00Z"}`, "none"},
		{"garbage under another lease", "{}", "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lc := &logCapture{}
				c := memory.NewCluster()
				t.Cleanup(c.Close)
				rec := newRecorder(t)
				a := start(t, c, rec, runner.Config{ID: "a", NumShards: 8, Logger: lc.logger(t)})
				b := start(t, c, rec, runner.Config{ID: "b", NumShards: 8})
				waitFor(t, 10*time.Second, "partition", func() bool { ok, _ := partitionOK([]*started{a, b}, 8); return ok })
				owned := a.Owned()
				want, _ := ownRecord(t, c, "a")

				var damaged storage.Revision
				switch tc.lease {
				case "":
					c.Delete("runners/a")
					damaged = c.Revision()
				default:
					lease := a.Status().Lease
					switch tc.lease {
					case "none":
						lease = storage.NoLease
					case "other":
						l, err := c.NewStore("other").Grant(t.Context(), time.Hour)
						if err != nil {
							t.Fatal(err)
						}
						lease = l.ID
					}
					value := []byte(tc.value)
					if tc.name == "draining under its lease" {
						d := want.RunnerRecord
						d.Weight, d.Draining = 0, true
						value, _ = storage.EncodeRunner(d)
					}
					var err error
					if damaged, err = c.Put("runners/a", value, lease); err != nil {
						t.Fatal(err)
					}
				}
				waitFor(t, 5*time.Second, "record rewritten", func() bool {
					got, ok := ownRecord(t, c, "a")
					return ok && got.ModRevision > damaged
				})
				got, _ := ownRecord(t, c, "a")
				if got.Lease != a.Status().Lease || got.Incarnation != a.Status().Incarnation || got.Address != want.Address ||
					got.Weight != want.Weight || got.Draining || !got.Started.Equal(want.Started) {
					t.Fatalf("rewritten record = %+v under lease %x, want %+v under %x", got.RunnerRecord, got.Lease, want.RunnerRecord, a.Status().Lease)
				}
				if n := len(lc.find(slog.LevelWarn, "own runner record", "key", "runners/a")); n != 1 {
					t.Errorf("%d WARN lines naming runners/a, want 1: %v", n, lc.all())
				}
				waitFor(t, 5*time.Second, "b sees a again", func() bool {
					for _, m := range b.Members() {
						if m.ID == "a" && m.Lease == a.Status().Lease && m.Incarnation == a.Status().Incarnation {
							return true
						}
					}
					return false
				})
				time.Sleep(time.Minute) // fake time: no repair loop, nothing lost
				if again, _ := ownRecord(t, c, "a"); again.ModRevision != got.ModRevision {
					t.Errorf("record rewritten again at %d after the repair at %d", again.ModRevision, got.ModRevision)
				}
				noLossOrDetach(t, rec.all(), "a")
				for id, e := range owned {
					if a.Owned()[id] != e {
						t.Errorf("shard %d at epoch %d, was %d", id, a.Owned()[id], e)
					}
				}
			})
		})
	}
}

// A process restarted with the ID of a crashed one (whose lease still
// lives) registers once that lease expired, takes all its shards, and
// reports no duplicate.
func TestRestartWithSameIDWaitsForCrashedPredecessor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lc := &logCapture{}
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		obs := c.NewStore("observer")
		a1 := start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		waitFor(t, 10*time.Second, "a1 owns all", func() bool { return len(a1.Owned()) == 8 })
		oldLease := a1.Status().Lease
		a1.Close() // a crash: the lease lives until its TTL
		from := c.Revision() + 1
		wctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		w := obs.Watch(wctx, storage.KeyspaceRunners, from)

		a2 := start(t, c, nil, runner.Config{ID: "a", NumShards: 8, Logger: lc.logger(t)})
		waitFor(t, time.Minute, "a2 owns all", func() bool { return len(a2.Owned()) == 8 })
		select {
		case err := <-a2.done:
			t.Fatalf("a2's Run returned %v", err)
		default:
		}
		// By the store's history: the old record went with its lease, then
		// a2 registered.
		var deleted, registered storage.Revision
		for deleted == 0 || registered == 0 {
			wr := <-w
			if wr.Err != nil {
				t.Fatal(wr.Err)
			}
			for _, ev := range wr.Events {
				switch {
				case ev.Type == storage.EventDelete && deleted == 0:
					deleted = ev.KV.ModRevision
				case ev.Type == storage.EventPut && registered == 0:
					r, err := storage.DecodeRunner(ev.KV)
					if err != nil || r.Incarnation != a2.Status().Incarnation {
						t.Fatalf("runners/a written with %+v, %v before a2 registered", r, err)
					}
					if deleted == 0 {
						t.Fatalf("a2 registered at revision %d while the crashed process's record was still there", ev.KV.ModRevision)
					}
					registered = ev.KV.ModRevision
				}
			}
		}
		if _, alive := c.LeaseTTL(oldLease); alive {
			t.Error("the crashed process's lease still exists")
		}
		for id, e := range a2.Owned() {
			if storage.Revision(e) <= deleted {
				t.Errorf("shard %d owned at epoch %d, not after the old lease ended at %d", id, e, deleted)
			}
		}
		if n := len(lc.find(slog.LevelWarn, "waiting for its lease to end", "key", "runners/a")); n != 1 {
			t.Errorf("%d WARN lines about waiting, want 1", n)
		}
		for _, l := range lc.all() {
			if l.Level >= slog.LevelError {
				t.Errorf("restart logged an error: %v", l)
			}
		}
	})
}

// A second live process with the same ID never takes the ID: it waits at
// most the holder's lease TTL (+2 s), logs an ERROR and its Run returns
// ErrDuplicateRunnerID; the first keeps its record and shards untouched.
func TestDuplicateLiveIDFailsTheNewer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lc := &logCapture{}
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		rec := newRecorder(t)
		a := start(t, c, rec, runner.Config{ID: "a", NumShards: 8})
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 8 })
		owned := a.Owned()
		kv0, _ := c.Get("runners/a")

		dup := start(t, c, nil, runner.Config{ID: "a", NumShards: 8, Logger: lc.logger(t)})
		var err error
		select {
		case err = <-dup.done:
			dup.done <- err // for the cleanup
		case <-time.After(time.Minute):
			t.Fatal("the duplicate is still running after a minute")
		}
		if !errors.Is(err, runner.ErrDuplicateRunnerID) {
			t.Fatalf("duplicate's Run = %v, want ErrDuplicateRunnerID", err)
		}
		if len(lc.find(slog.LevelError, "another live process uses this runner's ID", "key", "runners/a")) != 1 {
			t.Errorf("no ERROR line naming runners/a: %v", lc.all())
		}
		if kv1, _ := c.Get("runners/a"); kv1.ModRevision != kv0.ModRevision || kv1.Lease != kv0.Lease {
			t.Errorf("runners/a rewritten (%d, lease %x) by the duplicate; was %d, lease %x", kv1.ModRevision, kv1.Lease, kv0.ModRevision, kv0.Lease)
		}
		if _, alive := c.LeaseTTL(dup.Status().Lease); alive && dup.Status().Lease != storage.NoLease {
			t.Error("the duplicate's lease was not revoked")
		}
		noLossOrDetach(t, rec.all(), "a")
		for id, e := range owned {
			if a.Owned()[id] != e {
				t.Errorf("shard %d at epoch %d, was %d", id, a.Owned()[id], e)
			}
		}
	})
}

// If two live processes both wrote the record (here: the record deleted by
// hand while the second waited, and the first slow to restore it), both log
// an ERROR and the one that started first keeps the ID; the other's Run
// returns ErrDuplicateRunnerID.
func TestDuplicateIDWrittenByBothFirstStartedKeepsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lcA, lcB := &logCapture{}, &logCapture{}
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		rec := newRecorder(t)
		a := start(t, c, rec, runner.Config{ID: "a", NumShards: 8, Logger: lcA.logger(t)})
		waitFor(t, 10*time.Second, "a owns all", func() bool { return len(a.Owned()) == 8 })
		owned := a.Owned()
		b := start(t, c, nil, runner.Config{ID: "a", NumShards: 8, Logger: lcB.logger(t)})
		waitFor(t, 10*time.Second, "b waiting", func() bool { return len(lcB.find(slog.LevelWarn, "waiting for its lease to end")) > 0 })

		a.store.Delay(memory.OpPutRunner, time.Second) // a restores slowly: b claims the key first
		c.Delete("runners/a")
		var err error
		select {
		case err = <-b.done:
			b.done <- err
		case <-time.After(time.Minute):
			t.Fatal("the second process still runs after a minute")
		}
		if !errors.Is(err, runner.ErrDuplicateRunnerID) {
			t.Fatalf("second process's Run = %v, want ErrDuplicateRunnerID", err)
		}
		if len(lcB.find(slog.LevelError, "another process registered with this runner's ID", "key", "runners/a")) == 0 {
			t.Errorf("the second process logged no ERROR naming runners/a")
		}
		if len(lcA.find(slog.LevelError, "another process registered with this runner's ID", "key", "runners/a")) == 0 {
			t.Errorf("the first process logged no ERROR naming runners/a")
		}
		waitFor(t, 10*time.Second, "a's record back", func() bool {
			r, ok := ownRecord(t, c, "a")
			return ok && r.Incarnation == a.Status().Incarnation && r.Lease == a.Status().Lease
		})
		time.Sleep(time.Minute)
		if r, _ := ownRecord(t, c, "a"); r.Incarnation != a.Status().Incarnation {
			t.Errorf("runners/a names %s, want the first process %s", r.Incarnation, a.Status().Incarnation)
		}
		noLossOrDetach(t, rec.all(), "a")
		for id, e := range owned {
			if a.Owned()[id] != e {
				t.Errorf("shard %d at epoch %d, was %d", id, a.Owned()[id], e)
			}
		}
	})
}
