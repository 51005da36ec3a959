package runner_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/entity/protocodec"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

type benchCounter struct{ n int64 }

type incReq struct{ By int64 }

func (c *benchCounter) Inc(_ context.Context, r incReq) (int64, error) { c.n += r.By; return c.n, nil }
func (c *benchCounter) Add(_ context.Context, r incReq) error          { c.n += r.By; return nil }

func (c *benchCounter) IncProto(_ context.Context, r *wrapperspb.Int64Value) (*wrapperspb.Int64Value, error) {
	c.n += r.GetValue()
	return wrapperspb.Int64(c.n), nil
}

var (
	benchKind = entity.NewKind("bench-counter", func(string) *benchCounter { return &benchCounter{} },
		entity.Mailbox(1<<16), entity.IdleAfter(time.Hour))
	benchInc = entity.Method(benchKind, "inc", (*benchCounter).Inc)
	benchAdd = entity.Signal(benchKind, "add", (*benchCounter).Add)
	// The same counter with the protocol buffer codec.
	benchProtoKind = entity.NewKind("bench-counter-proto", func(string) *benchCounter { return &benchCounter{} },
		entity.Mailbox(1<<16), entity.IdleAfter(time.Hour), entity.WithCodec(protocodec.Codec))
	benchProtoInc = entity.Method(benchProtoKind, "inc", (*benchCounter).IncProto)
)

// benchRunner returns a runner on the memory store that owns all shards.
func benchRunner(b *testing.B) *runner.Runner { return benchRunnerWith(b, nil) }

