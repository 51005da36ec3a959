package reminders

import (
	"io"
	"log/slog"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/shardhost/shardhost/runner/internal/schedule"
	"github.com/shardhost/shardhost/storage"
)

// newTestService returns a service on st (not run) with no host, no-op
// metrics and a discarded log.
func newTestService(tb testing.TB, st storage.ShardStates) *Service {
	tb.Helper()
	met, err := NewMetrics(noop.NewMeterProvider().Meter("test"), metric.WithAttributes())
	if err != nil {
		tb.Fatal(err)
	}
	return New(Config{}, st, nil, schedule.New(schedule.Config{}), met, slog.New(slog.NewTextHandler(io.Discard, nil)))
}
