package runner_test

import (
	"os"
	"regexp"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/shardhost/shardhost/internal/doctable"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// instrument is what the documentation says of one: its kind and unit.
type instrument struct{ kind, unit string }

// recordingMeter records every instrument created on it (and hands out
// no-op ones).
type recordingMeter struct {
	noop.Meter
	mu  sync.Mutex
	got map[string]instrument
}

func (m *recordingMeter) add(name, kind, unit string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.got[name] = instrument{kind, unit}
}

func (m *recordingMeter) Int64Counter(n string, o ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	m.add(n, "counter", metric.NewInt64CounterConfig(o...).Unit())
	return m.Meter.Int64Counter(n, o...)
}
func (m *recordingMeter) Float64Counter(n string, o ...metric.Float64CounterOption) (metric.Float64Counter, error) {
	m.add(n, "counter", metric.NewFloat64CounterConfig(o...).Unit())
	return m.Meter.Float64Counter(n, o...)
}
func (m *recordingMeter) Int64UpDownCounter(n string, o ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	m.add(n, "updown counter", metric.NewInt64UpDownCounterConfig(o...).Unit())
	return m.Meter.Int64UpDownCounter(n, o...)
}
func (m *recordingMeter) Float64UpDownCounter(n string, o ...metric.Float64UpDownCounterOption) (metric.Float64UpDownCounter, error) {
	m.add(n, "updown counter", metric.NewFloat64UpDownCounterConfig(o...).Unit())
	return m.Meter.Float64UpDownCounter(n, o...)
}
func (m *recordingMeter) Int64Histogram(n string, o ...metric.Int64HistogramOption) (metric.Int64Histogram, error) {
	m.add(n, "histogram", metric.NewInt64HistogramConfig(o...).Unit())
	return m.Meter.Int64Histogram(n, o...)
}
func (m *recordingMeter) Float64Histogram(n string, o ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	m.add(n, "histogram", metric.NewFloat64HistogramConfig(o...).Unit())
	return m.Meter.Float64Histogram(n, o...)
}
func (m *recordingMeter) Int64Gauge(n string, o ...metric.Int64GaugeOption) (metric.Int64Gauge, error) {
	m.add(n, "gauge", metric.NewInt64GaugeConfig(o...).Unit())
	return m.Meter.Int64Gauge(n, o...)
}
func (m *recordingMeter) Float64Gauge(n string, o ...metric.Float64GaugeOption) (metric.Float64Gauge, error) {
	m.add(n, "gauge", metric.NewFloat64GaugeConfig(o...).Unit())
	return m.Meter.Float64Gauge(n, o...)
}
func (m *recordingMeter) Int64ObservableCounter(n string, o ...metric.Int64ObservableCounterOption) (metric.Int64ObservableCounter, error) {
	m.add(n, "counter (observed)", metric.NewInt64ObservableCounterConfig(o...).Unit())
	return m.Meter.Int64ObservableCounter(n, o...)
}
func (m *recordingMeter) Float64ObservableCounter(n string, o ...metric.Float64ObservableCounterOption) (metric.Float64ObservableCounter, error) {
	m.add(n, "counter (observed)", metric.NewFloat64ObservableCounterConfig(o...).Unit())
	return m.Meter.Float64ObservableCounter(n, o...)
}
func (m *recordingMeter) Int64ObservableUpDownCounter(n string, o ...metric.Int64ObservableUpDownCounterOption) (metric.Int64ObservableUpDownCounter, error) {
	m.add(n, "updown counter (observed)", metric.NewInt64ObservableUpDownCounterConfig(o...).Unit())
	return m.Meter.Int64ObservableUpDownCounter(n, o...)
}
func (m *recordingMeter) Float64ObservableUpDownCounter(n string, o ...metric.Float64ObservableUpDownCounterOption) (metric.Float64ObservableUpDownCounter, error) {
	m.add(n, "updown counter (observed)", metric.NewFloat64ObservableUpDownCounterConfig(o...).Unit())
	return m.Meter.Float64ObservableUpDownCounter(n, o...)
}
func (m *recordingMeter) Int64ObservableGauge(n string, o ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	m.add(n, "gauge (observed)", metric.NewInt64ObservableGaugeConfig(o...).Unit())
	return m.Meter.Int64ObservableGauge(n, o...)
}
func (m *recordingMeter) Float64ObservableGauge(n string, o ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	m.add(n, "gauge (observed)", metric.NewFloat64ObservableGaugeConfig(o...).Unit())
	return m.Meter.Float64ObservableGauge(n, o...)
}

type recordingProvider struct {
	noop.MeterProvider
	m *recordingMeter
}

func (p recordingProvider) Meter(string, ...metric.MeterOption) metric.Meter { return p.m }

// docTable parses the rows of a documentation table: name -> kind, unit.
func docTable(t *testing.T, text string, row *regexp.Regexp) map[string]instrument {
	t.Helper()
	rows, err := doctable.Parse(text, row)
	if err != nil {
		t.Error(err)
	}
	out := make(map[string]instrument, len(rows))
	for name, in := range rows {
		out[name] = instrument{kind: in.Kind, unit: in.Unit}
	}
	return out
}

// TestMetricsDocumented: every instrument a runner creates has a unit and
// is in the table of docs/observability.md — the one place the
// instruments are documented — with its kind and unit; the table lists no
// instrument that does not exist.
func TestMetricsDocumented(t *testing.T) {
	rm := &recordingMeter{got: map[string]instrument{}}
	s := memory.New()
	defer s.Cluster().Close()
	if _, err := runner.New(s, runner.Config{ID: "a", MeterProvider: recordingProvider{m: rm}}); err != nil {
		t.Fatal(err)
	}
	if len(rm.got) < 20 {
		t.Fatalf("recorded %d instruments: %v", len(rm.got), rm.got)
	}
	for name, in := range rm.got {
		if in.unit == "" {
			t.Errorf("%s has no unit", name)
		}
	}
	const where = "docs/observability.md"
	doc := docTable(t, string(readDoc(t, where)), doctable.ObservabilityRow)
	for name, in := range rm.got {
		if d, ok := doc[name]; !ok {
			t.Errorf("%s: %s (%s, %s) is not documented", where, name, in.kind, in.unit)
		} else if d != in {
			t.Errorf("%s: %s documented as %s in %s, is a %s in %s", where, name, d.kind, d.unit, in.kind, in.unit)
		}
	}
	for name := range doc {
		if _, ok := rm.got[name]; !ok {
			t.Errorf("%s documents %s, which no runner creates", where, name)
		}
	}
}

// readDoc returns a documentation file, named from the module's root.
func readDoc(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("../" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
