package runner_test

import (
	"log/slog"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
)

// Keys that name no shard of the cluster — not canonical ("07", "+3",
// "3 "), negative, not a number, out of range — are never taken for a
// lock: the owner of the shard they resemble keeps it (no detach), and
// each key is logged once at WARN, however often it is written.
func TestStrayLockKeysAreIgnoredAndLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lc := &logCapture{}
		// The lock watch reads every lock key: a full lock view.
		c, a, rec := startOwningAll(t, runner.Config{ID: "a", NumShards: 8, Logger: lc.logger(t), FullLockView: true})
		before := a.Owned()
		other, err := c.NewStore("other").Grant(t.Context(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		owner := []byte(`{"runnerID":"other","incarnation":"1"}`)
		keys := []string{"07", "+3", "3 ", "-1", "abc", "8", "9999", "4294967296", "03"}
		for range 2 { // written twice, logged once
			for _, k := range keys {
				if _, err := c.Put("shards/"+k, owner, other.ID); err != nil {
					t.Fatal(err)
				}
			}
		}
		c.Delete("shards/07")
		c.Delete("shards/03")
		time.Sleep(time.Minute) // fake time: verification, resyncs
		noLossOrDetach(t, rec.all(), "a")
		for id, e := range before {
			if a.Owned()[id] != e {
				t.Errorf("shard %d at epoch %d, was %d", id, a.Owned()[id], e)
			}
		}
		for _, k := range keys {
			if n := len(lc.find(slog.LevelWarn, "names no shard", "key", "shards/"+k)); n != 1 {
				t.Errorf("key shards/%q logged %d times, want once", k, n)
			}
		}
		if o, _ := a.OwnerOf(3); o != "a" {
			t.Errorf("OwnerOf(3) = %q, want a", o)
		}
	})
}

// A runner record without a lease can never expire, so it is no live
// runner: it gets no shards (logged once), also when it looks valid.
func TestLeaselessRunnerRecordIsNoMember(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lc := &logCapture{}
		// The lock watch reads every lock key: a full lock view.
		c, a, rec := startOwningAll(t, runner.Config{ID: "a", NumShards: 8, Logger: lc.logger(t), FullLockView: true})
		ghost, _ := storage.EncodeRunner(storage.RunnerRecord{ID: "ghost", Weight: 1, Incarnation: "1", Started: time.Now()})
		for range 2 {
			if _, err := c.Put("runners/ghost", ghost, storage.NoLease); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Minute)
		for _, m := range a.Members() {
			if m.ID == "ghost" {
				t.Errorf("the lease-less record is a member: %+v", m)
			}
		}
		if n := a.Assignment().Counts()["a"]; n != 8 || len(a.Owned()) != 8 {
			t.Errorf("a is assigned %d and owns %d shards, want all 8", n, len(a.Owned()))
		}
		if n := len(lc.find(slog.LevelWarn, "no live registration", "key", "runners/ghost")); n != 1 {
			t.Errorf("runners/ghost logged %d times, want once", n)
		}
		noLossOrDetach(t, rec.all(), "a")
	})
}
