package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
	"github.com/shardhost/shardhost/storage/memory"
)

// BenchmarkSingleRunnerOwnsAll: one runner (default config: lease TTL 15 s,
// op timeout 3 s) starts on an empty namespace of a real etcd and must own
// all NumShards shards without detaching; time from Run to the last
// ShardAcquired. sharding.MaxShards is at most what it does promptly
// (it does 65 536 in under 2 s: one runner is not what bounds it now).
// SHARDHOST_MAXSHARDS_SIZES (comma separated) replaces the sizes (counts
// above MaxShards need MaxShards raised first).
func BenchmarkSingleRunnerOwnsAll(b *testing.B) {
	sizes := []int{4096, sharding.MaxShards}
	if s := os.Getenv("SHARDHOST_MAXSHARDS_SIZES"); s != "" {
		sizes = nil
		for _, f := range splitComma(s) {
			n, err := strconv.Atoi(f)
			if err != nil {
				b.Fatal(err)
			}
			sizes = append(sizes, n)
		}
	}
	srv := testenv.StartEtcd(b)
	cli := testenv.NewEtcdClient(b, srv.Endpoint())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ns := 0
	for _, shards := range sizes {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			var total time.Duration
			runs := 0
			for b.Loop() {
				runs++
				ns++
				s, err := etcd.New(cli, fmt.Sprintf("maxshards-%d", ns), etcd.Config{})
				if err != nil {
					b.Fatal(err)
				}
				r, err := runner.New(s, runner.Config{ID: "r", NumShards: shards, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				sub := r.Subscribe()
				start := time.Now()
				done := make(chan error, 1)
				go func() { done <- r.Run(context.Background()) }()
				got, detaches := 0, 0
				limit := time.After(60 * time.Second)
			wait:
				for got < shards {
					select {
					case ev := <-sub.Events():
						switch ev.(type) {
						case runner.ShardAcquired:
							got++
						case runner.Detached:
							detaches++
						}
					case <-limit:
						break wait
					}
				}
				took := time.Since(start)
				total += took
				b.StopTimer()
				if got < shards || detaches > 0 {
					b.Errorf("%d shards: owned %d after %v, %d detaches", shards, got, took.Round(time.Millisecond), detaches)
				} else {
					b.Logf("%d shards: owned all after %v", shards, took.Round(time.Millisecond))
				}
				r.Close() // the lease expires on its own; the next run uses a new namespace
				<-done
				sub.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(runs), "ms-to-own-all/op")
		})
	}
}

func splitComma(s string) []string {
	var out []string
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == ',' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}

