package main

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// prometheusMetrics returns a MeterProvider for runner id whose
// instruments MetricsPath serves in Prometheus's text format, beside the
// Go runtime's and the process's metrics (examples/metrics shows the
// same in a few lines). OpenTelemetry's names are translated:
// docs/observability.md ("Prometheus") says how.
func prometheusMetrics(id string) (*sdkmetric.MeterProvider, metric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, nil, err
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	zero := zeroCounters{MeterProvider: mp, attrs: metric.WithAttributes(attribute.String("runner", id))}
	return mp, zero, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), nil
}

// zeroCounters starts every counter of its meters at 0, labelled with the
// runner's ID: the SDK exports an instrument only once it was measured, so
// without it a counter that never counted (handler panics, locks lost)
// would be missing, and the first increment of one would be invisible to
// rate() and increase(), which need a sample before it.
type zeroCounters struct {
	metric.MeterProvider
	attrs metric.AddOption
}

func (z zeroCounters) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return zeroMeter{Meter: z.MeterProvider.Meter(name, opts...), attrs: z.attrs}
}

type zeroMeter struct {
	metric.Meter
	attrs metric.AddOption
}

func (m zeroMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	c, err := m.Meter.Int64Counter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 0, m.attrs)
	}
	return c, err
}

func (m zeroMeter) Float64Counter(name string, opts ...metric.Float64CounterOption) (metric.Float64Counter, error) {
	c, err := m.Meter.Float64Counter(name, opts...)
	if err == nil {
		c.Add(context.Background(), 0, m.attrs)
	}
	return c, err
}
