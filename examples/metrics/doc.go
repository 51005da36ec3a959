// Package metrics shows how to export a runner's metrics to Prometheus
// (see Example): an OpenTelemetry MeterProvider whose reader is the
// Prometheus exporter (go.opentelemetry.io/otel/exporters/prometheus),
// passed to runner.Config.MeterProvider. The library itself depends only
// on the OpenTelemetry metric API; the exporter is the program's choice.
// The instruments are listed in docs/observability.md.
package metrics
