package runner_test

import (
	"testing"
	"testing/synctest"
	"time"
)

// A watch that fails and is followed by a successful listing is not a
// streak: the store works. Watches end whenever a connection is lost (an
// etcd member restarts, gRPC keepalive drops a connection), so counting
// such failures over the life of an attachment would detach a healthy
// runner after StorageErrorThreshold member restarts.
func TestWatchFailuresFollowedByListingsDoNotDetach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, r, rec := startOwningAll(t, detachCfg("a"))
		threshold := r.Config().StorageErrorThreshold
		for range 2 * threshold {
			r.store.BreakWatches()
			time.Sleep(10 * time.Second)
			synctest.Wait()
		}
		if ds := detachedEvents(rec.all()); len(ds) > 0 {
			t.Fatalf("detached after %d broken watches, each followed by a good listing: %s: %s", 2*threshold, ds[0].Reason, ds[0].Detail)
		}
		if n := len(r.Owned()); n != r.Config().NumShards {
			t.Errorf("owns %d shards, want %d", n, r.Config().NumShards)
		}
	})
}
