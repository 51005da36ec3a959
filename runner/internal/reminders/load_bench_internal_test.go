package reminders

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// BenchmarkLoadShardsAtOnce: a runner acquiring 16 384 shards at once (a
// cold start) loads their reminder sets from the in-memory store, loadBatch
// shards per read: the set loop's work per round is proportional to the
// sets it calls for, not to the sets queued (a queue scanned whole each
// round took 8.9 s here).
func BenchmarkLoadShardsAtOnce(b *testing.B) {
	const n = 16384
	c := memory.NewCluster()
	defer c.Close()
	st := c.NewStore("a")
	met, err := NewMetrics(noop.NewMeterProvider().Meter("bench"), metric.WithAttributes())
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s := New(Config{}, st, nil, schedule.New(schedule.Config{}), met, slog.New(slog.NewTextHandler(io.Discard, nil)))
		ctx, cancel := context.WithCancel(context.Background())
		for i := range n {
			s.Acquired(sharding.ShardID(i), storage.Epoch(1), ctx)
		}
		done := make(chan struct{})
		go func() { s.Run(ctx); close(done) }()
		for {
			if loaded, _ := s.Sets(); loaded == n {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		<-done
	}
}
