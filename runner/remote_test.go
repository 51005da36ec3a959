package runner_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// where reports the runner and shard a handler ran on.
type where struct{ n int64 }

type whereReq struct{}

type whereResp struct {
	Runner string
	Shard  sharding.ShardID
	N      int64
}

func (w *where) Where(ctx context.Context, _ whereReq) (whereResp, error) {
	info, _ := runner.ShardInfoFrom(ctx)
	w.n++
	return whereResp{Runner: info.Runner, Shard: info.Shard, N: w.n}, nil
}

var (
	// whereKind's entities are never passivated while a test runs (the
	// default IdleAfter, 2 min, is shorter than 10 000 asks take under
	// -race on a loaded machine): the tests count them resident.
	whereKind   = entity.NewKind("where", func(string) *where { return &where{} }, entity.IdleAfter(24*time.Hour))
	whereMethod = entity.Method(whereKind, "where", (*where).Where)
)

// remoteCluster starts n hosting runners and one client-only runner on a
// real etcd, all with transports on loopback.
func remoteCluster(t *testing.T, n, shards int, ttl time.Duration) (*cluster, []*etcdRunner, *etcdRunner) {
	c := startEtcdCluster(t)
	var rs []*etcdRunner
	for i := range n {
		r := c.start(runner.Config{ID: fmt.Sprintf("r%d", i), NumShards: shards, ListenAddr: "127.0.0.1:0", LeaseTTL: ttl})
		if err := r.Register(whereKind); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	client := c.start(runner.Config{ID: "gateway", NumShards: shards, ClientOnly: true})
	if err := client.Register(whereKind); err != nil {
		t.Fatal(err)
	}
	c.waitPartition(rs, shards, 30*time.Second)
	return c, rs, client
}

// ownersByLease maps every shard to the runner whose lease holds its lock.
func ownersByLease(c *cluster, rs []*etcdRunner) map[sharding.ShardID]string {
	byLease := map[storage.LeaseID]string{}
	for _, r := range rs {
		byLease[r.Status().Lease] = r.ID()
	}
	out := map[sharding.ShardID]string{}
	for id, l := range c.locks() {
		out[id] = byLease[l]
	}
	return out
}

func TestEtcdRemoteAsksLandOnOwners(t *testing.T) {
	t.Parallel()
	c, rs, client := remoteCluster(t, 3, 256, 0)
	owners := ownersByLease(c, rs)
	const entities = 10000
	var wrong, failed atomic.Int64
	var wg sync.WaitGroup
	ids := make(chan int)
	start := time.Now()
	for range 32 {
		wg.Go(func() {
			for i := range ids {
				id := fmt.Sprintf("entity-%d", i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				got, err := whereMethod.Ask(ctx, client, id, whereReq{})
				cancel()
				switch {
				case err != nil:
					if failed.Add(1) <= 3 {
						t.Errorf("Ask(%s) = %v", id, err)
					}
				case got.Runner != owners[sharding.ShardOf(id, 256)] || got.Shard != sharding.ShardOf(id, 256):
					if wrong.Add(1) <= 3 {
						t.Errorf("%s ran on %s shard %d; lock owner %s", id, got.Runner, got.Shard, owners[sharding.ShardOf(id, 256)])
					}
				}
			}
		})
	}
	for i := range entities {
		ids <- i
	}
	close(ids)
	wg.Wait()
	t.Logf("%d asks to distinct entities through a client-only runner in %v: %d failed, %d off-owner",
		entities, time.Since(start).Round(time.Millisecond), failed.Load(), wrong.Load())
	resident := 0
	for _, r := range rs {
		resident += r.Status().Entities
	}
	if resident != entities {
		t.Errorf("%d entities resident on the owners, want %d", resident, entities)
	}
}

// traffic asks random entities until stop, recording outcomes.
type traffic struct {
	ok, maybe, other atomic.Int64
	mu               sync.Mutex
	others           []error
	maybeErrs        []error
	latencies        []time.Duration
	wg               sync.WaitGroup
	stop             chan struct{}
}

func runTraffic(client *etcdRunner, callers, entities int, timeout time.Duration) *traffic {
	tr := &traffic{stop: make(chan struct{})}
	for g := range callers {
		tr.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-tr.stop:
					return
				default:
				}
				id := fmt.Sprintf("t-%d", (g*7919+i)%entities)
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				t0 := time.Now()
				_, err := whereMethod.Ask(ctx, client, id, whereReq{})
				d := time.Since(t0)
				cancel()
				switch {
				case err == nil:
					tr.ok.Add(1)
				case errors.Is(err, runner.ErrMaybeDelivered):
					tr.maybe.Add(1)
					tr.mu.Lock()
					tr.maybeErrs = append(tr.maybeErrs, err)
					tr.mu.Unlock()
				default:
					tr.other.Add(1)
					tr.mu.Lock()
					tr.others = append(tr.others, err)
					tr.mu.Unlock()
				}
				tr.mu.Lock()
				tr.latencies = append(tr.latencies, d)
				tr.mu.Unlock()
			}
		})
	}
	return tr
}

func (tr *traffic) finish(d time.Duration) bool {
	close(tr.stop)
	done := make(chan struct{})
	go func() { tr.wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

func TestEtcdRemoteOwnerCrashDuringAsks(t *testing.T) {
	t.Parallel()
	const ttl = 4 * time.Second
	c, rs, client := remoteCluster(t, 3, 64, ttl)
	tr := runTraffic(client, 16, 500, 3*ttl) // contexts outlive the TTL
	time.Sleep(time.Second)
	crashed := time.Now()
	rs[2].stop() // Close: no release, no revoke
	c.waitPartition(rs[:2], 64, 30*time.Second)
	failover := time.Since(crashed)
	time.Sleep(time.Second)
	if !tr.finish(4 * ttl) {
		t.Fatal("asks still hanging long after their contexts should have ended")
	}
	t.Logf("owner crash: failover in %v; asks: %d ok, %d ErrMaybeDelivered (in flight on the crashed owner), %d other",
		failover.Round(time.Millisecond), tr.ok.Load(), tr.maybe.Load(), tr.other.Load())
	for i, err := range tr.others {
		if i < 5 {
			t.Errorf("ask failed with an untyped outcome: %v", err)
		}
	}
	if tr.ok.Load() == 0 {
		t.Fatal("no ask succeeded")
	}
	checkSingleOwner(t, c.rec.all())
}

func TestEtcdRemoteGracefulShutdownZeroFailures(t *testing.T) {
	t.Parallel()
	c, rs, client := remoteCluster(t, 3, 64, 0)
	tr := runTraffic(client, 16, 500, 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	before := tr.ok.Load()
	rs[2].shutdown(t)
	c.waitPartition(rs[:2], 64, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	if !tr.finish(15 * time.Second) {
		t.Fatal("asks hanging")
	}
	t.Logf("graceful shutdown under traffic: %d asks ok (%d during and after the stop), %d maybe-delivered, %d other",
		tr.ok.Load(), tr.ok.Load()-before, tr.maybe.Load(), tr.other.Load())
	if tr.maybe.Load() != 0 || tr.other.Load() != 0 {
		for i, err := range tr.others {
			if i < 5 {
				t.Errorf("failed ask: %v", err)
			}
		}
		t.Fatalf("%d asks failed during a graceful shutdown, want 0 (maybe-delivered: %v)", tr.maybe.Load()+tr.other.Load(), tr.maybeErrs)
	}
}
