package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

// BenchmarkSingleRunnerOwnsAll: one runner (default config: lease TTL 15 s,
// op timeout 3 s) starts on an empty namespace of a real etcd and must own
// all NumShards shards without detaching; time from Run to the last
// ShardAcquired. The largest count it does promptly bounds
// sharding.MaxShards. SHARDHOST_MAXSHARDS_SIZES (comma separated) replaces
// the sizes (counts above MaxShards need MaxShards raised first).
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
