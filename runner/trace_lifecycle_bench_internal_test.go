package runner

import (
	"context"
	"io"
	"log/slog"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// nopExporter exports spans nowhere (the cost measured is the runner's
// and the SDK's batching, not an exporter's).
type nopExporter struct{}

func (nopExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (nopExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkReleaseSpans: what the old owner's side of a planned move
// spends on its spans per shard (start, the four phase events, the end
// with the outcome), for a batch of 64 shards: off (a no-op provider),
// and with the SDK (batch processor, discarding exporter) sampling 1 %
// and 100 % of the new traces.
func BenchmarkReleaseSpans(b *testing.B) {
	const batch = 64
	for _, tc := range []struct {
		name string
		tp   func() trace.TracerProvider
	}{
		{"off", func() trace.TracerProvider { return noop.NewTracerProvider() }},
		{"sampled=1%", func() trace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithBatcher(nopExporter{}), sdktrace.WithSampler(sdktrace.TraceIDRatioBased(0.01)))
		}},
		{"sampled=100%", func() trace.TracerProvider {
			return sdktrace.NewTracerProvider(sdktrace.WithBatcher(nopExporter{}), sdktrace.WithSampler(sdktrace.AlwaysSample()))
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tp := tc.tp()
			if sdk, ok := tp.(*sdktrace.TracerProvider); ok {
				b.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
			}
			c := memory.NewCluster()
			b.Cleanup(c.Close)
			r, err := New(c.NewStore("a"), Config{ID: "a", NumShards: batch, TracerProvider: tp, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			items := make([]cutoverItem, batch)
			for i := range items {
				items[i] = cutoverItem{s: &shard{id: sharding.ShardID(i), epoch: storage.Epoch(100 + i)}, h: storage.Handoff{HandoffRecord: storage.HandoffRecord{To: "b"}}}
			}
			b.ReportAllocs()
			for b.Loop() {
				for i := range items {
					items[i].m = handoff.NewMachine(handoff.OldOwner)
				}
				r.life.startOutbound(items)
				for _, ev := range []string{"drained", "release_shard", "progress_recorded"} {
					outboundEvent(items, ev)
				}
				for i := range items {
					endLife(items[i].span, outcomeCutover, "", "")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/shard")
		})
	}
}
