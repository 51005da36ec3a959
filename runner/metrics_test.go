package runner_test

import (
	"context"
	"maps"
	"testing"
	"testing/synctest"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// readMetrics collects every data point into name -> summed value.
func readMetrics(t *testing.T, rd *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "github.com/shardhost/shardhost" {
			t.Errorf("instrument scope %q, want the module path", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] += float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[m.Name] += float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[m.Name] += p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name+".count"] += float64(p.Count)
				}
			}
		}
	}
	return out
}

func TestAcquireRetryMetricsAndWindow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		window  time.Duration
		retries float64
	}{
		{"window-2s", 2 * time.Second, 10}, // attempts at 0, 0.2, ..., 2.0s: 10 after the first
		{"single-attempt", runner.SingleAttempt, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := memory.NewCluster()
				t.Cleanup(c.Close)
				// Another lease holds shard 3 for good.
				l, err := c.NewStore("squatter").Grant(t.Context(), time.Hour)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.Put("shards/3", []byte(`{"runnerID":"squatter"}`), l.ID); err != nil {
					t.Fatal(err)
				}
				rd := sdkmetric.NewManualReader()
				mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
				r := start(t, c, nil, runner.Config{ID: "a", NumShards: 8, AcquireRetryWindow: tc.window, MeterProvider: mp})
				waitFor(t, time.Second, "owning the 7 free shards", func() bool { return len(r.Owned()) == 7 })
				time.Sleep(10 * time.Second)
				m := readMetrics(t, rd)
				if got := m["sharding.acquire_retry_attempts"]; got != tc.retries {
					t.Errorf("acquire_retry_attempts = %v, want %v", got, tc.retries)
				}
				if got := m["sharding.acquire_retry_window_exhausted"]; got != 1 {
					t.Errorf("acquire_retry_window_exhausted = %v, want 1", got)
				}
				if got := m["sharding.shards_owned"]; got != 7 {
					t.Errorf("shards_owned = %v, want 7", got)
				}
				if m["sharding.acquire_latency.count"] < 1 {
					t.Error("no acquire_latency recorded")
				}
				// The window is exhausted: no more attempts until a DELETE.
				calls := r.store.Calls(memory.OpAcquire)
				time.Sleep(10 * time.Second)
				if got := r.store.Calls(memory.OpAcquire); got != calls {
					t.Errorf("%d acquire calls after the window was exhausted", got-calls)
				}
				c.Delete("shards/3")
				synctest.Wait()
				if _, ok := r.Owned()[3]; !ok {
					t.Error("shard 3 not acquired at once after its lock was deleted (watch wake-up)")
				}
			})
		})
	}
}

func TestDetachmentMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		rd := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))
		rec := newRecorder(t)
		r := start(t, c, rec, runner.Config{ID: "a", NumShards: 8, MeterProvider: mp})
		waitFor(t, time.Second, "owning all", func() bool { return len(r.Owned()) == 8 })
		m := readMetrics(t, rd)
		if m["sharding.detached"] != 0 || m["sharding.shards_owned"] != 8 {
			t.Fatalf("attached metrics: %v", m)
		}
		if lag := m["sharding.lease_deadline_lag"]; lag <= 0 || lag > 15 {
			t.Errorf("lease_deadline_lag = %v, want in (0, 15]s", lag)
		}
		time.Sleep(5500 * time.Millisecond)
		r.store.FailKeepAlive(true)
		time.Sleep(5 * time.Second) // renewal at 10s fails, then 250ms retries until 10.5s
		synctest.Wait()
		m = readMetrics(t, rd)
		if m["sharding.lease_keepalive_failures"] < 2 || m["sharding.lease_keepalive_failure_streak"] < 2 {
			t.Errorf("keep-alive failure metrics: failures %v, streak %v", m["sharding.lease_keepalive_failures"], m["sharding.lease_keepalive_failure_streak"])
		}
		waitDetached(t, rec, 10*time.Second)
		m = readMetrics(t, rd)
		if m["sharding.detached"] != 1 || m["sharding.shards_owned"] != 0 || m["sharding.detaches"] != 1 {
			t.Errorf("detached metrics: detached %v, owned %v, detaches %v", m["sharding.detached"], m["sharding.shards_owned"], m["sharding.detaches"])
		}
		r.store.FailKeepAlive(false)
		waitFor(t, 10*time.Second, "re-attach", func() bool { return !r.Status().Detached })
		synctest.Wait()
		m = readMetrics(t, rd)
		if m["sharding.detached"] != 0 || m["sharding.lease_keepalive_failure_streak"] != 0 {
			t.Errorf("after re-attach: detached %v, streak %v", m["sharding.detached"], m["sharding.lease_keepalive_failure_streak"])
		}
	})
}

// TestRemindersUnrecordedCounted: a plain release whose reminders'
// progress cannot be written publishes RemindersUnrecorded and counts it in
// sharding.reminders_unrecorded, one per shard.
func TestRemindersUnrecordedCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rd := sdkmetric.NewManualReader()
		_, r, rec := startOwningAll(t, runner.Config{ID: "a", NumShards: 4,
			MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(rd))}, env.kind)
		for _, id := range []string{"x", "y"} {
			if _, err := env.arm.Ask(t.Context(), r, id, armReq{Name: "every", Period: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		r.store.Fail(memory.OpShardState, storage.ErrUnavailable)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := r.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the events reach the recorder through a subscription
		shards := map[sharding.ShardID]bool{}
		for _, ev := range rec.all() {
			if e, ok := ev.(runner.RemindersUnrecorded); ok {
				shards[e.Shard] = true
			}
		}
		want := map[sharding.ShardID]bool{sharding.ShardOf("x", 4): true, sharding.ShardOf("y", 4): true}
		if !maps.Equal(shards, want) {
			t.Errorf("RemindersUnrecorded for shards %v, want %v (those of x and y)", shards, want)
		}
		if got := readMetrics(t, rd)["sharding.reminders_unrecorded"]; got != float64(len(want)) {
			t.Errorf("sharding.reminders_unrecorded = %v, want %d", got, len(want))
		}
	})
}