// BenchmarkRunnerHeapAtMaxShards measures the memory a runner keeps at
// sharding.MaxShards shards (on the in-memory store, so that only the
// runners' heap grows): the live heap after GC once 1 runner owns every
// shard, and once 4 runners share them, each minus the heap before. With
// F the cost of a runner whatever it owns (its tables sized by the shard
// count: lock view, assignment, planner, routing epochs, host table) and P
// the cost of an owned shard, 1 runner is F + S·P and 4 are 4F + S·P:
// F = (heap4 - heap1) / 3.
func BenchmarkRunnerHeapAtMaxShards(b *testing.B) {
	n := sharding.MaxShards
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// grown returns the heap growth of m runners owning all n shards.
	grown := func(m int) float64 {
		c := memory.NewCluster()
		defer c.Close()
		before := liveHeap()
		var rs []*runner.Runner
		var done []chan error
		for i := range m {
			r, err := runner.New(c.NewStore(fmt.Sprint("r", i)), runner.Config{ID: fmt.Sprint("r", i), NumShards: n, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			ch := make(chan error, 1)
			go func() { ch <- r.Run(context.Background()) }()
			rs, done = append(rs, r), append(done, ch)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			owned := 0
			for _, r := range rs {
				owned += len(r.Owned())
			}
			if owned == n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d runners own %d of %d shards after 2 minutes", m, owned, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Second) // the watches catch up with the last acquisitions
		after := liveHeap()
		for i, r := range rs {
			r.Close()
			<-done[i]
		}
		return float64(after) - float64(before)
	}
	for b.Loop() {
		one, four := grown(1), grown(4)
		fixed := (four - one) / 3
		b.ReportMetric(one/(1<<20), "MB-1-runner-owning-all")
		b.ReportMetric(four/(1<<20), "MB-4-runners")
		b.ReportMetric(fixed/(1<<20), "MB-per-runner-fixed")
		b.ReportMetric((one-fixed)/float64(n), "B-per-owned-shard")
	}
}

// BenchmarkRunnerHeapOwningOnePercent measures the memory of one runner
// among 100 at sharding.MaxShards shards on a real etcd: the live heap
// after GC once it owns the shards assigned to it (1 %: 655 or 656),
// minus the heap before it started. The other 99 members are runner
// records under a lease of this benchmark's (no process behind them, no
// locks), so that only this runner's heap is measured; its store's client
// is created before. SHARDHOST_HEAPPROFILE=file writes a heap profile
// while the runner runs (-memprofile is written after it closed): read it
// with `go tool pprof -sample_index=inuse_space -top`.
func BenchmarkRunnerHeapOwningOnePercent(b *testing.B) {
	const members = 100
	n := sharding.MaxShards
	if os.Getenv("SHARDHOST_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 1 // every allocation: the runner's tables are a few each
	}
	srv := testenv.StartEtcd(b)
	cli := testenv.NewEtcdClient(b, srv.Endpoint())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	ns := 0
	var total, totalAfter float64
	runs := 0
	const ids0 = "r000" // the member that leaves
	for b.Loop() {
		b.StopTimer()
		ns++
		s, err := etcd.New(cli, fmt.Sprintf("onepercent-%d", ns), etcd.Config{})
		if err != nil {
			b.Fatal(err)
		}
		lease, err := s.Grant(ctx, 5*time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		ids := make([]sharding.Runner, 0, members)
		self := fmt.Sprintf("r%03d", members/2)
		for i := range members {
			id := fmt.Sprintf("r%03d", i)
			ids = append(ids, sharding.Runner{ID: id, Weight: 1})
			if id == self {
				continue
			}
			rec := storage.RunnerRecord{ID: id, Address: fmt.Sprintf("127.0.0.1:%d", 1+i), Weight: 1,
				Incarnation: fmt.Sprint("fake-", i), Started: time.Now(), LeaseTTL: 5 * time.Minute}
			if _, err := s.PutRunner(ctx, lease.ID, rec); err != nil {
				b.Fatal(err)
			}
		}
		// wants returns the shards the members assign to this runner.
		wants := func(members []sharding.Runner) []sharding.ShardID {
			a, err := sharding.Default().Assign(sharding.Input{NumShards: n, Runners: members})
			if err != nil {
				b.Fatal(err)
			}
			return a.ShardsOf(self)
		}
		want, wantAfter := wants(ids), wants(ids[1:])
		ids = nil
		before := liveHeap()
		// A transport, as the members' records have addresses (nobody
		// answers there: a shard assigned to one of them stays here).
		r, err := runner.New(s, runner.Config{ID: self, NumShards: n, Logger: quiet, ListenAddr: "127.0.0.1:0"})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		// owns waits until the runner owns the shards of want, then
		// returns the heap's growth since before.
		owns := func(want []sharding.ShardID) float64 {
			deadline := time.Now().Add(2 * time.Minute)
			for {
				owned, missing := r.Owned(), 0
				for _, id := range want {
					if _, ok := owned[id]; !ok {
						missing++
					}
				}
				if missing == 0 {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("the runner misses %d of its %d shards after 2 minutes", missing, len(want))
				}
				time.Sleep(100 * time.Millisecond)
			}
			time.Sleep(time.Second) // the watches catch up with the last acquisitions
			return float64(liveHeap()) - float64(before)
		}
		grown := owns(want)
		// A member leaves (its record is deleted): the runner plans the
		// change from the previous assignment and takes its new shards.
		if _, err := cli.Delete(ctx, fmt.Sprintf("/onepercent-%d/runners/%s", ns, ids0)); err != nil {
			b.Fatal(err)
		}
		grownAfter := owns(wantAfter)
		if path := os.Getenv("SHARDHOST_HEAPPROFILE"); path != "" {
			writeHeapProfile(b, path) // while the runner runs: what it keeps
		}
		r.Close()
		<-done
		if err := s.Revoke(ctx, lease.ID); err != nil {
			b.Fatal(err)
		}
		total += grown
		totalAfter += grownAfter
		runs++
		b.Logf("the runner owns %d of %d shards among %d members: heap +%.2f MB; %d after one left: +%.2f MB",
			len(want), n, members, grown/(1<<20), len(wantAfter), grownAfter/(1<<20))
		b.StartTimer()
	}
	b.ReportMetric(total/float64(runs), "B/runner")
	b.ReportMetric(totalAfter/float64(runs), "B/runner-after-a-leave")
}

// writeHeapProfile writes the heap profile of the live heap to path.
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// liveHeap returns the bytes of live heap objects after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
