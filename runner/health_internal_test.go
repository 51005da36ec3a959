package runner

import (
	"strings"
	"testing"

	"github.com/shardhost/shardhost/storage/memory"
)

// TestLivenessReportsAStuckRunner: a runner whose state stays locked (a
// goroutine stuck holding its mutex) is not live after healthLockWait, and
// checks made meanwhile share one read of its state; live again once the
// mutex is free.
func TestLivenessReportsAStuckRunner(t *testing.T) {
	t.Parallel()
	r := newUnstartedRunner(t)
	if c := r.CheckLiveness(); !c.OK {
		t.Fatalf("liveness before Run = %+v, want live", c)
	}
	r.mu.Lock()
	results := make(chan HealthCheck, 2)
	for range 2 {
		go func() { results <- r.CheckLiveness() }()
	}
	for range 2 {
		if c := <-results; c.OK || !strings.HasPrefix(c.Reason, "stuck: ") {
			t.Errorf("liveness of a runner whose mutex stays locked = %+v, want stuck", c)
		}
	}
	r.healthReads.mu.Lock()
	inFlight := r.healthReads.cur != nil
	r.healthReads.mu.Unlock()
	r.mu.Unlock()
	if !inFlight {
		t.Error("no read in flight while the mutex was locked")
	}
	if c := r.CheckLiveness(); !c.OK {
		t.Errorf("liveness once the mutex is free = %+v, want live", c)
	}
}

// newUnstartedRunner returns a runner "a" of 4 shards on an in-memory
// store, Run not called.
func newUnstartedRunner(t *testing.T) *Runner {
	t.Helper()
	s := memory.New()
	t.Cleanup(func() { s.Cluster().Close() })
	r, err := New(s, Config{ID: "a", NumShards: 4})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
