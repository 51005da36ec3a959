package metrics_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

type Counter struct{ n int64 }

type IncReq struct{ By int64 }

func (c *Counter) Inc(_ context.Context, r IncReq) (int64, error) { c.n += r.By; return c.n, nil }

var (
	CounterKind = entity.NewKind("counter", func(string) *Counter { return &Counter{} })
	Inc         = entity.Method(CounterKind, "inc", (*Counter).Inc)
)

// A runner's metrics scraped by Prometheus: the exporter is the reader of
// the MeterProvider the runner gets in its Config, and serves /metrics
// through promhttp. (prometheus.DefaultRegisterer and http.Handle work the
// same way; a registry of its own keeps the example's output exact.)
func Example() {
	reg := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		panic(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())

	store := memory.New() // storage/etcd in production
	defer store.Cluster().Close()
	r, err := runner.New(store, runner.Config{
		ID: "runner-1", NumShards: 16, MeterProvider: mp,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	if err := r.Register(CounterKind); err != nil {
		panic(err)
	}
	go r.Run(context.Background())
	defer r.Shutdown(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := Inc.Ask(ctx, r, id, IncReq{By: 1}); err != nil {
			panic(err)
		}
	}
	for len(r.Owned()) < 16 { // the other shards are acquired in the same round, or the next
		time.Sleep(10 * time.Millisecond)
	}

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL) // what Prometheus scrapes
	if err != nil {
		panic(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range grep(string(body), "sharding_shards_owned", "sharding_entity_activations_total", "sharding_entities_active", "sharding_detached") {
		fmt.Println(line)
	}
	// Output:
	// sharding_detached{runner="runner-1"} 0
	// sharding_entities_active{runner="runner-1"} 3
	// sharding_entity_activations_total{runner="runner-1"} 3
	// sharding_shards_owned{runner="runner-1"} 16
}
