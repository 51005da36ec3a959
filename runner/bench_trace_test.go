package runner_test

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/shardhost/shardhost/runner"
)

// discardExporter exports spans nowhere (the cost measured is the
// runner's and the SDK's, not an exporter's).
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// sampled returns a Config adjustment tracing by the SDK with a batch
// processor, a discarding exporter, and a parent-based sampler keeping
// ratio of the new traces.
func sampled(b *testing.B, ratio float64) func(runner.Config) runner.Config {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return func(cfg runner.Config) runner.Config {
		cfg.TracerProvider = tp
		cfg.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
		return cfg
	}
}

// BenchmarkAskTraced: BenchmarkAsk with 1 caller, traced by the SDK
// sampling 1 % and 100 % of the asks (compare with BenchmarkAsk, where
// tracing is off).
func BenchmarkAskTraced(b *testing.B) {
	for _, ratio := range []float64{0.01, 1} {
		b.Run(fmt.Sprintf("sampled=%g%%", ratio*100), func(b *testing.B) {
			r := benchRunnerWith(b, sampled(b, ratio))
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
			client := remotePair(b, sampled(b, ratio))
			ctx := context.Background()
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
