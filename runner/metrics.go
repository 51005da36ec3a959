package runner

import (
	"context"
	"errors"
	"time"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/reminders"
	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/storage"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// meterName is the instrumentation scope of every shardhost instrument.
const meterName = "github.com/shardhost/shardhost"

// metrics holds the instruments of one runner, created once in New. All
// carry the attribute runner=<ID>; none carries entity IDs. Every
// instrument is listed, with its kind, unit, attributes and meaning, in the
// table of docs/observability.md: TestMetricsDocumented
// keeps the two in step.
type metrics struct {
	attrs metric.MeasurementOption
	host  hosting.Metrics   // the entity host's instruments (internal/hosting)
	route routing.Metrics   // the router's (internal/routing)
	rem   reminders.Metrics // the reminder service's (internal/reminders)

	detached          metric.Int64Gauge
	keepAliveFailures metric.Int64Counter
	keepAliveStreak   metric.Int64Gauge
	acquireRetries    metric.Int64Counter
	acquireExhausted  metric.Int64Counter
	shardsOwned       metric.Int64Gauge
	ownedRecorded     int64 // the gauge's last value, -1 before the first (guarded by Runner.mu)
	shardsLost        metric.Int64Counter
	acquireLatency    metric.Float64Histogram
	storageErrors     metric.Int64Counter
	detaches          metric.Int64Counter
	deadlineLagCB     metric.Registration

	handoffPhase metric.Float64Histogram
	handoffs     metric.Int64Counter

	remindersUnrecorded metric.Int64Counter // counted from the events (ownershiplog.go)
}

// gaugeReadings are what the observed gauges report.
type gaugeReadings struct {
	entities          int
	reminders, timers int64
	remembered        map[string]int64 // by kind
}

func newMetrics(mp metric.MeterProvider, runnerID string, lag func() (time.Duration, bool), gauges func() gaugeReadings) (*metrics, error) {
	m := mp.Meter(meterName)
	out := &metrics{attrs: metric.WithAttributes(attribute.String("runner", runnerID)), ownedRecorded: -1}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	out.detached, err = m.Int64Gauge("sharding.detached", metric.WithUnit("{runner}"), metric.WithDescription("1 while the runner is detached, else 0"))
	add(err)
	out.keepAliveFailures, err = m.Int64Counter("sharding.lease_keepalive_failures", metric.WithUnit("{renewal}"), metric.WithDescription("failed lease renewals"))
	add(err)
	out.keepAliveStreak, err = m.Int64Gauge("sharding.lease_keepalive_failure_streak", metric.WithUnit("{renewal}"), metric.WithDescription("consecutive failed lease renewals"))
	add(err)
	out.acquireRetries, err = m.Int64Counter("sharding.acquire_retry_attempts", metric.WithUnit("{attempt}"), metric.WithDescription("acquire attempts on shards held elsewhere, after the first"))
	add(err)
	out.acquireExhausted, err = m.Int64Counter("sharding.acquire_retry_window_exhausted", metric.WithUnit("{shard}"), metric.WithDescription("shards whose acquire retry window ran out"))
	add(err)
	out.shardsOwned, err = m.Int64Gauge("sharding.shards_owned", metric.WithUnit("{shard}"), metric.WithDescription("shards owned by the runner"))
	add(err)
	out.shardsLost, err = m.Int64Counter("sharding.locks_lost", metric.WithUnit("{shard}"), metric.WithDescription("owned locks deleted, rewritten or taken behind the runner's back (each costs its shard only)"))
	add(err)
	out.acquireLatency, err = m.Float64Histogram("sharding.acquire_latency", metric.WithUnit("s"), metric.WithDescription("duration of one batched acquire call"))
	add(err)
	out.storageErrors, err = m.Int64Counter("sharding.storage_errors", metric.WithUnit("{call}"), metric.WithDescription("failed list/acquire/verify/release/watch calls, refused starts, refused probes and re-attaches while detached"))
	add(err)
	out.detaches, err = m.Int64Counter("sharding.detaches", metric.WithUnit("{detach}"), metric.WithDescription("detach transitions, by reason"))
	add(err)
	out.handoffPhase, err = m.Float64Histogram("sharding.handoff_duration", metric.WithUnit("s"),
		metric.WithDescription("handoff duration by phase: warm (new owner), drain and cutover (old owner), total (new owner)"))
	add(err)
	out.handoffs, err = m.Int64Counter("sharding.handoffs", metric.WithUnit("{handoff}"), metric.WithDescription("handoffs by outcome: completed, aborted"))
	add(err)
	out.remindersUnrecorded, err = m.Int64Counter("sharding.reminders_unrecorded", metric.WithUnit("{shard}"),
		metric.WithDescription("shards released plainly without their reminders' progress recorded: the next owner fires them at least once"))
	add(err)
	host, err := hosting.NewMetrics(m, out.attrs)
	add(err)
	route, err := routing.NewMetrics(m, out.attrs, host.Dropped)
	add(err)
	rem, err := reminders.NewMetrics(m, out.attrs)
	add(err)
	out.host, out.route, out.rem = *host, *route, *rem
	lagGauge, err := m.Float64ObservableGauge("sharding.lease_deadline_lag", metric.WithUnit("s"),
		metric.WithDescription("lease deadline minus now; the runner detaches when it falls to the detach margin"))
	add(err)
	activeGauge, err2 := m.Int64ObservableGauge("sharding.entities_active", metric.WithUnit("{entity}"), metric.WithDescription("resident entities"))
	add(err2)
	remGauge, err3 := m.Int64ObservableGauge("sharding.reminders", metric.WithUnit("{reminder}"), metric.WithDescription("reminders loaded for the owned shards"))
	add(err3)
	timerGauge, err4 := m.Int64ObservableGauge("sharding.timers", metric.WithUnit("{timer}"), metric.WithDescription("running entity timers"))
	add(err4)
	rememberedGauge, err5 := m.Int64ObservableGauge("sharding.remembered", metric.WithUnit("{entity}"), metric.WithDescription("remembered entities of the owned shards, by kind"))
	add(err5)
	if errors.Join(err, err2, err3, err4, err5) == nil {
		out.deadlineLagCB, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			if d, ok := lag(); ok {
				o.ObserveFloat64(lagGauge, d.Seconds(), out.attrs)
			}
			g := gauges()
			o.ObserveInt64(activeGauge, int64(g.entities), out.attrs)
			o.ObserveInt64(remGauge, g.reminders, out.attrs)
			o.ObserveInt64(timerGauge, g.timers, out.attrs)
			for kind, n := range g.remembered {
				o.ObserveInt64(rememberedGauge, n, out.attrs, metric.WithAttributes(attribute.String("kind", kind)))
			}
			return nil
		}, lagGauge, activeGauge, remGauge, timerGauge, rememberedGauge)
		add(err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func (m *metrics) close() {
	if m.deadlineLagCB != nil {
		_ = m.deadlineLagCB.Unregister()
	}
}

func withReason(reason string) metric.MeasurementOption { return hosting.WithReason(reason) }

// withErrorType classifies a failed store call for sharding.storage_errors:
// permission_denied (the store refused the runner's credentials or
// permissions: an operator must act), unavailable, or other.
func withErrorType(err error) metric.MeasurementOption {
	t := "other"
	switch {
	case errors.Is(err, storage.ErrPermissionDenied):
		t = "permission_denied"
	case errors.Is(err, storage.ErrUnavailable):
		t = "unavailable"
	}
	return metric.WithAttributes(attribute.String("error.type", t))
}

func withPhase(phase string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("phase", phase))
}
