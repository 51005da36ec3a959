package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shardhost/shardhost/runner"
)

// int64Points collects the data points of the int64 counter or gauge name.
func int64Points(t *testing.T, rd *sdkmetric.ManualReader, name string) []metricdata.DataPoint[int64] {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []metricdata.DataPoint[int64]
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				out = append(out, d.DataPoints...)
			case metricdata.Gauge[int64]:
				out = append(out, d.DataPoints...)
			}
		}
	}
	return out
}

// rememberedByKind reads the sharding.remembered gauge: kind -> value.
func rememberedByKind(t *testing.T, rd *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, p := range int64Points(t, rd, "sharding.remembered") {
		kind, _ := p.Attributes.Value("kind")
		out[kind.AsString()] += p.Value
	}
	return out
}

// TestRememberedKindGrowthIsVisible: on a real etcd, sharding.remembered
// reports a runner's remembered entities per kind (an ordinary kind 0),
// Forget lowers it, and a kind past Config.RememberedWarnAt is
// logged at WARN — when it passes the count and again when it doubles.
// The markers outlive the runner: a new runner of the cluster reports
// them, and warns, without any message.
func TestRememberedKindGrowthIsVisible(t *testing.T) {
	t.Parallel()
	c := startEtcdCluster(t)
	env := newTwinEnv()
	const warnAt, n = 5, 13
	startRunner := func(id string) (*etcdRunner, *sdkmetric.ManualReader, *logCapture) {
		rd := sdkmetric.NewManualReader()
		lc := &logCapture{}
		r := c.startWith(runner.Config{ID: id, NumShards: 8, RememberedWarnAt: warnAt,
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd)), Logger: lc.logger(t)},
			func(r *runner.Runner) error { return r.Register(env.twin, env.plain) })
		return r, rd, lc
	}
	checkWarns := func(who string, lc *logCapture, at ...int) {
		t.Helper()
		warns := lc.find(slog.LevelWarn, "remembered entities of a kind keep growing", "kind", "twin")
		ok := len(warns) == len(at)
		for i := 0; ok && i < len(at); i++ {
			ok = warns[i].Attrs["remembered"] == fmt.Sprint(at[i]) && warns[i].Attrs["warn_at"] == fmt.Sprint(warnAt)
		}
		if !ok {
			t.Errorf("%s: WARN lines %v; want one for kind twin at each of %v remembered entities", who, warns, at)
		}
		if other := lc.find(slog.LevelWarn, "remembered entities of a kind keep growing", "kind", "plain"); len(other) != 0 {
			t.Errorf("%s: WARN lines for the ordinary kind: %v", who, other)
		}
	}

	a, rdA, lcA := startRunner("a")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for i := range n {
		if _, err := env.ping.Ask(ctx, a, fmt.Sprint("t", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.pingP.Ask(ctx, a, "p0", ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, fmt.Sprintf("sharding.remembered{kind=twin} = %d on a", n), func() bool { return rememberedByKind(t, rdA)["twin"] == n })
	if got := rememberedByKind(t, rdA); len(got) != 2 || got[env.plain.Name()] != 0 {
		t.Errorf("sharding.remembered on a = %v, want kind twin and the ordinary kind at 0", got)
	}
	checkWarns("a", lcA, warnAt+1, 2*(warnAt+1)+1) // past 5, then past twice 6
	if _, err := env.drop.Ask(ctx, a, "t0", ""); err != nil {
		t.Fatal(err)
	}
	if got := rememberedByKind(t, rdA)["twin"]; got != n-1 {
		t.Errorf("sharding.remembered{kind=twin} after a Forget = %d, want %d", got, n-1)
	}
	a.shutdown(t)

	b, rdB, lcB := startRunner("b")
	waitFor(t, 30*time.Second, fmt.Sprintf("sharding.remembered{kind=twin} = %d on b, with no message", n-1), func() bool {
		return rememberedByKind(t, rdB)["twin"] == n-1 && b.Status().Remembered == n-1
	})
	checkWarns("b", lcB, warnAt+1)
}
