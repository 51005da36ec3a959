package runner_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

func startEtcdCluster(t *testing.T) *cluster {
	srv := testenv.StartEtcd(t)
	return newCluster(t, []string{srv.Endpoint()}, srv.Client(t))
}

func TestEtcdConvergesToExactPartition(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3, 8} {
		t.Run(fmt.Sprintf("%d-runners", n), func(t *testing.T) {
			c := startEtcdCluster(t)
			var rs []*etcdRunner
			start := time.Now()
			for i := range n {
				rs = append(rs, c.start(runner.Config{ID: fmt.Sprintf("r%d", i), NumShards: 1024}))
			}
			c.waitPartition(rs, 1024, 30*time.Second)
			t.Logf("%d runners own an exact partition of 1024 shards %v after start", n, time.Since(start).Round(time.Millisecond))
			checkSingleOwner(t, c.rec.all())
		})
	}
}

func TestEtcdJoinMovesOnlyStrategyShards(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	var rs []*etcdRunner
	for i := range 3 {
		rs = append(rs, c.start(runner.Config{ID: fmt.Sprintf("r%d", i), NumShards: 1024}))
	}
	c.waitPartition(rs, 1024, 30*time.Second)
	before := rs[0].Assignment()
	joinedAt := time.Now()
	rs = append(rs, c.start(runner.Config{ID: "r3", NumShards: 1024}))
	c.waitPartition(rs, 1024, 30*time.Second)
	after := rs[0].Assignment()
	moved := sharding.Diff(before, after)
	want, err := sharding.Balanced().Assign(sharding.Input{NumShards: 1024, Runners: []sharding.Runner{{ID: "r0", Weight: 1}, {ID: "r1", Weight: 1}, {ID: "r2", Weight: 1}, {ID: "r3", Weight: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := sharding.Diff(want, after); len(d) != 0 {
		t.Fatalf("assignment after the join differs from the strategy's in %d shards", len(d))
	}
	// Only the moved shards changed hands: no ownership event on others.
	changed := map[sharding.ShardID]bool{}
	for _, ev := range c.rec.all() {
		if ev.Base().Time.Before(joinedAt) {
			continue
		}
		switch e := ev.(type) {
		case runner.ShardAcquired:
			changed[e.Shard] = true
		case runner.ShardReleased:
			changed[e.Shard] = true
		case runner.ShardLost:
			changed[e.Shard] = true
		}
	}
	isMoved := map[sharding.ShardID]bool{}
	for _, id := range moved {
		isMoved[id] = true
	}
	for id := range changed {
		if !isMoved[id] {
			t.Errorf("shard %d changed owner although the strategy kept it", id)
		}
	}
	if len(changed) != len(moved) {
		t.Errorf("%d shards changed owner, the strategy moved %d", len(changed), len(moved))
	}
	t.Logf("join of a 4th runner moved %d of 1024 shards (optimum %d); converged in %v", len(moved), 1024/4, time.Since(joinedAt).Round(time.Millisecond))
	checkSingleOwner(t, c.rec.all())
}

func TestEtcdGracefulShutdownIsWatchDriven(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	cfg := func(id string) runner.Config {
		return runner.Config{ID: id, NumShards: 256, LeaseTTL: 10 * time.Second}
	}
	rs := []*etcdRunner{c.start(cfg("a")), c.start(cfg("b")), c.start(cfg("c"))}
	c.waitPartition(rs, 256, 30*time.Second)
	gone := len(rs[2].Owned())
	leaseID := rs[2].Status().Lease
	stopped := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rs[2].Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// When Shutdown returns, the lease is revoked and the runner key
	// deleted: the others are told by their watches, not by an expiry.
	ttl, err := c.direct.TimeToLive(ctx, clientv3.LeaseID(leaseID))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.TTL != -1 {
		t.Errorf("lease %x still has %ds to live after Shutdown, want it revoked", leaseID, ttl.TTL)
	}
	resp, err := c.direct.Get(ctx, "/"+c.ns+"/runners/c")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Errorf("runner key of c survived Shutdown (lease %x)", resp.Kvs[0].Lease)
	}
	rs[2].stop()
	c.waitPartition(rs[:2], 256, 30*time.Second)
	t.Logf("%d shards of the stopped runner re-owned %v after Shutdown began", gone, time.Since(stopped).Round(time.Millisecond))
	checkSingleOwner(t, c.rec.all())
}

func TestEtcdCrashTakeoverAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	cfg := func(id string) runner.Config {
		return runner.Config{ID: id, NumShards: 256, LeaseTTL: 4 * time.Second}
	}
	rs := []*etcdRunner{c.start(cfg("a")), c.start(cfg("b")), c.start(cfg("c"))}
	c.waitPartition(rs, 256, 30*time.Second)
	deletes := c.watchDeletes("runners/")
	victim := rs[2].Owned()
	crashed := time.Now()
	rs[2].stop() // Close: no release, no revoke
	c.waitPartition(rs[:2], 256, 30*time.Second)
	// The observer's watch and the recorder deliver asynchronously.
	var (
		expired    time.Time
		expiredRev storage.Revision
		evs        []runner.Event
		takeovers  []runner.ShardAcquired // of c's shards, above c's epoch
	)
	waitFor(t, 10*time.Second, "the observer to see c's key deleted", func() bool {
		var ok bool
		expired, expiredRev, ok = deletes.get("c")
		return ok
	})
	waitFor(t, 10*time.Second, "a takeover of each of c's shards recorded", func() bool {
		evs, takeovers = c.rec.all(), nil
		taken := map[sharding.ShardID]bool{}
		for _, who := range []string{"a", "b"} {
			for id, as := range acquiredOf(evs, who) {
				for _, a := range as {
					if cEpoch, ok := victim[id]; ok && a.Epoch > cEpoch {
						takeovers = append(takeovers, a)
						taken[id] = true
					}
				}
			}
		}
		return len(taken) == len(victim)
	})
	var last time.Time
	for _, a := range takeovers {
		// By etcd revision, exact: each takeover lock was written after
		// the server deleted c's key with its lease.
		if storage.Revision(a.Epoch) <= expiredRev {
			t.Errorf("%s acquired shard %d at revision %d, not after the crashed runner's lease expired at revision %d", a.Runner, a.Shard, a.Epoch, expiredRev)
		}
		if a.Time.After(last) {
			last = a.Time
		}
	}
	t.Logf("crash at 0: lease expired on the server at %v; all %d shards re-owned at %v",
		expired.Sub(crashed).Round(time.Millisecond), len(victim), last.Sub(crashed).Round(time.Millisecond))
	checkSingleOwner(t, evs)
}

// A lock held elsewhere is retried for AcquireRetryWindow, then the runner
// waits: only the watch can wake it when the lock is deleted.
func TestEtcdWatchDrivenReacquire(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	ctx := t.Context()
	// A foreign lease holds every shard before the runner starts.
	l, err := c.direct.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	for id := range n {
		if _, err := c.direct.Put(ctx, fmt.Sprintf("/%s/shards/%d", c.ns, id), `{"runnerID":"squatter"}`, clientv3.WithLease(l.ID)); err != nil {
			t.Fatal(err)
		}
	}
	rd := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
	r := c.start(runner.Config{ID: "a", NumShards: n, AcquireRetryWindow: time.Second, MeterProvider: mp})
	waitFor(t, 30*time.Second, "the retry window (1s) exhausted on every shard", func() bool {
		return readMetrics(t, rd)["sharding.acquire_retry_window_exhausted"] >= n
	})
	if len(r.Owned()) != 0 {
		t.Fatal("acquired a shard held elsewhere")
	}
	var lat []time.Duration
	for id := range n {
		key := fmt.Sprintf("/%s/shards/%d", c.ns, id)
		deleted := time.Now()
		if _, err := c.direct.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
		var as []runner.ShardAcquired
		for p := testenv.NewPatience(10 * time.Second); len(as) == 0; as = acquiredOf(c.rec.all(), "a")[sharding.ShardID(id)] {
			if p.Over() {
				t.Fatalf("shard %d not re-acquired %v after its lock was deleted", id, p)
			}
			p.Sleep(time.Millisecond)
		}
		lat = append(lat, as[0].Time.Sub(deleted))
	}
	t.Logf("watch-driven re-acquire latency (delete -> owned), %d runs: median %v, all %v (AcquireRetryInterval %v, window exhausted)",
		len(lat), median(lat), lat, runner.DefaultAcquireRetryInterval)
}

func TestEtcdRapidJoinsNeverDoubleOwn(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	var rs []*etcdRunner
	for i := range 5 {
		rs = append(rs, c.start(runner.Config{ID: fmt.Sprintf("r%d", i), NumShards: 1024}))
		time.Sleep(50 * time.Millisecond)
	}
	c.waitPartition(rs, 1024, 60*time.Second)
	evs := c.rec.all()
	checkSingleOwner(t, evs)
	moves := 0
	for _, ev := range evs {
		if _, ok := ev.(runner.ShardReleased); ok {
			moves++
		}
	}
	t.Logf("5 runners joining 50ms apart converged; %d planned releases on the way", moves)
}

func TestEtcdShutdownContextBoundsIt(t *testing.T) {
	c := startEtcdCluster(t)
	r := c.start(runner.Config{ID: "a", NumShards: 16})
	c.waitPartition([]*etcdRunner{r}, 16, 30*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Shutdown(ctx); err == nil {
		t.Error("Shutdown with a cancelled context returned nil")
	}
	r.stop()
}
