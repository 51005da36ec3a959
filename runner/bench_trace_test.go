package runner_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// discardExporter exports spans nowhere (the cost measured is the
// runner's and the SDK's, not an exporter's).
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// sampledConfig returns cfg traced by the SDK with a batch processor, a
// discarding exporter, and a parent-based sampler keeping ratio of the
// new traces.
func sampledConfig(b *testing.B, cfg runner.Config, ratio float64) runner.Config {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg.TracerProvider = tp
	cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return cfg
}

// BenchmarkAskTraced: BenchmarkAsk with 1 caller, traced by the SDK
// sampling 1 % and 100 % of the asks (compare with BenchmarkAsk, where
// tracing is off).
func BenchmarkAskTraced(b *testing.B) {
	for _, ratio := range []float64{0.01, 1} {
		b.Run(fmt.Sprintf("sampled=%g%%", ratio*100), func(b *testing.B) {
			c := memory.NewCluster()
			b.Cleanup(c.Close)
			cfg := sampledConfig(b, runner.Config{ID: "bench", NumShards: 64, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, ratio)
			r, err := runner.New(c.NewStore("bench"), cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Register(benchKind); err != nil {
				b.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- r.Run(context.Background()) }()
			b.Cleanup(func() { r.Close(); <-done })
			for deadline := time.Now().Add(10 * time.Second); len(r.Owned()) != 64; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					b.Fatal("runner did not own its shards")
				}
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := benchInc.Ask(ctx, r, "e0", incReq{By: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "asks/s")
		})
	}
}

// BenchmarkRemoteAskTraced: BenchmarkRemoteAsk with 1 caller, both
// runners traced by the SDK sampling 1 % and 100 % of the asks.
func BenchmarkRemoteAskTraced(b *testing.B) {
	for _, ratio := range []float64{0.01, 1} {
		b.Run(fmt.Sprintf("sampled=%g%%", ratio*100), func(b *testing.B) {
			c := memory.NewCluster()
			b.Cleanup(c.Close)
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			owner, err := runner.New(c.NewStore("owner"), sampledConfig(b, runner.Config{ID: "owner", NumShards: 64, ListenAddr: "127.0.0.1:0", Logger: quiet}, ratio))
			if err != nil {
				b.Fatal(err)
			}
			client, err := runner.New(c.NewStore("client"), sampledConfig(b, runner.Config{ID: "client", NumShards: 64, ClientOnly: true, Logger: quiet}, ratio))
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range []*runner.Runner{owner, client} {
				if err := r.Register(benchKind); err != nil {
					b.Fatal(err)
				}
				done := make(chan struct{})
				go func() { defer close(done); _ = r.Run(context.Background()) }()
				b.Cleanup(func() { r.Close(); <-done })
			}
			ctx := context.Background()
			for deadline := time.Now().Add(10 * time.Second); ; {
				cctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := benchInc.Ask(cctx, client, "warm", incReq{})
				cancel()
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := benchInc.Ask(ctx, client, "e0", incReq{By: 1}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "asks/s")
		})
	}
}
