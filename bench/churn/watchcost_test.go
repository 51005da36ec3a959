package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage"
)

// What etcd pays per watching runner, with and without its gRPC proxy.
//
// A hosting runner with scoped views watches four prefixes of its
// namespace, each on its one etcd client: two every runner watches
// (runners/, drains/) and two of its own (handoffs/{id}/, notices/{id}/).
// A watchFleet is that many clients watching exactly these, and nothing
// else: what it costs etcd (and the proxy) is what the watches of a fleet
// of runners cost, apart from their other requests.

// fleetPrefixes are the prefixes runner i watches (storage's keyspaces).
func fleetPrefixes(i int) []string {
	id := fmt.Sprintf("r%d", i)
	return []string{
		string(storage.KeyspaceRunners) + "/",
		string(storage.KeyspaceDrains) + "/",
		string(storage.HandoffsFrom(id)) + "/",
		string(storage.NoticesTo(id)) + "/",
	}
}

// watchFleet is n clients of endpoint, each watching fleetPrefixes.
type watchFleet struct {
	got    atomic.Int64 // events received by every watch together
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// openFleet opens the fleet's watches and returns once etcd (or the proxy)
// confirmed every one of them.
func openFleet(t testing.TB, endpoint string, n int) *watchFleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f := &watchFleet{cancel: cancel}
	t.Cleanup(f.close)
	created := make(chan struct{}, 4*n)
	for i := range n {
		cli := testenv.NewEtcdClient(t, endpoint)
		for _, p := range fleetPrefixes(i) {
			wch := cli.Watch(ctx, p, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			f.wg.Go(func() {
				for resp := range wch {
					if resp.Created {
						select { // once per watch; never blocks the watch
						case created <- struct{}{}:
						default:
						}
					}
					f.got.Add(int64(len(resp.Events)))
				}
			})
		}
	}
	timeout := time.After(2 * time.Minute)
	for range 4 * n {
		select {
		case <-created:
		case <-timeout:
			t.Fatalf("the watches of %d clients were not all created after 2 minutes", n)
		}
	}
	return f
}

// waitGot waits until the fleet received want events in all, or until
// quiet passed without an event; it returns how many are missing then.
func (f *watchFleet) waitGot(want int64, quiet time.Duration) (missing int64) {
	last, since := f.got.Load(), time.Now()
	for {
		got := f.got.Load()
		switch {
		case got >= want:
			return 0
		case got != last:
			last, since = got, time.Now()
		case time.Since(since) > quiet:
			return want - got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *watchFleet) close() {
	f.cancel()
	f.wg.Wait()
}

// watchCost is what one fleet cost.
type watchCost struct {
	runners                int
	etcdRSS, proxyRSS      float64       // MB added by the fleet's watches
	etcdShared, proxyShare time.Duration // CPU per event delivered to every runner (runners/), per delivery
	etcdOwn, proxyOwn      time.Duration // CPU per put of a key one runner watches (notices/{id}/), the put included
	etcdPut                time.Duration // CPU per put of a key nobody watches
	etcdWatchers           float64       // watchers etcd counts with the fleet open
	lost                   int64         // events never delivered (10 s without one)
}

// measureWatchCost opens a fleet of n runners on a fresh etcd, directly or
// through a gRPC proxy, and measures what etcd (and the proxy) pay: the
// resident memory the watches add, and the CPU per delivered event of
// puts every runner watches (net of what a put costs etcd with no
// watcher, measured first), and per put of keys one runner watches (the
// put included: one delivery is within the noise of a put's own cost).
// CPU comes in clock ticks of 10 ms.
func measureWatchCost(t testing.TB, n, sharedPuts, ownPuts int, viaProxy bool) watchCost {
	t.Helper()
	srv := testenv.StartEtcd(t)
	endpoint, proxyPID := srv.Endpoint(), 0
	if viaProxy {
		p := testenv.StartEtcdGRPCProxy(t, srv.Endpoint())
		endpoint, proxyPID = p.Endpoint(), p.PID()
	}
	direct := srv.Client(t)
	ctx := t.Context()
	rss := func(pid int) float64 {
		if pid == 0 {
			return 0
		}
		return pidRSSMB(pid)
	}
	cpu := func(pid int) time.Duration {
		if pid == 0 {
			return 0
		}
		return pidCPU(pid)
	}
	settle := func() { time.Sleep(500 * time.Millisecond) }

	c := watchCost{runners: n}
	var fleet *watchFleet
	// run makes puts puts of key(i) and waits for want events in all; it
	// returns the CPU etcd and the proxy spent meanwhile.
	run := func(puts int, key func(i int) string, want int64) (etcd, proxy time.Duration) {
		e0, p0 := cpu(srv.PID()), cpu(proxyPID)
		for i := range puts {
			if _, err := direct.Put(ctx, key(i), "x"); err != nil {
				t.Fatal(err)
			}
		}
		if fleet != nil {
			c.lost += fleet.waitGot(want, 10*time.Second)
		}
		return cpu(srv.PID()) - e0, cpu(proxyPID) - p0
	}
	// What a put costs etcd with no watcher: subtracted below, so that
	// the figures are the deliveries' own.
	settle()
	basePuts := max(sharedPuts, ownPuts)
	e, _ := run(basePuts, func(i int) string { return "unwatched/x" }, 0)
	perPut := e / time.Duration(basePuts)
	c.etcdPut = perPut

	settle()
	etcdBefore, proxyBefore := rss(srv.PID()), rss(proxyPID)
	fleet = openFleet(t, endpoint, n)
	settle()
	c.etcdRSS, c.proxyRSS = rss(srv.PID())-etcdBefore, rss(proxyPID)-proxyBefore
	m, err := etcdMetrics(ctx, srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	c.etcdWatchers = m[metricWatchers]

	// Puts of a key every runner watches, then of keys one runner watches.
	shared := string(storage.KeyspaceRunners) + "/watch-cost"
	base := fleet.got.Load()
	e, p := run(sharedPuts, func(int) string { return shared }, base+int64(sharedPuts*n))
	c.etcdShared, c.proxyShare = (e-perPut*time.Duration(sharedPuts))/time.Duration(sharedPuts*n), p/time.Duration(sharedPuts*n)
	base = fleet.got.Load()
	e, p = run(ownPuts, func(i int) string { return fleetPrefixes(i % n)[3] + "x" }, base+int64(ownPuts))
	c.etcdOwn, c.proxyOwn = e/time.Duration(ownPuts), p/time.Duration(ownPuts)
	fleet.close()
	return c
}

// TestGRPCProxyCoalescesTheWatchesEveryRunnerShares checks the deployment
// option docs/deploying.md describes: behind etcd's gRPC proxy, the two
// prefixes every runner watches cost etcd one watcher each, whatever the
// number of runners, while each runner's own prefixes stay one watcher
// each; without the proxy every watch is a watcher of etcd.
func TestGRPCProxyCoalescesTheWatchesEveryRunnerShares(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and its gRPC proxy")
	}
	t.Parallel()
	const n = 20
	direct := measureWatchCost(t, n, 5, 5, false)
	proxied := measureWatchCost(t, n, 5, 5, true)
	t.Logf("etcd watchers for %d runners: %v directly, %v through the proxy; events lost: %d directly, %d through the proxy",
		n, direct.etcdWatchers, proxied.etcdWatchers, direct.lost, proxied.lost)
	if direct.lost != 0 {
		t.Errorf("%d events never reached the fleet's watches on etcd itself", direct.lost)
	}
	if direct.etcdWatchers < 4*n {
		t.Errorf("etcd counts %v watchers for %d runners watching 4 prefixes each; want at least %d", direct.etcdWatchers, n, 4*n)
	}
	// Through the proxy: a watcher per runner's own prefix (2n), and for
	// the shared prefixes a handful whatever n (44 measured at n = 20,
	// against 4n = 80 without coalescing).
	if want := float64(2*n + 8); proxied.etcdWatchers > want {
		t.Errorf("through the proxy etcd counts %v watchers for %d runners; want at most %v (the shared prefixes coalesced)", proxied.etcdWatchers, n, want)
	}
}

// BenchmarkEtcdWatchCost measures what etcd pays per watching runner,
// directly and through its gRPC proxy, at 100 and 1 000 runners (each a
// client of its own with the four watches of a hosting runner): resident
// memory per runner, and CPU per delivered event, for an event every
// runner watches (a membership change) and for one a single runner
// watches (a notice). The figures are per process (etcd, proxy), from
// /proc: run it on an otherwise idle machine.
//
//	go test -run '^$' -bench EtcdWatchCost -benchtime 1x ./bench/churn/
func BenchmarkEtcdWatchCost(b *testing.B) {
	for _, n := range []int{100, 1000} {
		for _, viaProxy := range []bool{false, true} {
			name := fmt.Sprintf("runners=%d/direct", n)
			if viaProxy {
				name = fmt.Sprintf("runners=%d/grpc-proxy", n)
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					c := measureWatchCost(b, n, 200, 2000, viaProxy)
					b.ReportMetric(c.etcdRSS*1024/float64(n), "etcd-KB/runner")
					b.ReportMetric(c.etcdWatchers, "etcd-watchers")
					b.ReportMetric(float64(c.lost), "events-lost")
					b.ReportMetric(float64(c.etcdShared.Nanoseconds())/1e3, "etcd-µs/shared-delivery")
					b.ReportMetric(float64(c.etcdPut.Nanoseconds())/1e3, "etcd-µs/put-unwatched")
					b.ReportMetric(float64(c.etcdOwn.Nanoseconds())/1e3, "etcd-µs/put-one-watcher")
					if viaProxy {
						b.ReportMetric(c.proxyRSS*1024/float64(n), "proxy-KB/runner")
						b.ReportMetric(float64(c.proxyShare.Nanoseconds())/1e3, "proxy-µs/shared-delivery")
						b.ReportMetric(float64(c.proxyOwn.Nanoseconds())/1e3, "proxy-µs/put-one-watcher")
					}
					runtime.GC()
				}
			})
		}
	}
}