// benchRunnerWith is benchRunner with its Config changed by adjust (nil:
// as it is).
func benchRunnerWith(b *testing.B, adjust func(runner.Config) runner.Config) *runner.Runner {
	b.Helper()
	c := memory.NewCluster()
	cfg := runner.Config{ID: "bench", NumShards: 64, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if adjust != nil {
		cfg = adjust(cfg)
	}
	r, err := runner.New(c.NewStore("bench"), cfg)
	if err != nil {
		b.Fatal(err)
	}
	if err := r.Register(benchKind); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	b.Cleanup(func() {
		r.Close()
		<-done
		c.Close()
	})
	deadline := time.Now().Add(10 * time.Second)
	for len(r.Owned()) != 64 {
		if time.Now().After(deadline) {
			b.Fatal("runner did not own its shards")
		}
		time.Sleep(time.Millisecond)
	}
	return r
}

// remotePair starts an owner serving gRPC on loopback and a client-only
// runner on one memory store, their Configs changed by adjust (nil: as
// they are), and returns the client once it routes to the owner.
func remotePair(b *testing.B, adjust func(runner.Config) runner.Config) *runner.Runner {
	b.Helper()
	c := memory.NewCluster()
	b.Cleanup(c.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var rs []*runner.Runner
	for _, cfg := range []runner.Config{
		{ID: "owner", NumShards: 64, ListenAddr: "127.0.0.1:0", Logger: quiet},
		{ID: "client", NumShards: 64, ClientOnly: true, Logger: quiet},
	} {
		if adjust != nil {
			cfg = adjust(cfg)
		}
		r, err := runner.New(c.NewStore(cfg.ID), cfg)
		if err != nil {
			b.Fatal(err)
		}
		rs = append(rs, r)
	}
	for _, r := range rs {
		if err := r.Register(benchKind, benchProtoKind); err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(context.Background()) }()
		b.Cleanup(func() { r.Close(); <-done })
	}
	client := rs[1]
	deadline := time.Now().Add(10 * time.Second)
	for { // until the client routes to the owner
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := benchInc.Ask(cctx, client, "warm", incReq{})
		cancel()
		if err == nil {
			return client
		}
		if time.Now().After(deadline) {
			b.Fatal(err)
		}
	}
}

// BenchmarkTell: fire-and-forget to one entity; the clock stops when the
// entity has processed every message.
func BenchmarkTell(b *testing.B) {
	r := benchRunner(b)
	ctx := context.Background()
	if _, err := benchInc.Ask(ctx, r, "hot", incReq{}); err != nil { // activate
		b.Fatal(err)
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		for benchAdd.Tell(ctx, r, "hot", incReq{By: 1}) != nil {
			runtime.Gosched() // mailbox full: let the entity catch up
		}
		n++
	}
	got, err := benchInc.Ask(ctx, r, "hot", incReq{})
	if err != nil || got != int64(n) {
		b.Fatalf("entity saw %d of %d messages (%v)", got, n, err)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkAsk: request/response, each caller to its own entity.
func BenchmarkAsk(b *testing.B) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			r := benchRunner(b)
			ctx := context.Background()
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
			// The runner's start is not an ask: RunParallel, unlike b.Loop,
			// keeps the time spent before it (a runner that owns nothing
			// waits 5 debounces of a quiet view, 500 ms, before it takes
			// shards: the storm gate).
			b.ResetTimer()
			if callers == 1 {
				for b.Loop() {
					if _, err := benchInc.Ask(ctx, r, "e0", incReq{By: 1}); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					id := fmt.Sprintf("e%d", next.Add(1))
					for pb.Next() {
						if _, err := benchInc.Ask(ctx, r, id, incReq{By: 1}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "asks/s")
		})
	}
}

// BenchmarkActivate: tells to distinct new entities; reports the heap each
// resident idle entity costs.
func BenchmarkActivate(b *testing.B) {
	r := benchRunner(b)
	ctx := context.Background()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := benchAdd.Tell(ctx, r, fmt.Sprintf("entity-%d", i), incReq{By: 1}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.StopTimer()
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "activations/s")
	for r.Status().Entities != i {
		time.Sleep(time.Millisecond)
	}
	// Let every entity goroutine finish, then measure the resident heap.
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(i), "heap-B/entity")
	b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
}

// BenchmarkRemoteAsk: a client-only runner asks entities owned by another
// runner over loopback TCP (gRPC); reports the median latency. The
// request and response go through the kind's JSON codec.
func BenchmarkRemoteAsk(b *testing.B) {
	benchRemoteAsk(b, func(ctx context.Context, client *runner.Runner, id string) error {
		_, err := benchInc.Ask(ctx, client, id, incReq{By: 1})
		return err
	})
}

// BenchmarkRemoteAskProto is BenchmarkRemoteAsk with the protocol buffer
// codec (entity/protocodec): an int64 wrapper each way.
func BenchmarkRemoteAskProto(b *testing.B) {
	req := wrapperspb.Int64(1) // read-only: shared by the callers
	benchRemoteAsk(b, func(ctx context.Context, client *runner.Runner, id string) error {
		_, err := benchProtoInc.Ask(ctx, client, id, req)
		return err
	})
}

func benchRemoteAsk(b *testing.B, ask func(ctx context.Context, client *runner.Runner, id string) error) {
	for _, callers := range []int{1, 64} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			client := remotePair(b, nil)
			ctx := context.Background()
			var mu sync.Mutex
			var lat []time.Duration
			var next atomic.Int64
			// drive is one caller: it asks its own entity while more() and
			// records the latencies.
			drive := func(more func() bool) {
				id := fmt.Sprintf("e%d", next.Add(1))
				local := make([]time.Duration, 0, 1024)
				for more() {
					t0 := time.Now()
					if err := ask(ctx, client, id); err != nil {
						b.Error(err)
						break
					}
					local = append(local, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
			}
			b.ResetTimer()
			if callers == 1 { // RunParallel would start GOMAXPROCS callers
				i := 0
				drive(func() bool { i++; return i <= b.N })
			} else {
				b.SetParallelism(max(1, callers/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) { drive(pb.Next) })
			}
			b.StopTimer()
			slices.Sort(lat)
			if len(lat) > 0 {
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "asks/s")
		})
	}
}
